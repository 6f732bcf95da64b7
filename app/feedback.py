"""Sentiment corrections for evaluation: `export_feedback(db_url)` is what `chatlens eval` reads.

One row per (chat_id, window_id): the latest correction wins. `predicted` and `corrected`
are sentiment names ("negative", "neutral", "positive"), as `chatlens.contracts.SENTIMENT_LABELS`
spells the values -1, 0 and 1.
"""

from __future__ import annotations

from sqlalchemy import create_engine, func, select

from app.models import Feedback
from app import sentiments


def export_feedback(db_url: str) -> list[dict]:
    """[{chat_id, window_id, predicted, corrected, corrected_by, corrected_at}], oldest first."""
    engine = create_engine(db_url)
    try:
        latest = (select(func.max(Feedback.id)).group_by(Feedback.chat_id, Feedback.window_id)).scalar_subquery()
        with engine.connect() as conn:
            rows = conn.execute(select(Feedback).where(Feedback.id.in_(latest)).order_by(Feedback.id)).all()
        return [
            {
                "chat_id": row.chat_id,
                "window_id": row.window_id,
                "predicted": sentiments.name(row.predicted),
                "corrected": sentiments.name(row.corrected),
                "corrected_by": row.actor,
                "corrected_at": row.at.isoformat(),
            }
            for row in rows
        ]
    finally:
        engine.dispose()
