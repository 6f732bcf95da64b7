"""The audit log: one row per action with the state before and after, never changed."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

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
    query = select(AuditEntry).order_by(AuditEntry.id.desc()).limit(limit)
    if chat_id:
        query = query.where(AuditEntry.chat_id == chat_id)
    if actor:
        query = query.where(AuditEntry.actor == actor)
    if action:
        query = query.where(AuditEntry.action == action)
    if before_id:
        query = query.where(AuditEntry.id < before_id)
    return list(session.scalars(query))


def action_counts(session: Session) -> dict[str, int]:
    rows = session.execute(select(AuditEntry.action, func.count()).group_by(AuditEntry.action))
    return {action: count for action, count in rows}
