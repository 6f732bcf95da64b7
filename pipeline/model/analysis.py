"""WindowAnalysis: what the model concluded about one chat window, as plain values.

Kept apart from the engine so that code which only moves results around (the pipeline's
post-processing, the remote handler) does not import JAX and Keras.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from chatlens.contracts import ChatWindow

REPLY_FOR = ("negative", "all", "none")
"""Which chats get a reply draft: negative ones, all, or none (`--reply-for`)."""


def wants_reply(reply_for: str, sentiment: int) -> bool:
    return reply_for == "all" or (reply_for == "negative" and sentiment < 0)


def reply_policies(reply_for: str | Sequence[str], count: int) -> list[str]:
    """One `reply_for` per window: the same policy for all, or one given per window."""
    policies = [reply_for] * count if isinstance(reply_for, str) else list(reply_for)
    if len(policies) != count or not set(policies) <= set(REPLY_FOR):
        raise ValueError(f"reply_for needs {count} values from {REPLY_FOR}, not {reply_for!r}")
    return policies


@dataclass(frozen=True)
class WindowAnalysis:
    """What the model says about one chat window (the pipeline turns it into a ChatInsight)."""

    scores: tuple[float, float, float]  # calibrated P(negative), P(neutral), P(positive)
    summary: str
    model_id: str
    prompt_version: str
    flags: tuple[str, ...] = ()
    reply_draft: str | None = None

    @property
    def sentiment(self) -> int:
        return max(range(3), key=self.scores.__getitem__) - 1

    @property
    def confidence(self) -> float:
        return float(max(self.scores))


def chat_of(example: Any) -> ChatWindow:
    """The ChatWindow of a model-stage example: a ChatWindow, or a record with one as `chat`
    (the pipeline's `TaggedWindow`, whose origin rides through RunInference untouched)."""
    return example if isinstance(example, ChatWindow) else example.chat


def text_bytes(batch: Sequence[Any]) -> int:
    """The chat text in a model-stage batch, in UTF-8 bytes: what its handlers report to Beam."""
    return sum(len(m.text.encode("utf-8")) for example in batch for m in chat_of(example).messages)
