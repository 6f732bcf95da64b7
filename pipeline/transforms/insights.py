"""Insights: a window and its model analysis become a ChatInsight Output."""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

import apache_beam as beam
from apache_beam import pvalue

from chatlens.contracts import SENTIMENT_LABELS, ChatInsight, ChatWindow, SentimentScores
from pipeline.metrics import Counter, Distribution
from pipeline.transforms.dead_letters import exception_dead_letter
from pipeline.transforms.records import DEAD_LETTER, Analysed, Origin, Output

log = logging.getLogger(__name__)

MAX_FLAGS = 16


def build_insight(origin: Origin, chat: ChatWindow, analysis: Any, analyzed_at: datetime | None = None
                  ) -> ChatInsight:
    """A ChatInsight from a window and its WindowAnalysis (scores, summary, reply, flags)."""
    total = sum(float(s) for s in analysis.scores)
    negative, neutral, positive = (float(s) / total for s in analysis.scores)
    scores = SentimentScores(negative=negative, neutral=neutral, positive=positive)
    flags = list(dict.fromkeys([*origin.flags, *analysis.flags]))[:MAX_FLAGS]
    return ChatInsight(
        chat_id=chat.chat_id,
        window_id=chat.window_id,
        tenant=chat.tenant,
        language=chat.language,
        customer_id=chat.customer_id,
        closed=chat.closed,
        sentiment=scores.label(),
        confidence=max(negative, neutral, positive),
        scores=scores,
        summary=analysis.summary,
        reply_draft=analysis.reply_draft,
        flags=flags,
        summary_confidence=getattr(analysis, "summary_confidence", None),
        reply_confidence=getattr(analysis, "reply_confidence", None),
        model_id=analysis.model_id,
        prompt_version=analysis.prompt_version,
        published_at=origin.published_at,
        analyzed_at=analyzed_at or datetime.now(timezone.utc),
        transcript=list(chat.messages),
    )


def insight_attributes(insight: ChatInsight) -> dict[str, str]:
    """The Pub/Sub attributes of an insight: what consumers filter on without parsing it."""
    attributes = {
        "chat_id": insight.chat_id,
        "window_id": insight.window_id,
        "sentiment": SENTIMENT_LABELS[insight.sentiment],
        "schema_version": str(insight.schema_version),
    }
    if insight.tenant:
        attributes["tenant"] = insight.tenant
    if insight.closed:
        attributes["closed"] = "true"
    return attributes


class BuildInsightFn(beam.DoFn):
    """Analysed -> an insight Output; a failure is the window's dead letter (stage "postprocess")."""

    def __init__(self):
        self.insights = Counter("insights")
        self.replies = Counter("reply_drafts")
        self.lag = Distribution("insight_lag_ms")
        self.by_sentiment = {value: Counter(f"insights_{name}") for value, name in SENTIMENT_LABELS.items()}

    def process(self, element: Analysed):
        origin, chat, analysis = element
        try:
            insight = build_insight(origin, chat, analysis)
        except Exception as error:  # noqa: BLE001 - any failure here is the message's, not the pipeline's
            log.warning("post-processing %s/%s failed: %s", origin.chat_id, origin.window_id, error)
            yield pvalue.TaggedOutput(DEAD_LETTER, exception_dead_letter(
                origin.payload, "postprocess", error, attributes=origin.attributes, chat_id=origin.chat_id,
                source_ids=origin.source_ids, published_at=origin.published_at))
            return
        self.insights.inc()
        self.by_sentiment[insight.sentiment].inc()
        if insight.reply_draft:
            self.replies.inc()
        self.lag.update(int((insight.analyzed_at - insight.published_at).total_seconds() * 1000))
        yield Output(insight, insight_attributes(insight), origin.source_ids)
