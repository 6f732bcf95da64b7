"""The dashboard's tables (SQLAlchemy 2 ORM); one class per table, no behaviour.

Times are stored as naive UTC and handed back timezone-aware (`UTCDateTime`), so SQLite
and PostgreSQL return the same values. The model outputs' columns are made from the contract
(`chatlens.contracts.ChatAnalysis`, see `analysis_column`), so they are never written twice.
"""

from __future__ import annotations

from datetime import datetime, timezone
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import AwareDatetime, BaseModel
from pydantic_core import PydanticUndefined
from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, MappedColumn, mapped_column
from sqlalchemy.types import TypeEngine

from chatlens.contracts import ANALYSIS_FIELDS, ChatAnalysis

ID = String(128)
ANALYSIS_FIELD = "analysis_field"
"""Column.info key: the ChatAnalysis field a column holds."""


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator):
    """Aware datetimes in, aware UTC datetimes out, whatever the database keeps."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column")
        return value.astimezone(timezone.utc).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        return None if value is None else value.replace(tzinfo=timezone.utc)


# str is Text whatever its max_length: the contract enforces limits on ingest, so a new limit
# needs no migration (and the baseline keeps summaries and drafts as Text).
_SCALAR_TYPES: dict[Any, type[TypeEngine]] = {bool: Boolean, int: Integer, float: Float, str: Text,
                                              datetime: UTCDateTime, AwareDatetime: UTCDateTime}
_JSON_ORIGINS = (list, tuple, dict, set, frozenset)


def column_type(annotation: Any) -> tuple[TypeEngine, bool]:
    """The column type for a contract field's annotation, and whether the column is nullable."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return column_type(args[0])
    if origin in (Union, UnionType):
        present = [arg for arg in args if arg is not type(None)]
        if len(present) == 1:
            return column_type(present[0])[0], True
    elif origin is Literal and len({type(arg) for arg in args}) == 1:
        return column_type(type(args[0]))
    elif annotation in _SCALAR_TYPES:
        return _SCALAR_TYPES[annotation](), False
    elif origin in _JSON_ORIGINS or annotation in _JSON_ORIGINS or (
            isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        return JSON(), False
    raise TypeError(f"no column type for {annotation!r}: extend app.models.column_type")


def analysis_column(field: str, **kwargs: Any) -> MappedColumn[Any]:
    """A column holding the ChatAnalysis field `field`, typed and nullable as the contract says."""
    info = ChatAnalysis.model_fields[field]
    type_, nullable = column_type(info.annotation)
    default = info.default_factory or info.default
    extra = {} if default is None or default is PydanticUndefined else {"default": default}
    return mapped_column(type_, nullable=nullable, info={ANALYSIS_FIELD: field}, **extra, **kwargs)


# One column per model output, named as its field: a new ChatAnalysis field gets its column
# here (and its migration from `alembic revision --autogenerate`).
AnalysisColumns = type("AnalysisColumns", (), {
    field: analysis_column(field, sort_order=-1) for field in ANALYSIS_FIELDS})


class Base(DeclarativeBase):
    pass


class Chat(Base):
    """One row per chat: the current (newest) window's insight plus the review state.

    Its `analysis_column`s are the current window's outputs the queue sorts, shows or edits;
    ingest copies each (CHAT_WINDOW_COPY).
    """

    __tablename__ = "chats"

    chat_id: Mapped[str] = mapped_column(ID, primary_key=True)
    tenant: Mapped[str | None] = mapped_column(ID, index=True)
    customer_id: Mapped[str] = mapped_column(ID)
    language: Mapped[str | None] = mapped_column(String(35))
    closed: Mapped[bool] = mapped_column(Boolean, default=False)
    window_id: Mapped[str] = mapped_column(ID)
    window_last_message_at: Mapped[datetime] = mapped_column(UTCDateTime)
    window_analyzed_at: Mapped[datetime] = mapped_column(UTCDateTime)
    windows_seen: Mapped[int] = mapped_column(Integer, default=1)
    sentiment = analysis_column("sentiment")  # as predicted for the current window
    confidence = analysis_column("confidence")
    corrected_sentiment: Mapped[int | None] = mapped_column(Integer)
    effective_sentiment: Mapped[int] = mapped_column(Integer, index=True)  # corrected, else predicted
    summary = analysis_column("summary")
    draft = analysis_column("reply_draft")  # the model's reply until someone edits it
    draft_edited: Mapped[bool] = mapped_column(Boolean, default=False)
    version: Mapped[int] = mapped_column(Integer, default=1)  # optimistic lock on draft and decision
    status: Mapped[str] = mapped_column(String(16), default="new", index=True)
    reject_reason: Mapped[str | None] = mapped_column(Text)
    assignee: Mapped[str | None] = mapped_column(String(64), index=True)
    waiting_since: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    first_seen_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_by: Mapped[str | None] = mapped_column(String(64))
    search_text: Mapped[str] = mapped_column(Text, default="")

    __table_args__ = (
        Index("ix_chats_queue", "status", "effective_sentiment", "waiting_since"),
        # The queue's order: its first page is read in order and the LIMIT stops the scan (without
        # it, every open chat was read and sorted: 90-160 ms a page at 100,000 chats); with status
        # last, the open filter and the per-sentiment counts come from the index alone.
        Index("ix_chats_order", "effective_sentiment", "waiting_since", "chat_id", "status"),
    )


CHAT_WINDOW_COPY: dict[str, str] = {
    column.key: column.info[ANALYSIS_FIELD] for column in Chat.__table__.columns if ANALYSIS_FIELD in column.info}
"""Chat column -> the ChatAnalysis field it copies from the chat's current window."""


class Insight(AnalysisColumns, Base):
    """Every ChatInsight received, once per (chat_id, window_id): the idempotency key.

    Its model outputs (sentiment, scores, summary, ...) are the AnalysisColumns.
    """

    __tablename__ = "insights"

    # sort_order: these first, then the AnalysisColumns (-1), then the rest, as in the baseline.
    id: Mapped[int] = mapped_column(Integer, primary_key=True, sort_order=-2)
    chat_id: Mapped[str] = mapped_column(ID, index=True, sort_order=-2)
    window_id: Mapped[str] = mapped_column(ID, sort_order=-2)
    message_id: Mapped[str | None] = mapped_column(String(128), sort_order=-2)
    model_id: Mapped[str] = mapped_column(String(200))
    prompt_version: Mapped[str] = mapped_column(String(64))
    published_at: Mapped[datetime] = mapped_column(UTCDateTime)
    analyzed_at: Mapped[datetime] = mapped_column(UTCDateTime)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_message_at: Mapped[datetime] = mapped_column(UTCDateTime)
    transcript: Mapped[list] = mapped_column(JSON)
    payload: Mapped[str] = mapped_column(Text)

    __table_args__ = (UniqueConstraint("chat_id", "window_id", name="uq_insights_chat_window"),)


class ErrorEvent(Base):
    """A dead letter from the pipeline, or a results message that was not a valid ChatInsight."""

    __tablename__ = "error_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    source: Mapped[str] = mapped_column(String(32))  # which subscription delivered it
    kind: Mapped[str] = mapped_column(String(32), index=True)  # dead_letter | invalid_insight | invalid_dead_letter
    message_id: Mapped[str | None] = mapped_column(String(128))
    stage: Mapped[str | None] = mapped_column(String(64))
    error_class: Mapped[str | None] = mapped_column(String(200))
    error_message: Mapped[str] = mapped_column(Text)
    chat_id: Mapped[str | None] = mapped_column(String(200), index=True)
    payload: Mapped[bytes] = mapped_column(LargeBinary)
    attributes: Mapped[dict] = mapped_column(JSON, default=dict)
    failed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    received_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)

    __table_args__ = (UniqueConstraint("source", "message_id", name="uq_error_events_message"),)


