"""Reading the errors view: dead letters and results messages that could not be used."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.models import ErrorEvent


def list_errors(session: Session, kind: str | None = None, limit: int = 200,
                before_id: int | None = None) -> list[ErrorEvent]:
    query = select(ErrorEvent).order_by(ErrorEvent.id.desc()).limit(limit)
    if kind:
        query = query.where(ErrorEvent.kind == kind)
    if before_id:
        query = query.where(ErrorEvent.id < before_id)
    return list(session.scalars(query))


def counts(session: Session) -> dict[str, int]:
    return dict(session.execute(select(ErrorEvent.kind, func.count()).group_by(ErrorEvent.kind)).all())
