"""The message contracts of ChatLens, defined once and imported by `pipeline/` and `app/`.

Every message on a ChatLens Pub/Sub topic is one of these models serialised as JSON.
Validation is strict (unknown fields, wrong types and out-of-range values are rejected)
and limits reject with a reason; nothing is ever truncated silently. `parse_window` and
`parse_message` turn raw Pub/Sub bytes into a model or a `ContractError` whose message
is short enough to travel in a dead letter.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Any, Literal

import pydantic_core

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    model_validator,
)

SCHEMA_VERSION = 1

MAX_MESSAGE_TEXT_CHARS = 8_000
MAX_WINDOW_MESSAGES = 200
MAX_WINDOW_TEXT_BYTES = 64 * 1024
MAX_SUMMARY_CHARS = 512
MAX_REPLY_CHARS = 2_000
MAX_ERROR_CHARS = 2_000
MAX_MACRO_BODY_CHARS = 1_000  # a reply macro's text: a draft's next step, well within MAX_REPLY_CHARS
MAX_LIBRARY_MACROS = 2_000
REFERENCE_PLACEHOLDER = "{reference}"  # in a macro's body: the order, parcel or booking code the customer gave
MAX_PAYLOAD_BYTES = 10 * 1024 * 1024  # Pub/Sub's own message size limit.
CLOSED_ATTRIBUTE = "closed"
"""Pub/Sub attribute of a ChatMessage: `closed=true` on the last message of a chat ends it."""

Identifier = Annotated[
    str, StringConstraints(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:@-]*$")
]
"""Ids travel in Pub/Sub attributes, URLs and database keys: keep them plain ASCII."""

LanguageTag = Annotated[str, StringConstraints(pattern=r"^[a-z]{2,3}(-[A-Za-z0-9]{2,8})*$")]


Sender = Literal["customer", "agent", "bot"]
Sentiment = Literal[-1, 0, 1]
"""-1 negative (angry, unhappy), 0 neutral, 1 positive (happy)."""
SENTIMENT_LABELS: dict[int, str] = {-1: "negative", 0: "neutral", 1: "positive"}


class _Contract(BaseModel):
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        frozen=True,
        ser_json_bytes="base64",
        val_json_bytes="base64",
    )


class ChatMessage(_Contract):
    """One message of a chat; the input of the message-stream mode."""

    schema_version: Literal[1] = SCHEMA_VERSION
    chat_id: Identifier
    message_id: Identifier
    sender: Sender
    user_id: Identifier
    text: Annotated[str, StringConstraints(max_length=MAX_MESSAGE_TEXT_CHARS)]
    sent_at: AwareDatetime


class ChatWindow(_Contract):
    """A chat (or the part of it seen so far) to analyse: the main pipeline input."""

    schema_version: Literal[1] = SCHEMA_VERSION
    chat_id: Identifier
    window_id: Identifier
    tenant: Identifier | None = None
    language: LanguageTag | None = None
    customer_id: Identifier
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_WINDOW_MESSAGES)]
    closed: bool = False

    @model_validator(mode="after")
    def _check_messages(self) -> ChatWindow:
        for index, message in enumerate(self.messages):
            if message.chat_id != self.chat_id:
                raise ValueError(
                    f"messages[{index}] belongs to chat {message.chat_id!r}, not {self.chat_id!r}"
                )
            if index and message.sent_at < self.messages[index - 1].sent_at:
                raise ValueError(f"messages[{index}] is older than the message before it")
        size = sum(len(m.text.encode("utf-8")) for m in self.messages)
        if size > MAX_WINDOW_TEXT_BYTES:
            raise ValueError(f"chat text is {size} bytes, more than the {MAX_WINDOW_TEXT_BYTES} allowed")
        if not any(m.text.strip() for m in self.messages):
            raise ValueError("chat has no text to analyse")
        return self

    @property
    def text_chars(self) -> int:
        """Characters of the chat's text: what chats of similar work are grouped by."""
        return sum(len(m.text) for m in self.messages)


