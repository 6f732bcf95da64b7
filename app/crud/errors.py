"""Reading the errors view: dead letters and results messages that could not be used."""

from __future__ import annotations

from sqlalchemy.orm import Session

from app.crud import logs
from app.models import ErrorEvent

DEAD_LETTER, INVALID_INSIGHT, INVALID_DEAD_LETTER = "dead_letter", "invalid_insight", "invalid_dead_letter"
KINDS = (DEAD_LETTER, INVALID_INSIGHT, INVALID_DEAD_LETTER)
"""What an error row is: a pipeline dead letter, or a message that was not its topic's contract."""


def list_errors(session: Session, kind: str | None = None, limit: int = 200,
                before_id: int | None = None) -> list[ErrorEvent]:
    return list(session.scalars(logs.newest_first(ErrorEvent, limit, before_id, kind=kind)))


def counts(session: Session) -> dict[str, int]:
    return logs.counts(session, ErrorEvent.kind)
