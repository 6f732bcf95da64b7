"""Storing what the subscribers receive: idempotent, and nothing received is ever dropped.

A ChatInsight is stored once per (chat_id, window_id); a redelivery is recognised and
reported as a duplicate. The chat row always shows the newest window, judged by the
transcript's last message (then analysis time), so windows arriving out of order never
roll a chat back. Anything that is not a valid message becomes an error row instead;
a dead letter is stored once per input it stands for (`dead_letter_key`).
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from enum import Enum
from typing import Any

from pydantic import ValidationError
from sqlalchemy import JSON, select
from sqlalchemy.exc import IntegrityError

from app.crud import audit, events, search
from app.crud.errors import DEAD_LETTER, INVALID_DEAD_LETTER, INVALID_INSIGHT
from app.db import Database
from app.models import CHAT_WINDOW_COPY, Chat, ErrorEvent, Insight, utcnow
from app import sentiments
from chatlens.contracts import (
    ANALYSIS_FIELDS,
    ChatAnalysis,
    ChatInsight,
    ChatMessage,
    DeadLetter,
    describe_validation_error,
    json_object,
)

SYSTEM_ACTOR = "pipeline"
INTEGRITY_RETRIES = 3


class Outcome(str, Enum):
    stored = "stored"
    duplicate = "duplicate"
    invalid = "invalid"


def waiting_since(transcript: tuple[ChatMessage, ...] | list[ChatMessage]) -> datetime:
    """When the customer started waiting: their first message after the last agent answer.

    Bot messages do not count as an answer. A chat whose last word was the agent's is not
    waiting; it sorts by its last message instead.
    """
    waiting: datetime | None = None
    for message in transcript:
        if message.sender == "agent":
            waiting = None
        elif message.sender == "customer" and waiting is None:
            waiting = message.sent_at
    return waiting or transcript[-1].sent_at


def _window_key(last_message_at: datetime, analyzed_at: datetime, window_id: str) -> tuple:
    return (last_message_at, analyzed_at, window_id)


def _chat_body(insight: ChatInsight) -> str:
    return search.search_text(
        insight.chat_id, insight.customer_id, insight.tenant, insight.summary,
        *(message.text for message in insight.transcript),
    )


_JSON_OUTPUTS = {name for name in ANALYSIS_FIELDS if isinstance(Insight.__table__.c[name].type, JSON)}


def analysis_values(analysis: ChatAnalysis) -> dict[str, Any]:
    """Each model output as its column (`app.models.analysis_column`) stores it: JSON ones as JSON."""
    return (analysis.model_dump(include=set(ANALYSIS_FIELDS) - _JSON_OUTPUTS)
            | analysis.model_dump(mode="json", include=_JSON_OUTPUTS))


def insight_row(insight: ChatInsight, raw: bytes, message_id: str | None, received_at: datetime) -> dict[str, Any]:
    """The `insights` row of a received ChatInsight, as keyword arguments of `Insight` (for bulk fills too)."""
    return dict(
        chat_id=insight.chat_id, window_id=insight.window_id, message_id=message_id,
        model_id=insight.model_id, prompt_version=insight.prompt_version, published_at=insight.published_at,
        analyzed_at=insight.analyzed_at, received_at=received_at, last_message_at=insight.transcript[-1].sent_at,
        transcript=[message.model_dump(mode="json") for message in insight.transcript],
        payload=raw.decode("utf-8"), **analysis_values(insight),
    )


def _apply_window(chat: Chat, insight: ChatInsight, row: dict[str, Any], body: str) -> None:
    """Make `insight` (stored as `row`, its `insight_row`) the chat's current window: new text, new
    draft, back to review."""
    for column, field in CHAT_WINDOW_COPY.items():
        setattr(chat, column, row[field])
    chat.tenant = insight.tenant
    chat.customer_id = insight.customer_id
    chat.language = insight.language
    chat.closed = insight.closed
    chat.window_id = insight.window_id
    chat.window_last_message_at = insight.transcript[-1].sent_at
    chat.window_analyzed_at = insight.analyzed_at
    chat.corrected_sentiment = None
    chat.effective_sentiment = insight.sentiment
    chat.draft_edited = False
    chat.status = "new"
    chat.reject_reason = None
    chat.waiting_since = waiting_since(insight.transcript)
    chat.search_text = body


def _review_state(chat: Chat) -> dict[str, Any]:
    return {"window_id": chat.window_id, "status": chat.status, "draft": chat.draft,
            "draft_edited": chat.draft_edited, "version": chat.version}


def _store_insight(db: Database, insight: ChatInsight, raw: bytes, message_id: str | None,
                   received_at: datetime) -> tuple[Outcome, bool]:
    """Store one insight; returns (outcome, whether it became the chat's current window)."""
    with db.writing() as session:
        exists = session.scalar(
            select(Insight.id).where(Insight.chat_id == insight.chat_id,
                                     Insight.window_id == insight.window_id)
        )
        if exists is not None:
            return Outcome.duplicate, False
        last_message_at = insight.transcript[-1].sent_at
        row = insight_row(insight, raw, message_id, received_at)
        session.add(Insight(**row))
        chat = session.get(Chat, insight.chat_id, with_for_update=True)
        body = _chat_body(insight)
        current = True
        if chat is None:
            chat = Chat(chat_id=insight.chat_id, version=1, windows_seen=1, first_seen_at=received_at,
                        updated_at=received_at, updated_by=SYSTEM_ACTOR)
            _apply_window(chat, insight, row, body)
            session.add(chat)
        else:
            chat.windows_seen += 1
            current = _window_key(last_message_at, insight.analyzed_at, insight.window_id) > _window_key(
                chat.window_last_message_at, chat.window_analyzed_at, chat.window_id)
            if current:
                before = _review_state(chat)
                reviewed = chat.status != "new" or chat.draft_edited
                _apply_window(chat, insight, row, body)
                chat.version += 1
                chat.updated_at = received_at
                chat.updated_by = SYSTEM_ACTOR
                if reviewed:  # a person's work is superseded: keep what it was
                    audit.record(session, SYSTEM_ACTOR, "new_window", chat.chat_id, insight.window_id,
                                 before=before, after=_review_state(chat))
        if current and db.fts:
            search.index_chat(session, insight.chat_id, body)
        events.add_event(session, "chat", insight.chat_id, action="insight", window_id=insight.window_id,
                         current=current, version=chat.version,
                         sentiment=sentiments.name(insight.sentiment), actor=SYSTEM_ACTOR)
        session.commit()
        return Outcome.stored, current


def _store_invalid(db: Database, source: str, kind: str, model: type, data: bytes, error: Exception, *,
                   message_id: str | None, attributes: dict[str, str] | None, received_at: datetime | None
                   ) -> Outcome:
    """A message that is not the topic's contract: kept whole for the errors view, then acked.

    `error` is whatever reading it raised: a ValidationError, or anything else the bytes
    provoke (they come from outside; an exception that escaped would be nacked and the
    message redelivered again and again)."""
    reason = (describe_validation_error(error) if isinstance(error, ValidationError)
              else f"could not be read ({type(error).__name__}: {error})")
    return store_error(db, source=source, kind=kind, payload=data, error_class=type(error).__name__,
                       error_message=f"not a valid {model.__name__}: {reason}",
                       message_id=message_id, attributes=attributes, received_at=received_at)


def ingest_insight(db: Database, data: bytes, *, message_id: str | None = None,
                   attributes: dict[str, str] | None = None,
                   received_at: datetime | None = None) -> Outcome:
    """Store a results-topic message; raises only when the database fails (then nack)."""
    received_at = received_at or utcnow()
    try:
        insight = ChatInsight.model_validate_json(data)
    except Exception as error:  # noqa: BLE001 - untrusted bytes: see _store_invalid
        return _store_invalid(db, "insights", INVALID_INSIGHT, ChatInsight, data, error, message_id=message_id,
                              attributes=attributes, received_at=received_at)
    for attempt in range(INTEGRITY_RETRIES):
        try:
            return _store_insight(db, insight, data, message_id, received_at)[0]
        except IntegrityError:
            # A concurrent delivery of this window, or of the chat's first window, got in
            # first; the next attempt sees its row and stores a duplicate or an update.
            if attempt == INTEGRITY_RETRIES - 1:
                raise
    raise AssertionError("unreachable")


def dead_letter_key(letter: DeadLetter, attributes: dict[str, str] | None) -> str | None:
    """A pipeline dead letter's identity: the input message(s) it stands for (its `source_key`
    attribute, pipeline.transforms.dead_letters.source_key) and what it says about them; None without one.

    The pipeline acknowledges an input only after its dead letter is published, so one killed
    in between publishes the dead letter again, as a new Pub/Sub message, once the input is
    redelivered: keyed on the input, both are one row. The dead letter's own message id is no
    key: that is a new one each time, and a restarted local Pub/Sub server numbers messages
    from 1 again, so an id can even come back for a different dead letter.
    """
    sources = (attributes or {}).get("source_key")
    if not sources:
        return None
    digest = hashlib.sha256()
    for part in (letter.stage, sources, letter.chat_id or "", json.dumps(letter.attributes, sort_keys=True)):
        digest.update(part.encode("utf-8") + b"\0")
    digest.update(letter.payload)
    return "dl-" + digest.hexdigest()[:40]


def ingest_dead_letter(db: Database, data: bytes, *, message_id: str | None = None,
                       attributes: dict[str, str] | None = None,
                       received_at: datetime | None = None) -> Outcome:
    """Store a dead-letter-topic message for the errors view (invalid ones too): the pipeline's
    once per input (`dead_letter_key`), others once per Pub/Sub message."""
    try:
        letter = DeadLetter.model_validate_json(data)
    except Exception as error:  # noqa: BLE001 - untrusted bytes: see _store_invalid
        return _store_invalid(db, "deadletter", INVALID_DEAD_LETTER, DeadLetter, data, error, message_id=message_id,
                              attributes=attributes, received_at=received_at)
    pubsub = {f"pubsub.{name}": value for name, value in (attributes or {}).items()}
    key = dead_letter_key(letter, attributes)
    if key and message_id:
        pubsub["pubsub.message_id"] = message_id
    return store_error(db, source="deadletter", kind=DEAD_LETTER, payload=letter.payload,
                       stage=letter.stage, error_class=letter.error_class,
                       error_message=letter.error_message, chat_id=letter.chat_id,
                       failed_at=letter.failed_at, message_id=key or message_id,
                       attributes=dict(letter.attributes) | pubsub, received_at=received_at)


def _guess_chat_id(payload: bytes, attributes: dict[str, str]) -> str | None:
    """The chat an unusable payload claims, for the errors view; None when it claims none.
    Never raises, whatever the payload (`json_object`): it runs while an error row is stored."""
    if attributes.get("chat_id"):
        return attributes["chat_id"][:200]
    value = (json_object(payload) or {}).get("chat_id")
    return value[:200] if isinstance(value, str) else None


def _storable(text: str | None, length: int | None = None) -> str | None:
    """Text any database stores: no NUL characters (PostgreSQL's text types refuse them; SQLite
    keeps them) and at most `length` characters (PostgreSQL refuses longer ones for a String(n))."""
    return text.replace("\x00", "\N{REPLACEMENT CHARACTER}")[:length] if text else text


def store_error(db: Database, *, source: str, kind: str, payload: bytes, error_message: str,
                error_class: str | None = None, stage: str | None = None, chat_id: str | None = None,
                failed_at: datetime | None = None, message_id: str | None = None,
                attributes: dict[str, str] | None = None, received_at: datetime | None = None) -> Outcome:
    """Keep a message that could not be used, once per `message_id` (a pipeline dead letter's: its key).

    Raises only when the database fails: the texts are cleaned (`_storable`) and the chat id
    guessed defensively, so no payload can make storing its error row fail."""
    attributes = {_storable(str(k)): _storable(str(v)) for k, v in (attributes or {}).items()}
    error_message, error_class, stage = _storable(error_message), _storable(error_class, 200), _storable(stage, 64)
    try:
        with db.writing() as session:
            if message_id and session.scalar(select(ErrorEvent.id).where(
                    ErrorEvent.source == source, ErrorEvent.message_id == message_id)) is not None:
                return Outcome.duplicate
            chat_id = _storable(chat_id or _guess_chat_id(payload, attributes), 200)
            session.add(ErrorEvent(
                source=source, kind=kind, message_id=message_id, stage=stage, error_class=error_class,
                error_message=error_message, chat_id=chat_id, payload=payload, attributes=attributes,
                failed_at=failed_at, received_at=received_at or utcnow(),
            ))
            events.add_event(session, "errorlog", chat_id, error_kind=kind)
            session.commit()
    except IntegrityError:
        return Outcome.duplicate
    return Outcome.invalid if kind.startswith("invalid") else Outcome.stored
