"""The transforms of the ChatLens pipeline, and the Pub/Sub I/O around them.

    windows mode:  Envelope ─ ValidateWindows ──────────────┐
    messages mode: Envelope ─ ValidateMessages ─ Sessionize ─┴─ DeduplicateWindows ─ AnalyzeWindows ─► insights
                   invalid input ──────────────────────────────► dead letters (stage "validate")
                   duplicates ─────────────────────────────────► settled (acknowledged, no output)
                   model and post-processing failures ─────────► dead letters ("inference", "postprocess")

- An `Envelope` is one raw input message (bytes, attributes, publish time, Pub/Sub id).
- `Origin` travels with a ChatWindow through the model stages as the RunInference key:
  what the insight and a dead letter need (payload, attributes, publish time) and the
  ids of the input messages the outcome settles (`source_ids`, acknowledged once the
  outcome is published).
- Every stage ends in an `Output`: a ChatInsight or a DeadLetter, its Pub/Sub
  attributes, and the source ids it settles. Nothing read is dropped without one,
  except duplicates, which settle their source ids without a new output (and early
  session firings that are not a valid window yet: a later firing covers them).

`AnalyzeChats` is the whole graph between reading and publishing; `chatlens pipeline`
(streaming.py) puts Pub/Sub around it (`read_from_pubsub`, `PublishFn`, `Leases`),
`chatlens analyze` (batch.py) files.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.coders import coders
from apache_beam.io.gcp.pubsub import PubsubMessage
from apache_beam.metrics import Metrics
from apache_beam.runners.direct.direct_runner import _DirectReadFromPubSub
from apache_beam.runners.direct.transform_evaluator import TransformEvaluatorRegistry, _PubSubReadEvaluator
from apache_beam import typehints
from apache_beam.transforms import trigger as triggers
from apache_beam.transforms import userstate, window
from apache_beam.utils.timestamp import Duration, Timestamp
from apache_beam.utils.windowed_value import PaneInfoTiming

from chatlens.contracts import (
    CLOSED_ATTRIBUTE,
    MAX_ERROR_CHARS,
    MAX_PAYLOAD_BYTES,
    MAX_WINDOW_MESSAGES,
    MAX_WINDOW_TEXT_BYTES,
    SCHEMA_VERSION,
    ChatInsight,
    ChatMessage,
    ChatWindow,
    ContractError,
    SENTIMENT_LABELS,
    DeadLetter,
    SentimentScores,
    describe_validation_error,
    parse_message,
    parse_window,
    to_json_bytes,
)
from pipeline.model.stages import ModelStage

log = logging.getLogger(__name__)

NAMESPACE = "chatlens"
DEAD_LETTER = "dead_letter"
SETTLED = "settled"
MAX_FLAGS = 16
# A DeadLetter's JSON must fit in one Pub/Sub message: base64 grows the payload by a third.
MAX_DEAD_LETTER_PAYLOAD = (MAX_PAYLOAD_BYTES - 512 * 1024) * 3 // 4 - MAX_ERROR_CHARS * 4


class LocalStats:
    """The chatlens metrics as plain in-process totals, for progress on the local runners.

    Beam's BundleBasedDirectRunner only reports each step's first bundle in streaming
    (its StateSampler caches the ScopedState, and with it the first bundle's
    MetricsContainer), so `chatlens pipeline`'s progress lines and `chatlens analyze`'s
    progress bar read these instead. Everything runs in one process there; on other
    runners these are per-worker and unused, and Beam's metrics are the real ones.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._distributions: dict[str, list[int]] = {}  # name -> [count, sum, min, max]

    def inc(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + n

    def update(self, name: str, value: int) -> None:
        with self._lock:
            d = self._distributions.get(name)
            if d is None:
                self._distributions[name] = [1, value, value, value]
            else:
                d[0] += 1
                d[1] += value
                d[2] = min(d[2], value)
                d[3] = max(d[3], value)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def distribution(self, name: str) -> tuple[int, int, int, int] | None:
        """(count, mean, min, max), or None when nothing was recorded."""
        with self._lock:
            d = self._distributions.get(name)
            return (d[0], d[1] // d[0], d[2], d[3]) if d else None

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()
            self._distributions.clear()


STATS = LocalStats()


class _Counter:
    """A Beam counter in the chatlens namespace that also counts in STATS."""

    def __init__(self, name: str):
        self.name = name
        self._metric = Metrics.counter(NAMESPACE, name)

    def inc(self, n: int = 1) -> None:
        self._metric.inc(n)
        STATS.inc(self.name, n)


class _Distribution:
    def __init__(self, name: str):
        self.name = name
        self._metric = Metrics.distribution(NAMESPACE, name)

    def update(self, value: int) -> None:
        self._metric.update(value)
        STATS.update(self.name, value)


def _counter(name: str) -> _Counter:
    return _Counter(name)


def _distribution(name: str) -> _Distribution:
    return _Distribution(name)


def utc(value: datetime | Timestamp | float) -> datetime:
    if isinstance(value, Timestamp):
        return value.to_utc_datetime(has_tz=True)
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value, timezone.utc)
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return datetime.fromtimestamp(value.timestamp(), timezone.utc)  # plain datetime, e.g. from a protobuf one


# ---- values ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Envelope:
    """One raw input message as read: nothing parsed yet."""

    data: bytes
    attributes: dict[str, str] = field(default_factory=dict)
    published_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    source_id: str | None = None  # the Pub/Sub message id; None when not read from Pub/Sub

    @classmethod
    def from_pubsub(cls, message: Any, timestamp: Timestamp) -> Envelope:
        """From Beam's PubsubMessage; the publish time, else the element's event time."""
        published = getattr(message, "publish_time", None)
        data = message.data if isinstance(message.data, bytes) else bytes(message.data or b"")
        return cls(
            data=data,
            attributes={str(k): str(v) for k, v in (message.attributes or {}).items()},
            published_at=utc(published) if published else utc(timestamp),
            source_id=getattr(message, "message_id", None) or None,
        )


@dataclass(frozen=True)
class Origin:
    """Where a window came from; the RunInference key that carries it through the model."""

    chat_id: str
    window_id: str
    payload: bytes
    attributes: dict[str, str]
    published_at: datetime
    source_ids: tuple[str, ...] = ()
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Output:
    """A ChatInsight or DeadLetter to publish, its attributes, and the inputs it settles."""

    message: ChatInsight | DeadLetter
    attributes: dict[str, str]
    source_ids: tuple[str, ...] = ()

    @property
    def data(self) -> bytes:
        return to_json_bytes(self.message)

    @property
    def is_insight(self) -> bool:
        return isinstance(self.message, ChatInsight)


@dataclass(frozen=True)
class MessageEvent:
    """Messages mode: one valid ChatMessage and what its input message carried."""

    message: ChatMessage
    payload: bytes
    attributes: dict[str, str]
    published_at: datetime
    source_id: str | None
    closed: bool = False


# ---- dead letters ------------------------------------------------------------------------
def claimed_chat_id(data: bytes) -> str | None:
    """The chat_id an invalid payload claims, when it is readable (for routing the dead letter)."""
    try:
        value = json.loads(data).get("chat_id")
    except (ValueError, AttributeError, UnicodeDecodeError):
        return None
    return value if isinstance(value, str) and 0 < len(value) <= 128 and value.isprintable() else None


def dead_letter(
    payload: bytes, stage: str, error_class: str, error_message: str, *, attributes: dict[str, str] | None = None,
    chat_id: str | None = None, source_ids: Iterable[str | None] = (), published_at: datetime | None = None,
) -> Output:
    """A DeadLetter Output; counted per stage. Payloads too large to republish are cut, saying so."""
    if len(payload) > MAX_DEAD_LETTER_PAYLOAD:
        error_message = f"{error_message} (payload cut from {len(payload)} to {MAX_DEAD_LETTER_PAYLOAD} bytes)"
        payload = payload[:MAX_DEAD_LETTER_PAYLOAD]
    if len(error_message) > MAX_ERROR_CHARS:
        error_message = error_message[: MAX_ERROR_CHARS - 15] + " … (shortened)"
    letter = DeadLetter(
        payload=payload,
        attributes=dict(attributes or {}),
        stage=stage,
        error_class=error_class[:200] or "Error",
        error_message=error_message,
        chat_id=chat_id,
        failed_at=datetime.now(timezone.utc),
    )
    _counter(f"dead_letters_{stage}").inc()
    sources = tuple(s for s in source_ids if s)
    out_attributes = {"stage": stage, "error_class": letter.error_class, "schema_version": str(SCHEMA_VERSION)}
    if chat_id:
        out_attributes["chat_id"] = chat_id
    if sources:
        out_attributes["source_key"] = source_key(sources, published_at)
    return Output(letter, out_attributes, sources)


def source_key(source_ids: Iterable[str], published_at: datetime | None = None) -> str:
    """Which input(s) a dead letter stands for, as its `source_key` attribute: their message ids
    and the (newest) publish time, e.g. '17@2026-11-20T09:00:01.250000+00:00'.

    A pipeline that dies between publishing a dead letter and acknowledging its input
    publishes it again after the redelivery, as a new Pub/Sub message; the dashboard keys
    dead letters on this attribute, so the two are one row. The publish time keeps it
    unique when a restarted local Pub/Sub server numbers messages from 1 again. Long
    keys are digested (attribute values are limited to 1024 bytes).
    """
    key = ",".join(sorted(source_ids)) + (f"@{utc(published_at).isoformat()}" if published_at else "")
    return key if len(key) <= 256 else "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def exception_dead_letter(payload: bytes, stage: str, error: BaseException, **kwargs) -> Output:
    return dead_letter(payload, stage, type(error).__name__, str(error), **kwargs)


def failed_batch_dead_letters(failure: tuple[Sequence[Any], tuple], stage: str) -> Iterable[Output]:
    """RunInference's failed batches ((batch, (exception type, repr, traceback))) as dead letters.

    Batch elements are (route, (origin, example)), as AnalyzeWindows keys them."""
    batch, (error_type, error_repr, _traceback) = failure
    name = getattr(error_type, "__name__", str(error_type))
    log.warning("%s failed for a batch of %d window(s): %s", stage, len(batch), error_repr)
    for _route, (origin, _example) in batch:
        yield dead_letter(origin.payload, stage, name, error_repr, attributes=origin.attributes,
                          chat_id=origin.chat_id, source_ids=origin.source_ids, published_at=origin.published_at)


# ---- windows mode ------------------------------------------------------------------------
class ValidateWindows(beam.PTransform):
    """Envelopes -> (Origin, ChatWindow); invalid ones -> the `dead_letter` output (stage "validate")."""

    def expand(self, envelopes):
        return envelopes | beam.ParDo(_ValidateWindowFn()).with_outputs(DEAD_LETTER, main="windows")


class _ValidateWindowFn(beam.DoFn):
    def __init__(self):
        self.read = _counter("windows_read")
        self.valid = _counter("windows_valid")

    def process(self, envelope: Envelope):
        self.read.inc()
        try:
            chat = parse_window(envelope.data)
        except ContractError as error:
            yield pvalue.TaggedOutput(DEAD_LETTER, exception_dead_letter(
                envelope.data, "validate", error, attributes=envelope.attributes,
                chat_id=claimed_chat_id(envelope.data), source_ids=[envelope.source_id],
                published_at=envelope.published_at))
            return
        self.valid.inc()
        origin = Origin(chat.chat_id, chat.window_id, envelope.data, envelope.attributes, envelope.published_at,
                        tuple(s for s in [envelope.source_id] if s))
        yield origin, chat


# ---- messages mode -----------------------------------------------------------------------
def is_closing(attributes: dict[str, str]) -> bool:
    return attributes.get(CLOSED_ATTRIBUTE, "").strip().lower() in ("true", "1", "yes")


class ValidateMessages(beam.PTransform):
    """Envelopes -> (chat_id, MessageEvent) at the message's event time; invalid -> dead letters.

    A message published with `closed=true` is emitted `early_fire_count` times: the
    copies fill the session trigger's AfterCount at once, so a closed chat fires
    immediately on every runner without a custom trigger (the copies share a
    message_id and are dropped when the window is built). Messages so old that their
    session would already be past the allowed lateness are dead-lettered here rather
    than silently dropped by the GroupByKey.
    """

    def __init__(self, early_fire_count: int, session_gap_secs: int, allowed_lateness_secs: int, clock=time.time):
        super().__init__()
        self._copies = early_fire_count
        self._max_age = session_gap_secs + allowed_lateness_secs
        self._clock = clock

    def expand(self, envelopes):
        return envelopes | beam.ParDo(_ValidateMessageFn(self._copies, self._max_age, self._clock)).with_outputs(
            DEAD_LETTER, main="events")


class _ValidateMessageFn(beam.DoFn):
    def __init__(self, copies: int, max_age: int, clock):
        self._copies = copies
        self._max_age = max_age
        self._clock = clock
        self.read = _counter("messages_read")
        self.closed = _counter("chats_closed")

    def process(self, envelope: Envelope, timestamp=beam.DoFn.TimestampParam):
        self.read.inc()
        try:
            message = parse_message(envelope.data)
            if float(timestamp) + self._max_age < self._clock():
                raise ContractError(
                    f"message event time {utc(timestamp).isoformat()} is older than the session gap plus the "
                    f"allowed lateness ({self._max_age} s): its session is closed")
        except ContractError as error:
            yield pvalue.TaggedOutput(DEAD_LETTER, exception_dead_letter(
                envelope.data, "validate", error, attributes=envelope.attributes,
                chat_id=claimed_chat_id(envelope.data), source_ids=[envelope.source_id],
                published_at=envelope.published_at))
            return
        closed = is_closing(envelope.attributes)
        event = MessageEvent(message, envelope.data, envelope.attributes, envelope.published_at,
                             envelope.source_id, closed)
        if closed:
            self.closed.inc()
        for _ in range(self._copies if closed else 1):
            yield message.chat_id, event


def session_windowing(session_gap_secs: int, early_fire_count: int, early_fire_secs: int,
                      allowed_lateness_secs: int) -> beam.WindowInto:
    """Session windows per chat that fire early as the chat grows and again for late messages."""
    return beam.WindowInto(
        window.Sessions(session_gap_secs),
        trigger=triggers.AfterWatermark(
            early=triggers.AfterAny(triggers.AfterCount(early_fire_count),
                                    triggers.AfterProcessingTime(early_fire_secs)),
            late=triggers.AfterCount(1),
        ),
        accumulation_mode=triggers.AccumulationMode.ACCUMULATING,
        allowed_lateness=allowed_lateness_secs,
    )


def window_id_for(messages: Sequence[ChatMessage]) -> str:
    """Deterministic from the messages: first message time, count and a digest of their ids."""
    digest = hashlib.sha256("\n".join(m.message_id for m in messages).encode()).hexdigest()[:10]
    first = utc(messages[0].sent_at).strftime("%Y%m%dT%H%M%SZ")
    return f"s{first}-n{len(messages)}-{digest}"


def fit_window(messages: Sequence[ChatMessage]) -> tuple[list[ChatMessage], int]:
    """The newest messages that fit a ChatWindow's limits, and how many older ones were left out."""
    kept: list[ChatMessage] = []
    size = 0
    for message in reversed(messages):
        size += len(message.text.encode("utf-8"))
        if len(kept) == MAX_WINDOW_MESSAGES or size > MAX_WINDOW_TEXT_BYTES:
            break
        kept.append(message)
    kept.reverse()
    return kept, len(messages) - len(kept)


def build_session_window(chat_id: str, events: Iterable[MessageEvent]) -> tuple[Origin, ChatWindow]:
    """A ChatWindow from a session's messages: deduplicated by message_id, sorted by sent_at.

    tenant, language and customer_id come from the newest message attributes of those
    names, else customer_id is the first customer's user_id. Raises ContractError.
    """
    unique: dict[str, MessageEvent] = {}
    for event in events:
        current = unique.get(event.message.message_id)
        if current is None or event.published_at < current.published_at:
            unique[event.message.message_id] = event
    ordered = sorted(unique.values(), key=lambda e: (e.message.sent_at, e.message.message_id))
    messages, left_out = fit_window([e.message for e in ordered])
    attributes: dict[str, str] = {}
    for event in sorted(ordered, key=lambda e: e.published_at):
        attributes.update(event.attributes)
    customer_id = attributes.get("customer_id") or next(
        (m.user_id for m in messages if m.sender == "customer"), None)
    newest = max(ordered, key=lambda e: e.published_at)
    origin = Origin(
        chat_id=chat_id,
        window_id=window_id_for(messages),
        payload=b"\n".join(e.payload for e in ordered),
        attributes={k: v for k, v in newest.attributes.items()},
        published_at=newest.published_at,
        source_ids=tuple(sorted({e.source_id for e in ordered if e.source_id})),
        flags=(f"window_truncated:{left_out}",) if left_out else (),
    )
    if customer_id is None:
        raise ContractError("no customer message yet: the chat has no customer_id")
    try:
        chat = ChatWindow(
            chat_id=chat_id,
            window_id=origin.window_id,
            tenant=attributes.get("tenant"),
            language=attributes.get("language"),
            customer_id=customer_id,
            messages=messages,
            closed=any(e.closed for e in ordered),
        )
    except ValueError as error:  # pydantic's ValidationError is a ValueError
        reason = describe_validation_error(error) if hasattr(error, "errors") else str(error)
        raise _InvalidSession(origin, f"not a valid ChatWindow: {reason}") from None
    return origin, chat


class _InvalidSession(ContractError):
    def __init__(self, origin: Origin, message: str):
        super().__init__(message)
        self.origin = origin


class Sessionize(beam.PTransform):
    """(chat_id, MessageEvent) -> (Origin, ChatWindow) per firing, back in the global window.

    Session windows with a gap, early firings after N new messages or T seconds,
    ACCUMULATING (each firing has the whole chat so far) and a late firing per late
    message. A firing that cannot become a valid ChatWindow is dead-lettered (stage
    "validate") when it is the session's final say (on time, late or closed); an early
    one is skipped, since a later firing will cover its messages.
    """

    def __init__(self, session_gap_secs: int, early_fire_count: int, early_fire_secs: int,
                 allowed_lateness_secs: int):
        super().__init__()
        self._windowing = (session_gap_secs, early_fire_count, early_fire_secs, allowed_lateness_secs)

    def expand(self, events):
        windows = (
            events
            | "SessionWindows" >> session_windowing(*self._windowing)
            | "GroupByChat" >> beam.GroupByKey()
            | "BuildWindow" >> beam.ParDo(_BuildSessionWindowFn()).with_outputs(DEAD_LETTER, main="windows")
        )
        rewindowed = windows.windows | "GlobalWindow" >> beam.WindowInto(window.GlobalWindows())
        dead = windows[DEAD_LETTER] | "DeadLettersGlobalWindow" >> beam.WindowInto(window.GlobalWindows())
        return {"windows": rewindowed, DEAD_LETTER: dead}


class _BuildSessionWindowFn(beam.DoFn):
    def __init__(self):
        self.fired = _counter("session_firings")
        self.skipped = _counter("session_firings_skipped")
        self.windows = _counter("windows_read")
        self.sizes = _distribution("session_messages")

    def process(self, element, pane=beam.DoFn.PaneInfoParam):
        chat_id, events = element
        events = list(events)
        self.fired.inc()
        final = pane.timing in (PaneInfoTiming.ON_TIME, PaneInfoTiming.LATE) or any(e.closed for e in events)
        try:
            origin, chat = build_session_window(chat_id, events)
        except ContractError as error:
            if not final:
                self.skipped.inc()
                return
            origin = getattr(error, "origin", None)
            payload = origin.payload if origin else b"\n".join(e.payload for e in events)
            yield pvalue.TaggedOutput(DEAD_LETTER, exception_dead_letter(
                payload, "validate", error, attributes=events[-1].attributes, chat_id=chat_id,
                source_ids=[e.source_id for e in events], published_at=max(e.published_at for e in events)))
            return
        self.windows.inc()
        self.sizes.update(len(chat.messages))
        yield origin, chat


# ---- deduplication -----------------------------------------------------------------------
class DeduplicateWindows(beam.PTransform):
    """Drop windows whose (chat_id, window_id) was seen within the last `ttl_secs` of event time.

    A stateful DoFn keyed by "chat_id/window_id" (ids cannot contain '/'); an event-time
    timer at first sight + TTL forgets the key. Duplicates go to the `settled` output as
    the source ids they settle (acknowledged without a new result).
    """

    def __init__(self, ttl_secs: int):
        super().__init__()
        self._ttl = ttl_secs

    def expand(self, windows):
        return (
            windows
            | "KeyByWindow" >> beam.Map(lambda ow: (f"{ow[1].chat_id}/{ow[1].window_id}", ow))
            | "FirstSeen" >> beam.ParDo(_DedupFn(self._ttl)).with_outputs(SETTLED, main="windows")
        )


class _DedupFn(beam.DoFn):
    SEEN = userstate.ReadModifyWriteStateSpec("seen", coders.BooleanCoder())
    EXPIRY = userstate.TimerSpec("expiry", userstate.TimeDomain.WATERMARK)

    def __init__(self, ttl_secs: int):
        self._ttl = Duration(seconds=ttl_secs)
        self.dropped = _counter("duplicates_dropped")

    def process(self, element, timestamp=beam.DoFn.TimestampParam, seen=beam.DoFn.StateParam(SEEN),
                expiry=beam.DoFn.TimerParam(EXPIRY)):
        _key, (origin, chat) = element
        if seen.read():
            self.dropped.inc()
            log.info("dropping duplicate window %s/%s", chat.chat_id, chat.window_id)
            yield pvalue.TaggedOutput(SETTLED, origin.source_ids)
            return
        seen.write(True)
        expiry.set(timestamp + self._ttl)
        yield origin, chat

    @userstate.on_timer(EXPIRY)
    def forget(self, seen=beam.DoFn.StateParam(SEEN)):
        seen.clear()


# ---- model stages ------------------------------------------------------------------------
def build_insight(origin: Origin, chat: ChatWindow, analysis: Any, analyzed_at: datetime | None = None
                  ) -> ChatInsight:
    """A ChatInsight from a window and its WindowAnalysis (scores, summary, reply, flags)."""
    total = sum(float(s) for s in analysis.scores)
    negative, neutral, positive = (float(s) / total for s in analysis.scores)
    scores = SentimentScores(negative=negative, neutral=neutral, positive=positive)
    flags = list(dict.fromkeys([*origin.flags, *analysis.flags]))[:MAX_FLAGS]
    return ChatInsight(
        chat_id=chat.chat_id,
        window_id=chat.window_id,
        tenant=chat.tenant,
        language=chat.language,
        customer_id=chat.customer_id,
        closed=chat.closed,
        sentiment=scores.label(),
        confidence=max(negative, neutral, positive),
        scores=scores,
        summary=analysis.summary,
        reply_draft=analysis.reply_draft,
        flags=flags,
        model_id=analysis.model_id,
        prompt_version=analysis.prompt_version,
        published_at=origin.published_at,
        analyzed_at=analyzed_at or datetime.now(timezone.utc),
        transcript=list(chat.messages),
    )


def insight_attributes(insight: ChatInsight) -> dict[str, str]:
    attributes = {
        "chat_id": insight.chat_id,
        "window_id": insight.window_id,
        "sentiment": SENTIMENT_LABELS[insight.sentiment],
        "schema_version": str(insight.schema_version),
    }
    if insight.tenant:
        attributes["tenant"] = insight.tenant
    if insight.closed:
        attributes["closed"] = "true"
    return attributes


class _BuildInsightFn(beam.DoFn):
    def __init__(self):
        self.insights = _counter("insights")
        self.replies = _counter("reply_drafts")
        self.lag = _distribution("insight_lag_ms")
        self.by_sentiment = {value: _counter(f"insights_{name}") for value, name in SENTIMENT_LABELS.items()}

    def process(self, element):
        origin, chat, analysis = element
        try:
            insight = build_insight(origin, chat, analysis)
        except Exception as error:  # noqa: BLE001 - any failure here is the message's, not the pipeline's
            log.warning("post-processing %s/%s failed: %s", origin.chat_id, origin.window_id, error)
            yield pvalue.TaggedOutput(DEAD_LETTER, exception_dead_letter(
                origin.payload, "postprocess", error, attributes=origin.attributes, chat_id=origin.chat_id,
                source_ids=origin.source_ids, published_at=origin.published_at))
            return
        self.insights.inc()
        self.by_sentiment[insight.sentiment].inc()
        if insight.reply_draft:
            self.replies.inc()
        self.lag.update(int((insight.analyzed_at - insight.published_at).total_seconds() * 1000))
        yield Output(insight, insight_attributes(insight), origin.source_ids)


LENGTH_BUCKET_BOUNDARIES = (256, 1024, 4096, 16384)  # characters of chat text


class _KeyByWorkerAndLength(beam.DoFn):
    """(worker, length bucket) keys: a worker's chats of similar length batch together."""

    def setup(self):
        self.worker = uuid.uuid4().hex

    def process(self, element):
        _route, (_origin, chat) = element
        length = sum(len(m.text) for m in chat.messages)
        yield (self.worker, bisect.bisect_right(LENGTH_BUCKET_BOUNDARIES, length)), element


class BatchChats(beam.PTransform):
    """Streaming batches for the model: up to `size` chats of similar length from one worker, or
    what has waited `max_wait_secs`; RunInference takes each as one batch (the stage's handler
    is `prebatched`).

    Beam's own deadline batching (`BatchElements(max_batch_duration_secs=...)`) keys its state by
    an untyped tuple, whose coder is not deterministic (Beam warns; on Dataflow state can be
    mis-routed); these keys are typed, so their coder is deterministic.
    """

    def __init__(self, size: int, max_wait_secs: float):
        super().__init__()
        self._size = size
        self._max_wait_secs = max_wait_secs

    def expand(self, chats):
        key = typehints.Tuple[typehints.Tuple[str, int], typehints.Any]
        return (chats
                | "Key" >> beam.ParDo(_KeyByWorkerAndLength()).with_output_types(key)
                | "Group" >> beam.GroupIntoBatches(self._size, max_buffering_duration_secs=self._max_wait_secs)
                | "Batches" >> beam.Values())


class AnalyzeWindows(beam.PTransform):
    """(Origin, ChatWindow) -> ChatInsight Outputs, plus dead letters of the model stage.

    Reshuffle (spread the model work), then one RunInference through the shared model
    (`model_tag`): sentiment, summary and, for the chats the stage's `reply_for` selects, a
    reply draft (a tuned model does all three in one pass per chat), then the insight.
    Elements enter RunInference keyed by their model route (pipeline/model/stages.py) with
    the origin riding along in the example. Failed batches become dead letters of stage
    "inference", failed insights of stage "postprocess".
    """

    def __init__(self, stage: ModelStage, model_tag: str | None = None, resource_hints: dict[str, str] | None = None):
        super().__init__()
        self._stage = stage
        self._model_tag = model_tag
        self._hints = dict(resource_hints or {})
        if stage.kind != "gemma" and model_tag:
            self._model_tag = f"{model_tag}-{stage.kind}"  # never attach to a loaded Gemma

    def _run_inference(self):
        from apache_beam.ml.inference.base import RunInference

        transform = RunInference(self._stage.handler(), model_identifier=self._model_tag,
                                 **self._stage.run_inference_kwargs())
        if self._hints:
            transform = transform.with_resource_hints(**self._hints)
        return transform.with_exception_handling()

    def expand(self, windows):
        stage = self._stage

        def keyed(element):
            origin, chat = element
            return stage.route(chat), element

        def unpack(element):
            origin, chat = element[1].example
            return origin, chat, element[1].inference

        routed = windows | "Reshuffle" >> beam.Reshuffle() | "Route" >> beam.Map(keyed)
        if stage.prebatched:
            routed = routed | "Batch" >> BatchChats(stage.max_batch_size, stage.max_batch_duration_secs)
        analysed, failures = routed | "Analyze" >> self._run_inference()
        built = (analysed | "Unpack" >> beam.Map(unpack)
                 | "BuildInsight" >> beam.ParDo(_BuildInsightFn()).with_outputs(DEAD_LETTER, main="insights"))
        dead = [failures.failed_inferences | "AnalyzeFailed" >> beam.FlatMap(failed_batch_dead_letters, "inference"),
                built[DEAD_LETTER]]
        return {"insights": built.insights, DEAD_LETTER: dead | "ModelDeadLetters" >> beam.Flatten()}


class AnalyzeChats(beam.PTransform):
    """The ChatLens graph: Envelopes in; insights, dead letters and settled duplicates out.

    Returns a dict: "insights" and "dead_letter" (PCollections of Output), "settled"
    (tuples of source ids that need no output: duplicates).
    """

    def __init__(self, config: Any):
        super().__init__()
        self._config = config

    def expand(self, envelopes):
        config = self._config
        if config.mode == "windows":
            validated = envelopes | "ValidateWindows" >> ValidateWindows()
            windows, invalid = validated.windows, [validated[DEAD_LETTER]]
        elif config.mode == "messages":
            events = envelopes | "ValidateMessages" >> ValidateMessages(
                config.early_fire_count, config.session_gap_secs, config.allowed_lateness_secs)
            sessions = events.events | "Sessionize" >> Sessionize(
                config.session_gap_secs, config.early_fire_count, config.early_fire_secs,
                config.allowed_lateness_secs)
            windows, invalid = sessions["windows"], [events[DEAD_LETTER], sessions[DEAD_LETTER]]
        else:
            raise ValueError(f"mode must be windows or messages, not {config.mode!r}")
        fresh = windows | "Deduplicate" >> DeduplicateWindows(config.dedup_ttl_secs)
        analysed = fresh.windows | "AnalyzeWindows" >> AnalyzeWindows(
            config.model_stage_settings(), config.model_tag, config.model_resource_hints())
        dead = [*invalid, analysed[DEAD_LETTER]] | "DeadLetters" >> beam.Flatten()
        return {"insights": analysed["insights"], DEAD_LETTER: dead, SETTLED: fresh[SETTLED]}


# ---- Pub/Sub I/O -------------------------------------------------------------------------
LEASE_SECONDS = 60
LEASE_RENEW_EVERY = 15.0
PULL_BATCH = 10
PULL_TIMEOUT = 5.0


class Leases:
    """Input messages read but not yet settled, kept leased until their outcome is published.

    Beam's DirectRunner acknowledges Pub/Sub messages as soon as it pulls them, so a stop
    would lose whatever was in flight. `LocalPubSubRead` pulls without acknowledging and
    registers each message here; `PublishFn` acknowledges the source messages of an
    insight or dead letter only after Pub/Sub confirmed the publish. Until then a thread
    renews the leases. On shutdown, `release_all` hands unsettled messages back
    (deadline 0) so that the next run gets them at once: at-least-once delivery.
    On other runners nothing is registered and `settle` does nothing: the runner
    acknowledges once its checkpoint holds the message.
    """

    def __init__(self, lease_seconds: int = LEASE_SECONDS):
        self.lease_seconds = lease_seconds
        self._lock = threading.Lock()
        self._held: dict[str, tuple[str, str]] = {}  # Pub/Sub message id -> (subscription, ack id)
        self._client = None
        self._renewer: threading.Thread | None = None
        self._stopped = threading.Event()

    def _subscriber(self):
        with self._lock:
            if self._client is None:
                from google.cloud import pubsub_v1

                self._client = pubsub_v1.SubscriberClient()
            return self._client

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def hold(self, subscription: str, received: Iterable[tuple[str, str]]) -> None:
        """Lease (message id, ack id) pairs just pulled from `subscription`."""
        received = list(received)
        if not received:
            return
        if self._stopped.is_set():  # pulled while stopping: straight back to Pub/Sub
            self._modify(subscription, [ack_id for _, ack_id in received], 0)
            return
        with self._lock:
            for message_id, ack_id in received:
                self._held[message_id] = (subscription, ack_id)
        self._modify(subscription, [ack_id for _, ack_id in received], self.lease_seconds)
        self._start_renewer()

    def settle(self, message_ids: Iterable[str]) -> int:
        """Acknowledge these messages (ids not held are ignored); returns how many were held."""
        by_subscription: dict[str, list[str]] = {}
        message_ids = list(message_ids)
        with self._lock:
            for message_id in message_ids:
                held = self._held.pop(message_id, None)
                if held:
                    by_subscription.setdefault(held[0], []).append(held[1])
        log.debug("settling %s: %d held", message_ids, sum(map(len, by_subscription.values())))
        for subscription, ack_ids in by_subscription.items():
            for start in range(0, len(ack_ids), 1000):
                try:
                    self._subscriber().acknowledge(subscription=subscription, ack_ids=ack_ids[start:start + 1000])
                except Exception as error:  # noqa: BLE001 - the outcome is out; failing the bundle would resend it
                    log.warning("could not acknowledge %d message(s) (%s): Pub/Sub redelivers them and their "
                                "outcomes are published again", len(ack_ids[start:start + 1000]), error)
        return sum(map(len, by_subscription.values()))

    def release_all(self) -> int:
        """Hand every unsettled message back to Pub/Sub for immediate redelivery."""
        self._stopped.set()
        with self._lock:
            held, self._held = self._held, {}
        by_subscription: dict[str, list[str]] = {}
        for subscription, ack_id in held.values():
            by_subscription.setdefault(subscription, []).append(ack_id)
        for subscription, ack_ids in by_subscription.items():
            self._modify(subscription, ack_ids, 0)
        return len(held)

    def _modify(self, subscription: str, ack_ids: list[str], seconds: int) -> None:
        for start in range(0, len(ack_ids), 1000):
            try:
                self._subscriber().modify_ack_deadline(
                    subscription=subscription, ack_ids=ack_ids[start:start + 1000], ack_deadline_seconds=seconds)
            except Exception as error:  # noqa: BLE001 - an expired lease is redelivered anyway
                log.warning("could not set the ack deadline of %d message(s): %s", len(ack_ids), error)

    def _start_renewer(self) -> None:
        with self._lock:
            if self._renewer is not None:
                return
            self._renewer = threading.Thread(target=self._renew, name="chatlens-lease-renewer", daemon=True)
        self._renewer.start()

    def _renew(self) -> None:
        while not self._stopped.wait(min(LEASE_RENEW_EVERY, self.lease_seconds / 4)):
            with self._lock:
                held = list(self._held.values())
            by_subscription: dict[str, list[str]] = {}
            for subscription, ack_id in held:
                by_subscription.setdefault(subscription, []).append(ack_id)
            for subscription, ack_ids in by_subscription.items():
                self._modify(subscription, ack_ids, self.lease_seconds)


LEASES = Leases()
"""One per process: a local runner runs every step in the process that reads."""


class LocalPubSubRead(_DirectReadFromPubSub):
    """ReadFromPubSub(with_attributes=True) for local runners that acknowledges late (see Leases).

    The BundleBasedDirectRunner evaluates its Pub/Sub read with `_PubSubReadEvaluator`,
    which pulls and acknowledges at once. `_LeasingPubSubReadEvaluator` pulls the same
    way, with the same timestamps and watermark, but leases instead. It is registered in
    the evaluator registry's override table; Beam is pinned to 2.77.x, where this holds.
    """

    def __init__(self, source, max_outstanding: int = 200):
        super().__init__(source)
        self.max_outstanding = max_outstanding

    def _infer_output_coder(self, unused_input_type=None, unused_input_coder=None):
        return None  # PubsubMessage objects, not bytes


class _LeasingPubSubReadEvaluator(_PubSubReadEvaluator):
    def _read_from_pubsub(self, timestamp_attribute):
        transform = self._applied_ptransform.transform
        if len(LEASES) >= transform.max_outstanding:
            time.sleep(0.2)  # back-pressure: wait for outcomes to be published
            return []
        client = self._get_subscriber_client(self._applied_ptransform)
        try:
            response = client.pull(subscription=self._sub_name, max_messages=PULL_BATCH, timeout=PULL_TIMEOUT)
        except Exception as error:  # noqa: BLE001 - DEADLINE_EXCEEDED, UNAVAILABLE: poll again
            log.debug("pull from %s: %s", self._sub_name, error)
            time.sleep(0.5)
            return []
        results = []
        for received in response.received_messages:
            message = PubsubMessage._from_message(received.message)
            timestamp = None
            if timestamp_attribute and timestamp_attribute in message.attributes:
                raw = message.attributes[timestamp_attribute]
                try:
                    timestamp = Timestamp(micros=int(raw) * 1000)
                except ValueError:
                    try:
                        timestamp = Timestamp.from_rfc3339(raw)
                    except ValueError:
                        log.warning("message %s: bad %s attribute %r; using its publish time",
                                    message.message_id, timestamp_attribute, raw)
            if timestamp is None:
                timestamp = Timestamp.from_utc_datetime(received.message.publish_time)
            results.append((timestamp, message))
        LEASES.hold(self._sub_name, [(r.message.message_id, r.ack_id) for r in response.received_messages])
        return results


TransformEvaluatorRegistry._test_evaluators_overrides[LocalPubSubRead] = _LeasingPubSubReadEvaluator


def read_from_pubsub(subscription: str, *, timestamp_attribute: str | None = None, local: bool = False,
                     max_outstanding: int = 200) -> beam.PTransform:
    """ReadFromPubSub with attributes; on local runners its twin that acknowledges after publishing."""
    read = beam.io.ReadFromPubSub(subscription=subscription, with_attributes=True,
                                  timestamp_attribute=timestamp_attribute)
    return LocalPubSubRead(read._source, max_outstanding) if local else read


class PublishFn(beam.DoFn):
    """Publish Outputs to a topic; once Pub/Sub confirmed a bundle's messages, settle their sources."""

    def __init__(self, topic: str, kind: str):
        self._topic = topic
        self._kind = kind
        self._published = _counter(f"published_{kind}")
        self._client = None
        self._pending: list[tuple[Any, Output]] = []

    def setup(self):
        from google.cloud import pubsub_v1

        self._client = pubsub_v1.PublisherClient()

    def start_bundle(self):
        self._pending = []

    def process(self, output: Output):
        self._pending.append((self._client.publish(self._topic, output.data, **output.attributes), output))

    def finish_bundle(self):
        pending, self._pending = self._pending, []
        for future, output in pending:
            future.result(timeout=120)  # raises: the bundle fails and nothing of it is acknowledged
            self._published.inc()
            message = output.message
            log.info("published %s %s %s", self._kind, getattr(message, "chat_id", None),
                     getattr(message, "window_id", None) or getattr(message, "stage", ""))
        LEASES.settle(s for _, output in pending for s in output.source_ids)

    def teardown(self):
        if self._client is not None:
            self._client.transport.close()


def settle(source_ids: Iterable[str]) -> None:
    """Acknowledge inputs that need no output of their own (duplicates)."""
    LEASES.settle(source_ids)
