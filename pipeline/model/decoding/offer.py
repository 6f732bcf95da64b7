"""When a draft is offered: a tuned model's confidence thresholds, chosen on dev by the review.

A blind review by a support lead's rubric passes few of a small model's drafts, and a draft an
agent cannot trust costs more than no draft: the agent must read the chat anyway, then also
catch the draft's mistake. So each summary and reply carries the model's confidence in it
(`one_pass.token_confidence`: the geometric mean probability of its tokens; for a draft that is a
library macro, the picker's confidence in its pick, `macros.Choice`), and below the
policy's thresholds the reply is withheld ("no draft: the model was unsure") and the summary
flagged. The thresholds live in the adapter's manifest (`offer_policy`), chosen on dev by
`data/tools/review.py offer` from the review's verdicts; without one everything is offered.

The review also showed where no draft passes whatever the confidence: once an agent has answered
in the chat, a draft must build on what the agent said and did, which neither the model's words
nor a library macro do (dev: 0 of 90 verdicts in any style but gold). `after_agent: false`
withholds those drafts ("no draft: an agent has already answered"), without decoding them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from chatlens.contracts import ChatWindow

DRAFT_WITHHELD = "draft_withheld"  # the flag of a chat whose reply draft was below the policy's threshold
SUMMARY_UNSURE = "summary_unsure"  # the flag of a summary below the policy's threshold
AGENT_ANSWERED = "agent_answered"  # the flag of a chat given no draft because an agent has answered in it
WITHHELD = frozenset({DRAFT_WITHHELD, AGENT_ANSWERED})  # the flags of a draft this policy chose not to offer


@dataclass(frozen=True)
class OfferPolicy:
    """The least confidence at which a reply is offered and a summary shown unflagged (0: always),
    and whether a draft is offered once an agent has answered in the chat."""

    reply_min_confidence: float = 0.0
    summary_min_confidence: float = 0.0
    after_agent: bool = True

    def drafts_for(self, window: ChatWindow) -> bool:
        """Whether this chat gets a draft at all: not once an agent has answered, unless `after_agent`."""
        return self.after_agent or not any(message.sender == "agent" for message in window.messages)

    def offers_reply(self, confidence: float | None) -> bool:
        return confidence is None or confidence >= self.reply_min_confidence

    def trusts_summary(self, confidence: float | None) -> bool:
        return confidence is None or confidence >= self.summary_min_confidence

    def to_json(self) -> dict:
        return {"reply_min_confidence": self.reply_min_confidence,
                "summary_min_confidence": self.summary_min_confidence, "after_agent": self.after_agent}

    @classmethod
    def from_json(cls, data: Mapping | None) -> OfferPolicy:
        if not data:
            return cls()
        return cls(float(data.get("reply_min_confidence", 0.0)), float(data.get("summary_min_confidence", 0.0)),
                   bool(data.get("after_agent", True)))
