"""What staff taught the dashboard: `export_feedback(db_url)`, the sentiment corrections, one row
per (chat_id, window_id), the latest correction winning; `predicted` and `corrected` are
sentiment names.

The same corrections plus every approved or edited reply, as corpus examples for `chatlens
eval/tune --from-dashboard`, are read from the database by the pipeline itself
(pipeline/feedback.py): the dashboard imports nothing of the pipeline, nor the pipeline of it.
"""

from __future__ import annotations

from sqlalchemy import create_engine, func, select

from app import sentiments
from app.models import Feedback


def _latest_corrections(conn) -> list:
    latest = select(func.max(Feedback.id)).group_by(Feedback.chat_id, Feedback.window_id).scalar_subquery()
    return conn.execute(select(Feedback).where(Feedback.id.in_(latest)).order_by(Feedback.id)).all()


def export_feedback(db_url: str) -> list[dict]:
    """[{chat_id, window_id, predicted, corrected, corrected_by, corrected_at}], oldest first."""
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            rows = _latest_corrections(conn)
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

