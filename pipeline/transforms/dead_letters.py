"""Dead letters: what cannot be analysed, with the reason, republished as a DeadLetter Output."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from typing import Any

from chatlens.contracts import (
    MAX_ERROR_CHARS,
    MAX_PAYLOAD_BYTES,
    SCHEMA_VERSION,
    DeadLetter,
    json_object,
    shorten_error,
)
from pipeline.metrics import Counter
from pipeline.transforms.records import Output, utc

log = logging.getLogger(__name__)

# A DeadLetter's JSON must fit in one Pub/Sub message: base64 grows the payload by a third.
MAX_DEAD_LETTER_PAYLOAD = (MAX_PAYLOAD_BYTES - 512 * 1024) * 3 // 4 - MAX_ERROR_CHARS * 4


def claimed_chat_id(data: bytes) -> str | None:
    """The chat_id an invalid payload claims, when it is readable (for routing the dead letter)."""
    value = (json_object(data) or {}).get("chat_id")
    return value if isinstance(value, str) and 0 < len(value) <= 128 and value.isprintable() else None


def dead_letter(
    payload: bytes, stage: str, error_class: str, error_message: str, *, attributes: dict[str, str] | None = None,
    chat_id: str | None = None, source_ids: Iterable[str | None] = (), published_at: datetime | None = None,
) -> Output:
    """A DeadLetter Output; counted per stage. Payloads too large to republish are cut, saying so."""
    if len(payload) > MAX_DEAD_LETTER_PAYLOAD:
        error_message = f"{error_message} (payload cut from {len(payload)} to {MAX_DEAD_LETTER_PAYLOAD} bytes)"
        payload = payload[:MAX_DEAD_LETTER_PAYLOAD]
    letter = DeadLetter(
        payload=payload,
        attributes=dict(attributes or {}),
        stage=stage,
        error_class=error_class[:200] or "Error",
        error_message=shorten_error(error_message),
        chat_id=chat_id,
        failed_at=datetime.now(timezone.utc),
    )
    Counter(f"dead_letters_{stage}").inc()
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

    Batch elements are `Routed` (route, (origin, chat)), as AnalyzeWindows keys them."""
    batch, (error_type, error_repr, _traceback) = failure
    name = getattr(error_type, "__name__", str(error_type))
    log.warning("%s failed for a batch of %d window(s): %s", stage, len(batch), error_repr)
    for _route, (origin, _chat) in batch:
        yield dead_letter(origin.payload, stage, name, error_repr, attributes=origin.attributes,
                          chat_id=origin.chat_id, source_ids=origin.source_ids, published_at=origin.published_at)
