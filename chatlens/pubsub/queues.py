"""Per-subscription message queues, leases and streaming-pull windows.

Plain data structures: the broker calls them with its lock held, so they do no
locking of their own (each queue's condition variable shares the broker's lock).
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from collections import deque

from chatlens.pubsub.filters import Predicate
from chatlens.pubsub.names import EmulatorError
from chatlens.pubsub.protos import StreamingPullResponse


class Entry:
    """One message in one subscription, with the lease of its current delivery."""

    READY, LEASED, DONE = range(3)
    __slots__ = ("seq", "message", "size", "attempts", "state", "ack_id", "deadline", "stream")

    def __init__(self, seq: int, message, size: int):
        self.seq = seq
        self.message = message  # shared, read-only, between the topic's subscriptions
        self.size = size
        self.attempts = 0
        self.state = Entry.READY
        self.ack_id: str | None = None  # the latest delivery's; stays valid for late acks
        self.deadline = 0.0
        self.stream: Stream | None = None  # whose flow-control window it occupies


class Stream:
    """One StreamingPull call: its ack deadline and flow-control window."""

    def __init__(self, subscription: SubscriptionQueue, request):
        self.subscription = subscription
        self.ack_deadline = request.stream_ack_deadline_seconds
        self.max_messages = request.max_outstanding_messages if request.max_outstanding_messages > 0 else math.inf
        self.max_bytes = request.max_outstanding_bytes if request.max_outstanding_bytes > 0 else math.inf
        self.client_id = request.client_id
        self.outstanding = 0
        self.outstanding_bytes = 0
        self.cancelled = False
        self.error: EmulatorError | None = None
        self.opened = time.monotonic()

    def has_room(self) -> bool:
        return self.outstanding < self.max_messages and self.outstanding_bytes < self.max_bytes

    def fits(self, entry: Entry) -> bool:
        """Whether `entry` fits the byte window; an empty window takes any one message."""
        return not self.outstanding or self.outstanding_bytes + entry.size <= self.max_bytes

    def properties(self):
        config = self.subscription.config
        return StreamingPullResponse.SubscriptionProperties(
            exactly_once_delivery_enabled=config.enable_exactly_once_delivery,
            message_ordering_enabled=config.enable_message_ordering,
        )


class SubscriptionQueue:
    """A subscription's backlog: ready messages by publish order, per-key queues, leases."""

    def __init__(self, config, lock: threading.Lock, predicate: Predicate | None):
        self.config = config
        self.cond = threading.Condition(lock)
        self.predicate = predicate
        self.ready: list[tuple[int, Entry]] = []  # heap on publish sequence
        self.key_queues: dict[str, deque[Entry]] = {}  # ordering: only each head is ready or leased
        self.by_ack_id: dict[str, Entry] = {}
        self.unacked = 0
        self.streams_opened = 0
        self.deleted = False

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def dead_letter_topic(self) -> str:
        return self.config.dead_letter_policy.dead_letter_topic

    def accepts(self, message) -> bool:
        return self.predicate is None or self.predicate(message.attributes)

    def enqueue(self, entry: Entry) -> None:
        self.unacked += 1
        key = entry.message.ordering_key
        if self.config.enable_message_ordering and key:
            queue = self.key_queues.setdefault(key, deque())
            queue.append(entry)
            if len(queue) > 1:
                return  # waits until the earlier messages of its key are acked
        heapq.heappush(self.ready, (entry.seq, entry))

    def make_ready(self, entry: Entry) -> None:
        entry.state = Entry.READY
        heapq.heappush(self.ready, (entry.seq, entry))

    def peek_ready(self) -> Entry | None:
        while self.ready and self.ready[0][1].state != Entry.READY:
            heapq.heappop(self.ready)  # acked late, after its lease expired
        return self.ready[0][1] if self.ready else None

    def lease_next(self, ack_id: str, stream: Stream | None) -> Entry:
        """Lease the entry `peek_ready` returned, under a new ack id."""
        _, entry = heapq.heappop(self.ready)
        if entry.ack_id is not None:
            self.by_ack_id.pop(entry.ack_id, None)
        entry.attempts += 1
        entry.state = Entry.LEASED
        entry.ack_id = ack_id
        self.by_ack_id[ack_id] = entry
        entry.stream = stream
        if stream is not None:
            stream.outstanding += 1
            stream.outstanding_bytes += entry.size
        return entry

    def unlease(self, entry: Entry) -> None:
        """Give the entry's room in its stream's flow-control window back."""
        stream, entry.stream = entry.stream, None
        if stream is not None:
            stream.outstanding -= 1
            stream.outstanding_bytes -= entry.size

    def finish(self, entry: Entry) -> None:
        """Drop an acked (or dead-lettered) message and release the next one of its key."""
        entry.state = Entry.DONE
        self.unacked -= 1
        if entry.ack_id is not None:
            self.by_ack_id.pop(entry.ack_id, None)
        key = entry.message.ordering_key
        queue = self.key_queues.get(key) if self.config.enable_message_ordering and key else None
        if queue and queue[0] is entry:
            queue.popleft()
            if queue:
                heapq.heappush(self.ready, (queue[0].seq, queue[0]))
            else:
                del self.key_queues[key]
