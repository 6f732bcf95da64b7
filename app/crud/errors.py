"""Reading the errors view: dead letters and results messages that could not be used."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func
from sqlalchemy.orm import Session, defer

from app.crud import logs
from app.models import ErrorEvent

DEAD_LETTER, INVALID_INSIGHT, INVALID_DEAD_LETTER = "dead_letter", "invalid_insight", "invalid_dead_letter"
KINDS = (DEAD_LETTER, INVALID_INSIGHT, INVALID_DEAD_LETTER)
"""What an error row is: a pipeline dead letter, or a message that was not its topic's contract."""

PREVIEW_CHARS = 2000
PREVIEW_BYTES = 4 * PREVIEW_CHARS  # UTF-8 takes at most 4 bytes a character


@dataclass(frozen=True)
class ErrorRow:
    """An error row without its payload (`event.payload` is not loaded): the payload's first
    PREVIEW_BYTES bytes and its length, both read in SQL, so a 30 MB payload costs 8 KB here."""

    event: ErrorEvent
    payload_head: bytes
    payload_bytes: int


def list_errors(session: Session, kind: str | None = None, limit: int = 200,
                before_id: int | None = None) -> list[ErrorRow]:
    query = (logs.newest_first(ErrorEvent, limit, before_id, kind=kind).options(defer(ErrorEvent.payload))
             .add_columns(func.substr(ErrorEvent.payload, 1, PREVIEW_BYTES), func.length(ErrorEvent.payload)))
    return [ErrorRow(event, bytes(head or b""), size or 0) for event, head, size in session.execute(query)]


def counts(session: Session) -> dict[str, int]:
    return logs.counts(session, ErrorEvent.kind)
