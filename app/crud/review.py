"""What agents do to a chat. Each action is one transaction: change, audit row, live event.

Optimistic locking: the draft and the decision on it carry `Chat.version`. Editing,
approving and rejecting name the version the agent saw; if it moved on (a colleague saved,
or a newer window arrived) the action raises `Conflict` with the chat as it is now, so
nobody's words are overwritten silently. The row is read with FOR UPDATE (PostgreSQL) or
under BEGIN IMMEDIATE (SQLite), so check and write cannot interleave with another writer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.crud import audit, events
from app.db import Database
from app.errors import Conflict, Invalid, NotFound
from app.models import Chat, Feedback, User, utcnow
from app import sentiments
from chatlens.contracts import MAX_REPLY_CHARS

MAX_REASON_CHARS = 500


def snapshot(chat: Chat) -> dict[str, Any]:
    """The reviewable state of a chat, as the audit log keeps it."""
    corrected = chat.corrected_sentiment
    return {
        "version": chat.version,
        "status": chat.status,
        "draft": chat.draft,
        "reject_reason": chat.reject_reason,
        "assignee": chat.assignee,
        "sentiment": sentiments.name(chat.effective_sentiment),
        "corrected_sentiment": None if corrected is None else sentiments.name(corrected),
    }


def _clean_reply(text: str | None) -> str:
    text = (text or "").replace("\r\n", "\n")
    if not text.strip():
        raise Invalid("The reply is empty.")
    if len(text) > MAX_REPLY_CHARS:
        raise Invalid(f"The reply is {len(text)} characters long; at most {MAX_REPLY_CHARS} are allowed.")
    return text


def _act(db: Database, chat_id: str, actor: str, action: str,
         change: Callable[[Session, Chat], dict[str, Any] | None],
         expected_version: int | None = None, event: bool = True) -> Chat:
    """Run `change` on the locked chat, then audit and announce it; a no-op change records nothing."""
    with db.writing() as session:
        chat = session.get(Chat, chat_id, with_for_update=True)
        if chat is None:
            raise NotFound(f"No chat {chat_id!r}.")
        if expected_version is not None and chat.version != expected_version:
            who = chat.updated_by or "someone"
            session.expunge(chat)  # keep its loaded state for the caller past the rollback
            raise Conflict(
                f"{who} changed this chat after you opened it (version {expected_version} → "
                f"{chat.version}). Your text was not saved; the current text is shown.",
                current=chat,
            )
        before = snapshot(chat)
        extra = change(session, chat)
        after = snapshot(chat)
        if after == before and not extra:
            return chat
        chat.updated_at = utcnow()
        chat.updated_by = actor
        if extra:
            after = after | extra
        audit.record(session, actor, action, chat.chat_id, chat.window_id, before=before, after=after)
        if event:
            events.add_event(session, "chat", chat.chat_id, action=action, version=chat.version,
                             status=chat.status, actor=actor)
        session.commit()
        return chat


def save_draft(db: Database, chat_id: str, actor: str, text: str, version: int) -> Chat:
    text = _clean_reply(text)

    def change(_session: Session, chat: Chat) -> None:
        if chat.draft == text:
            return
        chat.draft = text
        chat.draft_edited = True
        chat.version += 1
        if chat.status == "approved":  # the approval was for other words
            chat.status = "new"

    return _act(db, chat_id, actor, "edit", change, expected_version=version)


def approve(db: Database, chat_id: str, actor: str, version: int, text: str | None = None) -> Chat:
    """Approve the reply; with `text`, save that text first (one step, one audit row)."""
    cleaned = _clean_reply(text) if text is not None else None

    def change(_session: Session, chat: Chat) -> None:
        if cleaned is not None and cleaned != chat.draft:
            chat.draft = cleaned
            chat.draft_edited = True
        if not (chat.draft or "").strip():
            raise Invalid("There is no reply to approve; write one first.")
        chat.status = "approved"
        chat.reject_reason = None
        chat.version += 1

    return _act(db, chat_id, actor, "approve", change, expected_version=version)


def reject(db: Database, chat_id: str, actor: str, version: int, reason: str) -> Chat:
    reason = (reason or "").strip()
    if not reason:
        raise Invalid("Say why the draft is rejected.")
    if len(reason) > MAX_REASON_CHARS:
        raise Invalid(f"The reason is too long (at most {MAX_REASON_CHARS} characters).")

    def change(_session: Session, chat: Chat) -> None:
        chat.status = "rejected"
        chat.reject_reason = reason
        chat.version += 1

    return _act(db, chat_id, actor, "reject", change, expected_version=version)


def mark_handled(db: Database, chat_id: str, actor: str) -> Chat:
    def change(_session: Session, chat: Chat) -> None:
        if chat.status != "handled":
            chat.status = "handled"
            chat.version += 1  # whoever is still editing hears about it

    return _act(db, chat_id, actor, "handled", change)


def reopen(db: Database, chat_id: str, actor: str) -> Chat:
    def change(_session: Session, chat: Chat) -> None:
        if chat.status != "new":
            chat.status = "new"
            chat.reject_reason = None
            chat.version += 1

    return _act(db, chat_id, actor, "reopen", change)


def assign(db: Database, chat_id: str, actor: str, assignee: str | None) -> Chat:
    """Give the chat to `assignee` (a username) or to nobody (None)."""

    def change(session: Session, chat: Chat) -> None:
        if assignee is not None:
            user = session.scalar(select(User).where(User.username == assignee))
            if user is None or user.disabled:
                raise Invalid(f"No active user {assignee!r}.")
        chat.assignee = assignee

    return _act(db, chat_id, actor, "assign", change)


def correct_sentiment(db: Database, chat_id: str, actor: str, label: str) -> Chat:
    """Record a person's label for the current window (a feedback row for `chatlens eval`)."""
    try:
        corrected = sentiments.value(label)
    except KeyError:
        raise Invalid(f"Unknown sentiment {label!r}.") from None

    def change(session: Session, chat: Chat) -> dict[str, Any]:
        session.add(Feedback(chat_id=chat.chat_id, window_id=chat.window_id, predicted=chat.sentiment,
                             corrected=corrected, actor=actor))
        chat.corrected_sentiment = None if corrected == chat.sentiment else corrected
        chat.effective_sentiment = corrected
        return {"feedback": {"predicted": sentiments.name(chat.sentiment), "corrected": label}}

    return _act(db, chat_id, actor, "sentiment", change)


def record_copy(db: Database, chat_id: str, actor: str) -> Chat:
    """Note that the reply was copied (to be pasted to the customer): audit only."""

    def change(_session: Session, chat: Chat) -> dict[str, Any]:
        return {"copied_version": chat.version}

    return _act(db, chat_id, actor, "copy", change, event=False)
