"""The values that travel between the pipeline's transforms.

Dataclasses for what a step builds once and reads by name (`Envelope`, `Origin`, `Output`,
`MessageEvent`); NamedTuples for the elements that pair them up (`TaggedWindow`, `Routed`,
`Analysed`): they are tuples, so Beam's KV idioms and the model handlers' (key, example)
unpacking keep working, and they are picklable for every runner. Keys of stateful steps
stay plain typed tuples or strings (see `batching.BatchChats`), whose coders are
deterministic.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, NamedTuple

from apache_beam.utils.timestamp import Timestamp

from chatlens.contracts import ChatInsight, ChatMessage, ChatWindow, DeadLetter, to_json_bytes

DEAD_LETTER = "dead_letter"
"""The tag of every step's dead-letter output."""
SETTLED = "settled"
"""The tag of the source ids that need no output of their own (duplicates)."""


def utc(value: datetime | Timestamp | float) -> datetime:
    """An aware UTC datetime from a Beam Timestamp, epoch seconds or a (naive or aware) datetime."""
    if isinstance(value, Timestamp):
        return value.to_utc_datetime(has_tz=True)
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value, timezone.utc)
    if value.tzinfo is None:
        return value.replace(tzinfo=timezone.utc)
    return datetime.fromtimestamp(value.timestamp(), timezone.utc)  # plain datetime, e.g. from a protobuf one


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
    """Where a window came from: what its insight or dead letter needs, and the inputs it settles."""

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


@dataclass(frozen=True)
class MessageEvent:
    """Messages mode: one valid ChatMessage and what its input message carried."""

    message: ChatMessage
    payload: bytes
    attributes: dict[str, str]
    published_at: datetime
    source_id: str | None
    closed: bool = False


class TaggedWindow(NamedTuple):
    """A ChatWindow with its Origin, from validation to the model; the model handlers read
    `chat` (pipeline.model.types.chat_of), the origin rides through RunInference untouched."""

    origin: Origin
    chat: ChatWindow


class Routed(NamedTuple):
    """A TaggedWindow keyed by its model route: the (key, example) of the KeyedModelHandler."""

    route: str
    window: TaggedWindow


class Analysed(NamedTuple):
    """A window and its WindowAnalysis, out of the model, on the way to its insight."""

    origin: Origin
    chat: ChatWindow
    analysis: Any  # pipeline.model.types.WindowAnalysis
