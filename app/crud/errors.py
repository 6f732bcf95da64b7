"""Reading the errors view: dead letters and results messages that could not be used."""

from __future__ import annotations

from sqlalchemy.orm import Session

from app.crud import logs
from app.models import ErrorEvent

KINDS = ("dead_letter", "invalid_insight", "invalid_dead_letter")


def list_errors(session: Session, kind: str | None = None, limit: int = 200,
                before_id: int | None = None) -> list[ErrorEvent]:
    return list(session.scalars(logs.newest_first(ErrorEvent, limit, before_id, kind=kind)))


def counts(session: Session) -> dict[str, int]:
    return logs.counts(session, ErrorEvent.kind)
