"""What staff taught the dashboard, for evaluation and tuning.

- `export_feedback(db_url)`: the sentiment corrections, one row per (chat_id, window_id), the
  latest correction winning; `predicted` and `corrected` are sentiment names.
- `export_examples(db_url)`: the same corrections plus every approved or edited reply, as
  corpus examples (`pipeline.corpus.Example`): the chat window as analysed, the corrected label
  and the staff's reply as gold; the model's own label and summary fill in as context where
  staff gave none (not gold: never scored, never learnt). This is what
  `chatlens eval --from-dashboard` scores and `chatlens tune --from-dashboard` learns from.
"""

from __future__ import annotations

from sqlalchemy import create_engine, func, or_, select, tuple_

from app import sentiments
from app.models import Chat, Feedback, Insight
from chatlens.contracts import ChatInsight, ChatWindow


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


def window_of_insight(insight: ChatInsight) -> ChatWindow:
    """The chat window an insight was made from (its transcript and identity)."""
    return ChatWindow(chat_id=insight.chat_id, window_id=insight.window_id, tenant=insight.tenant,
                      language=insight.language, customer_id=insight.customer_id,
                      messages=list(insight.transcript), closed=insight.closed)


def export_examples(db_url: str) -> list:
    """Corrected labels and approved or edited replies as corpus examples, one per chat window."""
    from pipeline.corpus import Example

    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            labels = {(row.chat_id, row.window_id): row.corrected for row in _latest_corrections(conn)}
            reviewed = conn.execute(
                select(Chat.chat_id, Chat.window_id, Chat.draft)
                .where(Chat.draft.is_not(None), or_(Chat.status == "approved", Chat.draft_edited.is_(True)))
            ).all()
            replies = {(row.chat_id, row.window_id): row.draft for row in reviewed}
            keys = sorted(set(labels) | set(replies))
            found = conn.execute(select(Insight.chat_id, Insight.window_id, Insight.payload)
                                 .where(tuple_(Insight.chat_id, Insight.window_id).in_(keys))).all() if keys else []
            payloads = {(row.chat_id, row.window_id): row.payload for row in found}
        examples = []
        for key in keys:
            insight = ChatInsight.model_validate_json(payloads[key])
            gold = tuple(name for name, given in (("label", key in labels), ("reply", key in replies)) if given)
            examples.append(Example(window_of_insight(insight), labels.get(key, insight.sentiment), insight.summary,
                                    replies.get(key), scenario=key[0], gold=gold))
        return examples
    finally:
        engine.dispose()
