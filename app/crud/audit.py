"""The audit log: one row per action with the state before and after, never changed."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from app.crud import logs
from app.models import AuditEntry


def record(
    session: Session,
    actor: str,
    action: str,
    chat_id: str | None = None,
    window_id: str | None = None,
    before: dict[str, Any] | None = None,
    after: dict[str, Any] | None = None,
) -> AuditEntry:
    entry = AuditEntry(actor=actor, action=action, chat_id=chat_id, window_id=window_id,
                       before=before, after=after)
    session.add(entry)
    return entry


def list_entries(
    session: Session,
    chat_id: str | None = None,
    actor: str | None = None,
    action: str | None = None,
    limit: int = 200,
    before_id: int | None = None,
) -> list[AuditEntry]:
    return list(session.scalars(logs.newest_first(AuditEntry, limit, before_id,
                                                  chat_id=chat_id, actor=actor, action=action)))


def action_counts(session: Session) -> dict[str, int]:
    return logs.counts(session, AuditEntry.action)
