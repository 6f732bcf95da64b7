"""Validation: raw Envelopes against the contracts; what fails is dead-lettered (stage "validate")."""

from __future__ import annotations

import logging
import time

import apache_beam as beam
from apache_beam import pvalue

from chatlens.contracts import CLOSED_ATTRIBUTE, ContractError, parse_message, parse_window
from pipeline.metrics import Counter
from pipeline.transforms.dead_letters import claimed_chat_id, exception_dead_letter
from pipeline.transforms.records import DEAD_LETTER, Envelope, MessageEvent, Origin, TaggedWindow, utc

log = logging.getLogger(__name__)


def _invalid(envelope: Envelope, error: Exception) -> pvalue.TaggedOutput:
    """The `validate` dead letter of an envelope that failed its contract: one shape for
    windows and messages, so both carry the same payload, attributes and source key.

    Any exception, not only a ContractError: the input is untrusted, and an exception that
    escaped would fail the bundle, which a streaming runner retries forever (the pipeline
    would stop making progress on one message). One that is not a ContractError is a gap
    in the contracts' checks: logged with its traceback, and still dead-lettered."""
    if not isinstance(error, ContractError):
        log.warning("validate: %s on an input (dead-lettered)", type(error).__name__, exc_info=error)
    return pvalue.TaggedOutput(DEAD_LETTER, exception_dead_letter(
        envelope.data, "validate", error, attributes=envelope.attributes, chat_id=claimed_chat_id(envelope.data),
        source_ids=[envelope.source_id], published_at=envelope.published_at))


class ValidateWindows(beam.PTransform):
    """Envelopes -> TaggedWindow (Origin, ChatWindow); invalid ones -> the `dead_letter` output."""

    def expand(self, envelopes):
        return envelopes | beam.ParDo(_ValidateWindowFn()).with_outputs(DEAD_LETTER, main="windows")


class _ValidateWindowFn(beam.DoFn):
    def __init__(self):
        self.read = Counter("windows_read")
        self.valid = Counter("windows_valid")

    def process(self, envelope: Envelope):
        self.read.inc()
        try:
            chat = parse_window(envelope.data)
        except Exception as error:  # noqa: BLE001 - untrusted input: see _invalid
            yield _invalid(envelope, error)
            return
        self.valid.inc()
        origin = Origin(chat.chat_id, chat.window_id, envelope.data, envelope.attributes, envelope.published_at,
                        tuple(s for s in [envelope.source_id] if s))
        yield TaggedWindow(origin, chat)


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
        self.read = Counter("messages_read")
        self.closed = Counter("chats_closed")

    def process(self, envelope: Envelope, timestamp=beam.DoFn.TimestampParam):
        self.read.inc()
        try:
            message = parse_message(envelope.data)
            if float(timestamp) + self._max_age < self._clock():
                raise ContractError(
                    f"message event time {utc(timestamp).isoformat()} is older than the session gap plus the "
                    f"allowed lateness ({self._max_age} s): its session is closed")
        except Exception as error:  # noqa: BLE001 - untrusted input: see _invalid
            yield _invalid(envelope, error)
            return
        closed = is_closing(envelope.attributes)
        event = MessageEvent(message, envelope.data, envelope.attributes, envelope.published_at,
                             envelope.source_id, closed)
        if closed:
            self.closed.inc()
        for _ in range(self._copies if closed else 1):
            yield message.chat_id, event
