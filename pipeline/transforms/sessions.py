"""Messages mode: session windows per chat, and the ChatWindow each firing becomes."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

import apache_beam as beam
from apache_beam import pvalue
from apache_beam.transforms import trigger as triggers
from apache_beam.transforms import window
from apache_beam.utils.windowed_value import PaneInfoTiming

from chatlens.contracts import (
    MAX_WINDOW_MESSAGES,
    MAX_WINDOW_TEXT_BYTES,
    ChatMessage,
    ChatWindow,
    ContractError,
    describe_validation_error,
)
from pipeline.metrics import Counter, Distribution
from pipeline.transforms.dead_letters import exception_dead_letter
from pipeline.transforms.records import DEAD_LETTER, MessageEvent, Origin, TaggedWindow, utc


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


def build_session_window(chat_id: str, events: Iterable[MessageEvent]) -> TaggedWindow:
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
    return TaggedWindow(origin, chat)


class _InvalidSession(ContractError):
    """A session that is no valid ChatWindow, with the Origin its dead letter reports."""

    def __init__(self, origin: Origin, message: str):
        super().__init__(message)
        self.origin = origin


class Sessionize(beam.PTransform):
    """(chat_id, MessageEvent) -> TaggedWindow per firing, back in the global window.

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
        self.fired = Counter("session_firings")
        self.skipped = Counter("session_firings_skipped")
        self.windows = Counter("windows_read")
        self.sizes = Distribution("session_messages")

    def process(self, element, pane=beam.DoFn.PaneInfoParam):
        chat_id, events = element
        events = list(events)
        self.fired.inc()
        final = pane.timing in (PaneInfoTiming.ON_TIME, PaneInfoTiming.LATE) or any(e.closed for e in events)
        try:
            tagged = build_session_window(chat_id, events)
        except Exception as error:  # noqa: BLE001 - messages from outside: a failing bundle would be retried forever
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
        self.sizes.update(len(tagged.chat.messages))
        yield tagged
