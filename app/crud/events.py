"""The live-update outbox: events are rows, so their ids survive restarts and span processes."""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from app.models import Event


def add_event(session: Session, kind: str, chat_id: str | None = None, **data: Any) -> None:
    """Queue an event in the caller's transaction: it exists exactly when the change does."""
    session.add(Event(kind=kind, chat_id=chat_id, data={"chat_id": chat_id, **data}))


def last_event_id(session: Session) -> int:
    return session.scalar(select(func.max(Event.id))) or 0


def first_event_id(session: Session) -> int:
    return session.scalar(select(func.min(Event.id))) or 0


def events_after(session: Session, after: int, limit: int = 500) -> list[Event]:
    return list(session.scalars(select(Event).where(Event.id > after).order_by(Event.id).limit(limit)))


def events_by_id(session: Session, ids: list[int]) -> list[Event]:
    return list(session.scalars(select(Event).where(Event.id.in_(ids)).order_by(Event.id)))


def prune_events(session: Session, keep: int) -> int:
    """Drop all but the newest `keep` events; returns how many went."""
    newest = last_event_id(session)
    result = session.execute(delete(Event).where(Event.id <= newest - keep))
    return result.rowcount or 0