class SentimentScores(_Contract):
    """Calibrated probability of each sentiment label; they sum to 1."""

    negative: Annotated[float, Field(ge=0.0, le=1.0)]
    neutral: Annotated[float, Field(ge=0.0, le=1.0)]
    positive: Annotated[float, Field(ge=0.0, le=1.0)]

    @model_validator(mode="after")
    def _check_sum(self) -> SentimentScores:
        total = self.negative + self.neutral + self.positive
        if abs(total - 1.0) > 1e-3:
            raise ValueError(f"sentiment probabilities sum to {total:.4f}, not 1")
        return self

    def label(self) -> Sentiment:
        """The most probable sentiment (ties go to the more negative label: escalate, don't hide)."""
        ranked = {-1: self.negative, 0: self.neutral, 1: self.positive}
        return max(ranked, key=ranked.__getitem__)


class ChatAnalysis(_Contract):
    """What the model concluded about one chat window: the outputs a ChatInsight carries.

    Declared once, here: the dashboard derives its `insights` columns, what ingest stores and
    the chat-detail API from these fields, so a new output needs only this field, a dashboard
    migration and the prompt/model side.
    """

    sentiment: Sentiment
    confidence: Annotated[float, Field(ge=0.0, le=1.0)]
    scores: SentimentScores
    summary: Annotated[str, StringConstraints(min_length=1, max_length=MAX_SUMMARY_CHARS)]
    reply_draft: Annotated[str, StringConstraints(min_length=1, max_length=MAX_REPLY_CHARS)] | None
    flags: list[Annotated[str, StringConstraints(max_length=64)]] = Field(default_factory=list, max_length=16)
    # How sure the model was of its summary and of its reply (the geometric mean probability of their
    # tokens; for a reply from the reply library, flag "reply_from_library", the picker's confidence in
    # its macro), None where the model measures none. A reply it was unsure of is not offered: `reply_draft`
    # is None, flag "draft_withheld"; an unsure summary is flagged "summary_unsure". A chat an agent has
    # answered gets no draft where the policy says so (flag "agent_answered").
    summary_confidence: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    reply_confidence: Annotated[float, Field(ge=0.0, le=1.0)] | None = None

    @model_validator(mode="after")
    def _check_sentiment(self) -> ChatAnalysis:
        if self.scores.label() != self.sentiment:
            raise ValueError("sentiment must be the label with the highest probability")
        return self


ANALYSIS_FIELDS: tuple[str, ...] = tuple(ChatAnalysis.model_fields)
"""The names of the model outputs, in declaration order."""


class _InsightWindow(_Contract):
    # A base of its own so that these fields come before the analysis in ChatInsight
    # (pydantic orders fields base by base): its JSON and JSON Schema stay as they were.
    schema_version: Literal[1] = SCHEMA_VERSION
    chat_id: Identifier
    window_id: Identifier
    tenant: Identifier | None = None
    language: LanguageTag | None = None
    customer_id: Identifier
    closed: bool = False


class ChatInsight(ChatAnalysis, _InsightWindow):
    """What ChatLens concluded about one chat window: published to the results topic."""

    model_id: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    prompt_version: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    published_at: AwareDatetime
    analyzed_at: AwareDatetime
    transcript: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_WINDOW_MESSAGES)]


def shorten_error(message: str) -> str:
    """An error message that fits a DeadLetter, visibly cut when it had to be."""
    return message if len(message) <= MAX_ERROR_CHARS else message[: MAX_ERROR_CHARS - 15] + " … (shortened)"


class DeadLetter(_Contract):
    """A message ChatLens could not analyse, with the reason: nothing read is ever lost."""

    schema_version: Literal[1] = SCHEMA_VERSION
    payload: Annotated[bytes, Field(max_length=MAX_PAYLOAD_BYTES)]
    attributes: dict[str, str] = Field(default_factory=dict)
    stage: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    error_class: Annotated[str, StringConstraints(min_length=1, max_length=200)]
    error_message: Annotated[str, StringConstraints(max_length=MAX_ERROR_CHARS)]
    chat_id: str | None = None
    failed_at: AwareDatetime

    @classmethod
    def from_exception(
        cls, payload: bytes, stage: str, error: BaseException, attributes: dict[str, str] | None = None,
        chat_id: str | None = None,
    ) -> DeadLetter:
        return cls(
            payload=payload,
            attributes=dict(attributes or {}),
            stage=stage,
            error_class=type(error).__name__,
            error_message=shorten_error(str(error)),
            chat_id=chat_id,
            failed_at=datetime.now(timezone.utc),
        )