class AuditEntry(Base):
    """Who did what to which chat, with the state before and after: never updated or deleted."""

    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(String(64), index=True)
    action: Mapped[str] = mapped_column(String(32), index=True)
    chat_id: Mapped[str | None] = mapped_column(ID, index=True)
    window_id: Mapped[str | None] = mapped_column(ID)
    before: Mapped[dict | None] = mapped_column(JSON)
    after: Mapped[dict | None] = mapped_column(JSON)


class Macro(Base):
    """One reply macro of the team's library (`chatlens.contracts.ReplyMacro`), kept by supervisors.

    `position` is the library's order, in which the file the pipeline reads lists them.
    """

    __tablename__ = "reply_macros"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    position: Mapped[int] = mapped_column(Integer)
    title: Mapped[str] = mapped_column(Text)
    language: Mapped[str] = mapped_column(String(35))
    keywords: Mapped[str] = mapped_column(Text, default="")
    body: Mapped[str] = mapped_column(Text)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_by: Mapped[str | None] = mapped_column(String(64))  # None: as shipped (seeded by the migration)


class Feedback(Base):
    """A sentiment correction by a person: the labels `chatlens eval` learns from."""

    __tablename__ = "feedback"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    chat_id: Mapped[str] = mapped_column(ID, index=True)
    window_id: Mapped[str] = mapped_column(ID)
    predicted: Mapped[int] = mapped_column(Integer)
    corrected: Mapped[int] = mapped_column(Integer)
    actor: Mapped[str] = mapped_column(String(64))
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class User(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    username: Mapped[str] = mapped_column(String(64), unique=True)
    password_hash: Mapped[str] = mapped_column(String(255))
    role: Mapped[str] = mapped_column(String(16), default="agent")
    disabled: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_login_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class UserSession(Base):
    """A server-side login; the cookie holds a random token, the table only its keyed hash."""

    __tablename__ = "sessions"

    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    csrf_token: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    ip: Mapped[str | None] = mapped_column(String(64))


class LoginThrottle(Base):
    """Failed logins per key (username+IP, or IP alone) and the lockout they earned."""

    __tablename__ = "login_throttle"

    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    first_failure_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    locked_until: Mapped[datetime | None] = mapped_column(UTCDateTime)


class Event(Base):
    """Live-update outbox: written in the same transaction as the change it announces."""

    __tablename__ = "events"
    __table_args__ = {"sqlite_autoincrement": True}  # ids never reused: they are SSE event ids

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    kind: Mapped[str] = mapped_column(String(32))
    chat_id: Mapped[str | None] = mapped_column(ID)
    data: Mapped[dict] = mapped_column(JSON, default=dict)


class AppSecret(Base):
    """Generated secrets that every process sharing the database must agree on."""

    __tablename__ = "app_secrets"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(255))
