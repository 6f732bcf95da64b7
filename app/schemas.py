"""Shapes of the JSON API (and of what templates get): built from ORM rows, never the reverse.

Sentiments travel as names ("negative"), not the -1/0/1 the database sorts by.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, create_model

from app import sentiments
from app.security import MAX_PASSWORD_CHARS
from app.crud.errors import PREVIEW_CHARS, ErrorRow
from app.models import CHAT_WINDOW_COPY, AuditEntry, Chat, Insight, Macro
from chatlens.contracts import ANALYSIS_FIELDS, MAX_REPLY_CHARS, REFERENCE_PLACEHOLDER, ChatAnalysis

SentimentName = Literal["negative", "neutral", "positive"]


def sentiment_name(value: int | None) -> SentimentName | None:
    return None if value is None else sentiments.name(value)  # type: ignore[return-value]


class ChatSummary(BaseModel):
    """One queue row."""

    chat_id: str
    tenant: str | None
    customer_id: str
    language: str | None
    closed: bool
    window_id: str
    sentiment: SentimentName
    predicted_sentiment: SentimentName
    confidence: float
    summary: str
    status: str
    assignee: str | None
    waiting_since: datetime
    updated_at: datetime
    updated_by: str | None
    version: int
    has_draft: bool
    draft_edited: bool

    @classmethod
    def of(cls, chat: Chat) -> ChatSummary:
        return cls(
            chat_id=chat.chat_id, tenant=chat.tenant, customer_id=chat.customer_id,
            language=chat.language, closed=chat.closed, window_id=chat.window_id,
            sentiment=sentiment_name(chat.effective_sentiment),
            predicted_sentiment=sentiment_name(chat.sentiment), confidence=chat.confidence,
            summary=chat.summary, status=chat.status, assignee=chat.assignee,
            waiting_since=chat.waiting_since, updated_at=chat.updated_at, updated_by=chat.updated_by,
            version=chat.version, has_draft=bool(chat.draft), draft_edited=chat.draft_edited,
        )


class TranscriptMessage(BaseModel):
    message_id: str
    sender: str
    user_id: str
    text: str
    sent_at: datetime


class _ChatReview(ChatSummary):
    # Split from ChatDetail only to keep its JSON's key order: review state, then the outputs.
    draft: str | None
    reject_reason: str | None
    corrected_sentiment: SentimentName | None


WINDOW_OUTPUTS = tuple(name for name in ANALYSIS_FIELDS if name not in CHAT_WINDOW_COPY.values())
"""The model outputs the chat row does not copy: the detail reads them from the window's insight."""

# Typed as the contract types them, or null: a window stored before an output existed has none.
_ChatOutputs = create_model("_ChatOutputs", __base__=_ChatReview, __module__=__name__, **{
    name: (ChatAnalysis.model_fields[name].annotation | None, ...) for name in WINDOW_OUTPUTS})


# Every model output is in it: the chat row's copies (ChatSummary, `draft`) and the window's
# WINDOW_OUTPUTS, so an output added to the contract is shown without a change here.
class ChatDetail(_ChatOutputs):
    """A chat with its current window: what the review pane shows."""

    model_id: str | None
    prompt_version: str | None
    analyzed_at: datetime | None
    published_at: datetime | None
    windows_seen: int
    transcript: list[TranscriptMessage]

    @classmethod
    def of_chat(cls, chat: Chat, insight: Insight | None) -> ChatDetail:
        base = ChatSummary.of(chat).model_dump()
        window = {name: getattr(insight, name) if insight else None
                  for name in (*WINDOW_OUTPUTS, "model_id", "prompt_version", "analyzed_at", "published_at")}
        return cls(
            **base, **window, draft=chat.draft, reject_reason=chat.reject_reason,
            corrected_sentiment=sentiment_name(chat.corrected_sentiment), windows_seen=chat.windows_seen,
            transcript=[TranscriptMessage.model_validate(m) for m in (insight.transcript if insight else [])],
        )


class QueueOut(BaseModel):
    items: list[ChatSummary]
    total: int
    counts: dict[str, int] = Field(description="Chats per sentiment under the other filters.")


class DraftIn(BaseModel):
    text: str = Field(min_length=1, max_length=MAX_REPLY_CHARS)
    version: int = Field(description="The version you edited; a newer one on the server gives 409.")


class ApproveIn(BaseModel):
    version: int
    text: str | None = Field(None, max_length=MAX_REPLY_CHARS, description="Save this text, then approve.")


class RejectIn(BaseModel):
    version: int
    reason: str = Field(min_length=1, max_length=500)


class AssignIn(BaseModel):
    assignee: str | None = Field(description='A username, "me", or null for nobody.')


class SentimentIn(BaseModel):
    corrected: SentimentName


class ConflictOut(BaseModel):
    detail: str
    current: ChatDetail


class LoginIn(BaseModel):
    username: str = Field(min_length=1, max_length=64)
    password: str = Field(min_length=1, max_length=MAX_PASSWORD_CHARS)


class SessionOut(BaseModel):
    username: str
    role: str
    csrf_token: str = Field(description="Send as the X-CSRF-Token header on every change.")


class AuditOut(BaseModel):
    id: int
    at: datetime
    actor: str
    action: str
    chat_id: str | None
    window_id: str | None
    before: dict[str, Any] | None
    after: dict[str, Any] | None

    @classmethod
    def of(cls, entry: AuditEntry) -> AuditOut:
        return cls.model_validate(entry, from_attributes=True)

    def changes(self) -> list[tuple[str, Any, Any]]:
        """(field, before, after) for each field the action changed (the version aside)."""
        before, after = self.before or {}, self.after or {}
        keys = [k for k in {**before, **after} if k != "version"]
        return [(k, before.get(k), after.get(k)) for k in keys if before.get(k) != after.get(k)]


class ErrorOut(BaseModel):
    id: int
    source: str
    kind: str
    message_id: str | None
    stage: str | None
    error_class: str | None
    error_message: str
    chat_id: str | None
    attributes: dict[str, str]
    failed_at: datetime | None
    received_at: datetime
    payload_preview: str = Field(description="The payload as text, cut at 2,000 characters.")
    payload_bytes: int

    @classmethod
    def of(cls, row: ErrorRow) -> ErrorOut:
        e = row.event
        text = row.payload_head.decode("utf-8", errors="replace")
        # PREVIEW_BYTES hold at least PREVIEW_CHARS characters: a shorter text is the whole payload.
        cut = len(text) > PREVIEW_CHARS or row.payload_bytes > len(row.payload_head)
        return cls(
            id=e.id, source=e.source, kind=e.kind, message_id=e.message_id, stage=e.stage,
            error_class=e.error_class, error_message=e.error_message, chat_id=e.chat_id,
            attributes={str(k): str(v) for k, v in (e.attributes or {}).items()},
            failed_at=e.failed_at, received_at=e.received_at,
            payload_preview=text[:PREVIEW_CHARS] + (" …" if cut else ""),
            payload_bytes=row.payload_bytes,
        )


class MacroOut(BaseModel):
    """A reply macro as the library page shows it: the contract's fields and who changed it last."""

    id: int
    title: str
    language: str
    keywords: str
    body: str
    updated_at: datetime
    updated_by: str | None = Field(description="null: as ChatLens shipped it")

    @classmethod
    def of(cls, macro: Macro) -> MacroOut:
        return cls.model_validate(macro, from_attributes=True)

    @property
    def uses_reference(self) -> bool:
        """Whether the text has `{reference}`: then it is picked only for chats that gave one."""
        return REFERENCE_PLACEHOLDER in self.body
