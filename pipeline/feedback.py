"""What staff taught the dashboard, as corpus examples: what `chatlens eval --from-dashboard`
scores and `chatlens tune --from-dashboard` learns from.

The latest sentiment correction per (chat_id, window_id) and every approved or edited reply,
each with the chat window as analysed: the corrected label and the staff's reply are gold; the
model's own label and summary fill in as context where staff gave none (not gold: never scored,
never learnt).

The dashboard's database is the interface: it is read here by its table and column names
(`feedback`, `chats`, `insights`, as app/models.py and its migrations define them), so the
pipeline imports nothing of the dashboard (app/) and the dashboard nothing of the pipeline
(tests/test_architecture.py).
"""

from __future__ import annotations

from sqlalchemy import column, create_engine, func, or_, select, table, tuple_

from chatlens.contracts import ChatInsight, ChatWindow
from pipeline.corpus import Example

FEEDBACK = table("feedback", column("id"), column("chat_id"), column("window_id"), column("corrected"))
CHATS = table("chats", column("chat_id"), column("window_id"), column("draft"), column("status"),
              column("draft_edited"))
INSIGHTS = table("insights", column("chat_id"), column("window_id"), column("payload"))


def window_of_insight(insight: ChatInsight) -> ChatWindow:
    """The chat window an insight was made from (its transcript and identity)."""
    return ChatWindow(chat_id=insight.chat_id, window_id=insight.window_id, tenant=insight.tenant,
                      language=insight.language, customer_id=insight.customer_id,
                      messages=list(insight.transcript), closed=insight.closed)


def export_examples(db_url: str) -> list[Example]:
    """Corrected labels and approved or edited replies as corpus examples, one per chat window."""
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            latest = select(func.max(FEEDBACK.c.id)).group_by(FEEDBACK.c.chat_id, FEEDBACK.c.window_id)
            corrections = conn.execute(select(FEEDBACK).where(FEEDBACK.c.id.in_(latest.scalar_subquery()))
                                       .order_by(FEEDBACK.c.id)).all()
            labels = {(row.chat_id, row.window_id): row.corrected for row in corrections}
            reviewed = conn.execute(
                select(CHATS.c.chat_id, CHATS.c.window_id, CHATS.c.draft)
                .where(CHATS.c.draft.is_not(None), or_(CHATS.c.status == "approved", CHATS.c.draft_edited.is_(True)))
            ).all()
            replies = {(row.chat_id, row.window_id): row.draft for row in reviewed}
            keys = sorted(set(labels) | set(replies))
            found = conn.execute(select(INSIGHTS.c.chat_id, INSIGHTS.c.window_id, INSIGHTS.c.payload)
                                 .where(tuple_(INSIGHTS.c.chat_id, INSIGHTS.c.window_id).in_(keys))).all() if keys else []
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