class ReplyMacro(_Contract):
    """One entry of the team's reply library: a reply an agent may send, in one language.

    Supervisors keep the library in the dashboard; the pipeline drafts a negative chat's reply
    by picking one (pipeline/model/decoding/macros.py): a reply written by the team cannot invent
    a refund or claim an action nobody took. `keywords` say when it fits, in its language;
    `{reference}` in the body stands for the order, booking or ticket code the customer gave, and
    a macro using it is picked only for chats that have one.
    """

    title: Annotated[str, StringConstraints(min_length=1, max_length=120)]
    language: LanguageTag
    keywords: Annotated[str, StringConstraints(max_length=1_000)] = ""
    body: Annotated[str, StringConstraints(min_length=1, max_length=MAX_MACRO_BODY_CHARS)]


class ReplyLibrary(_Contract):
    """The team's reply macros, all languages: what the dashboard writes and the pipeline reads."""

    schema_version: Literal[1] = SCHEMA_VERSION
    macros: Annotated[list[ReplyMacro], Field(max_length=MAX_LIBRARY_MACROS)]


CONTRACTS: dict[str, type[_Contract]] = {
    "chat_message": ChatMessage,
    "chat_window": ChatWindow,
    "chat_insight": ChatInsight,
    "dead_letter": DeadLetter,
    "reply_library": ReplyLibrary,
}


class ContractError(ValueError):
    """Raw input that is not a valid contract message; the message says why, briefly."""


def describe_validation_error(error: ValidationError, limit: int = 5) -> str:
    """One line per problem, with the field path: readable in a dead letter and a log."""
    problems = []
    for item in error.errors(include_url=False)[:limit]:
        where = ".".join(str(part) for part in item["loc"]) or "message"
        problems.append(f"{where}: {item['msg']}")
    more = error.error_count() - limit
    if more > 0:
        problems.append(f"and {more} more problem(s)")
    return "; ".join(problems)


def _json_problem(error: ValidationError) -> str | None:
    """The reason a payload is no JSON at all (pydantic's `json_invalid`), else None."""
    for item in error.errors(include_url=False):
        if item["type"] == "json_invalid":
            reason = str((item.get("ctx") or {}).get("error") or item["msg"])
            if "recursion limit" in reason:
                return f"JSON nested too deeply ({reason})"
            return f"not JSON: {reason}"
    return None


def _parse(model: type[_Contract], data: bytes | str) -> _Contract:
    """Bytes from anywhere -> `model`, or a ContractError: nothing else escapes, whatever the bytes.

    The JSON is read once, by pydantic's parser, which keeps its own bound on nesting
    (200 levels): `[` * 100 000 is a reason, not a RecursionError, and the bound does not
    depend on how deep the caller's stack already is.
    """
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    if len(raw) > MAX_PAYLOAD_BYTES:
        raise ContractError(f"payload is {len(raw)} bytes, more than {MAX_PAYLOAD_BYTES}")
    try:
        return model.model_validate_json(raw)
    except ValidationError as error:
        reason = _json_problem(error) or f"not a valid {model.__name__}: {describe_validation_error(error)}"
        raise ContractError(reason) from None
    except Exception as error:  # noqa: BLE001 - untrusted input: whatever it provokes is a reason, not a crash
        raise ContractError(f"could not be read ({type(error).__name__}: {error})") from None


def json_object(data: bytes | str) -> dict[str, Any] | None:
    """The JSON object `data` holds, or None when it holds none: never raises, whatever the bytes
    (for peeking at an invalid payload, e.g. for the chat_id it claims)."""
    try:
        value = pydantic_core.from_json(data, allow_inf_nan=False)
    except Exception:  # noqa: BLE001 - not JSON, nested too deeply, a number out of range, ...
        return None
    return value if isinstance(value, dict) else None


def parse_window(data: bytes | str) -> ChatWindow:
    return _parse(ChatWindow, data)  # type: ignore[return-value]


def parse_message(data: bytes | str) -> ChatMessage:
    return _parse(ChatMessage, data)  # type: ignore[return-value]


def to_json_bytes(model: BaseModel) -> bytes:
    return model.model_dump_json().encode("utf-8")
