"""Per-subscription message queues, leases and streaming-pull windows.

Plain data structures: the broker calls them with its lock held, so they do no
locking of their own (each queue's condition variable shares the broker's lock).
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
import threading
import time
from collections import deque

from localpubsub.filters import Predicate
from localpubsub.names import EmulatorError
from localpubsub.protos import StreamingPullResponse


class Entry:
    """One message in one subscription, with the lease of its current delivery."""

    READY, LEASED, DONE = range(3)
    __slots__ = ("seq", "message", "size", "attempts", "state", "ack_id", "deadline", "stream", "not_before",
                 "duplicate")

    def __init__(self, seq: int, message, size: int, *, duplicate: bool = False):
        self.seq = seq
        self.message = message  # shared, read-only, between the topic's subscriptions
        self.size = size
        self.attempts = 0
        self.state = Entry.READY
        self.ack_id: str | None = None  # the latest delivery's; stays valid for late acks
        self.deadline = 0.0
        self.stream: Stream | None = None  # whose flow-control window it occupies
        self.not_before = 0.0  # READY but held back until then (retry policy backoff; a worst-case duplicate)
        self.duplicate = duplicate  # a worst-case delivery's spontaneous second copy, not the stored message


class Batch:
    """Who an ordering key's outstanding messages went to: one Pull response.

    A key's later messages follow its outstanding ones only to the same receiver, so
    that two subscribers never hold one key's messages at once; a Pull response is
    over once sent, so its keys wait until their messages are acked or redelivered.
    """

    def __init__(self):
        self.ready_keys: dict[str, None] = {}  # keys held here with a message ready to follow


class Stream(Batch):
    """One StreamingPull call: its ack deadline and flow-control window.

    Unlike a Pull response it goes on: the keys it holds keep flowing to it, in order,
    across its responses, while their earlier messages are still outstanding.
    """

    def __init__(self, subscription: SubscriptionQueue, request):
        super().__init__()
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


class KeyQueue:
    """One ordering key's unfinished messages, in publish order.

    The first `delivered` went out and are leased, or acked after an earlier one that
    is still out (kept, since a redelivery of that one resends them too); the rest
    wait. While any is out the key belongs to `holder`, and only it gets the next ones.
    """

    __slots__ = ("key", "entries", "delivered", "holder")

    def __init__(self, key: str):
        self.key = key
        self.entries: deque[Entry] = deque()
        self.delivered = 0
        self.holder: Batch | None = None

    def next_ready(self) -> Entry | None:
        """The next message to send, past those acked while waiting (late acks)."""
        while self.delivered < len(self.entries) and self.entries[self.delivered].state == Entry.DONE:
            self.delivered += 1
        return self.entries[self.delivered] if self.delivered < len(self.entries) else None


class SubscriptionQueue:
    """A subscription's backlog: ready messages by publish order, per-key queues, leases.

    With message ordering, each key's messages go out in order and in batches: a free
    key's first ready message is in `ready`, and whoever leases it also gets the key's
    next ones (`Batch.ready_keys`) until its messages are all acked. A nack or expiry
    redelivers that message and every later one of its key already sent, as the service does.
    """

    def __init__(self, config, lock: threading.Lock, predicate: Predicate | None):
        self.config = config
        self.cond = threading.Condition(lock)
        self.predicate = predicate
        self.ready: list[tuple[float, int, Entry]] = []  # heap on publish sequence: unordered, and free keys' first
        self.delayed: list[tuple[float, int, Entry]] = []  # heap on not_before: READY messages held back
        self.shuffle: random.Random | None = None  # worst-case delivery: a random order instead of publish order
        self.key_queues: dict[str, KeyQueue] = {}
        self.by_ack_id: dict[str, Entry] = {}
        self.unacked = 0
        self.previous_first_delivery = -1  # the seq of the message last delivered for the first time
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

    def _key_queue(self, entry: Entry) -> KeyQueue | None:
        key = entry.message.ordering_key
        return self.key_queues.get(key) if key and self.config.enable_message_ordering else None

    def enqueue(self, entry: Entry) -> None:
        self.unacked += 1
        key = entry.message.ordering_key
        if self.config.enable_message_ordering and key:
            queue = self.key_queues.get(key)
            if queue is None:
                queue = self.key_queues[key] = KeyQueue(key)
            queue.entries.append(entry)
            if queue.delivered == 0:
                if len(queue.entries) == 1:
                    self._push_ready(entry)  # a free key's first message
            elif queue.next_ready() is entry:
                queue.holder.ready_keys[key] = None  # follows the key's outstanding ones
            return
        self._push_ready(entry)

    def live_entries(self) -> list[Entry]:
        """Every message not yet acked: ready, held back, leased, or waiting behind its ordering key."""
        seen: dict[int, Entry] = {}
        sources = ([e for _, _, e in self.ready], [e for _, _, e in self.delayed], self.by_ack_id.values(),
                   *(q.entries for q in self.key_queues.values()))
        for source in sources:
            for entry in source:
                if entry.state != Entry.DONE:
                    seen[id(entry)] = entry
        return sorted(seen.values(), key=lambda e: e.seq)

    def _push_ready(self, entry: Entry) -> None:
        """Into the backlog: by publish sequence, or (worst-case delivery, no ordering) at random."""
        ordered = self.config.enable_message_ordering and entry.message.ordering_key
        priority = self.shuffle.random() if self.shuffle is not None and not ordered else entry.seq
        heapq.heappush(self.ready, (priority, entry.seq, entry))

    def hold_back(self, entry: Entry, not_before: float) -> None:
        """A READY message that is not to go out before `not_before` (see `promote`)."""
        entry.not_before = not_before
        heapq.heappush(self.delayed, (not_before, entry.seq, entry))

    def promote(self, now: float) -> bool:
        """Release the held-back messages that are due; True if any can now go out."""
        promoted = False
        while self.delayed and self.delayed[0][0] <= now:
            _, _, entry = heapq.heappop(self.delayed)
            entry.not_before = 0.0
            if entry.state != Entry.READY:
                continue  # acked late while held back
            queue = self._key_queue(entry)
            if queue is None:
                self._push_ready(entry)
            elif queue.holder is None and queue.delivered == 0 and queue.entries and queue.entries[0] is entry:
                self._push_ready(entry)
            elif queue.holder is not None and queue.next_ready() is entry:
                queue.holder.ready_keys[queue.key] = None
            else:
                continue
            promoted = True
        return promoted

    def peek(self, holder: Batch) -> Entry | None:
        """The next message `holder` may lease: its keys' next ones first, then the backlog."""
        if self.delayed and self.delayed[0][0] <= time.monotonic():
            self.promote(time.monotonic())
        while holder.ready_keys:
            key = next(iter(holder.ready_keys))
            queue = self.key_queues.get(key)
            entry = queue.next_ready() if queue is not None and queue.holder is holder else None
            if entry is not None and not entry.not_before:
                return entry
            del holder.ready_keys[key]  # `promote` puts it back once its held-back message is due
        while self.ready and self.ready[0][2].state != Entry.READY:
            heapq.heappop(self.ready)  # acked late, after its lease expired
        return self.ready[0][2] if self.ready else None

    def lease(self, entry: Entry, ack_id: str, holder: Batch, stream: Stream | None) -> None:
        """Lease the entry `peek(holder)` returned, under a new ack id."""
        queue = self._key_queue(entry)
        if queue is None or queue.delivered == 0:
            heapq.heappop(self.ready)
        if queue is not None:
            queue.holder = holder
            queue.delivered += 1
            if queue.next_ready() is not None:
                holder.ready_keys[queue.key] = None
            else:
                holder.ready_keys.pop(queue.key, None)
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

    def unlease(self, entry: Entry) -> None:
        """Give the entry's room in its stream's flow-control window back."""
        stream, entry.stream = entry.stream, None
        if stream is not None:
            stream.outstanding -= 1
            stream.outstanding_bytes -= entry.size

    def release(self, entry: Entry, not_before: float = 0.0) -> None:
        """Nack or expiry: ready again, and with ordering every later message of its key sent so far.

        With `not_before` (a retry policy's backoff) it goes out again no earlier than then, and
        with ordering nothing of its key does either.
        """
        self.unlease(entry)
        queue = self._key_queue(entry)
        if queue is None:
            entry.state = Entry.READY
            if not_before:
                self.hold_back(entry, not_before)
            else:
                self._push_ready(entry)
            return
        index = queue.entries.index(entry)
        for later in itertools.islice(queue.entries, index, queue.delivered):
            if later.state == Entry.DONE:
                if self.config.enable_exactly_once_delivery:
                    continue  # an acked message never comes back there
                self.unacked += 1  # acked after it, but resent all the same
            self.unlease(later)
            later.state = Entry.READY
            if later is not entry and later.ack_id is not None:
                # Resent because of an earlier one: an ack of this delivery arriving now (clients
                # send acks and nacks apart) is superseded and must not cancel the resend.
                self.by_ack_id.pop(later.ack_id, None)
                later.ack_id = None
        queue.delivered = index
        if not_before:
            self.hold_back(entry, not_before)
            if index == 0:
                self._free(queue)  # which leaves the held-back first message for `promote`
        elif index == 0:
            self._free(queue)
        else:
            queue.holder.ready_keys[queue.key] = None

    def finish(self, entry: Entry) -> None:
        """Drop an acked (or dead-lettered) message; with ordering, once those before it are done too."""
        entry.state = Entry.DONE
        self.unacked -= 1
        if entry.ack_id is not None:
            self.by_ack_id.pop(entry.ack_id, None)
        queue = self._key_queue(entry)
        if queue is None or queue.entries[0] is not entry:
            return
        while queue.entries and queue.entries[0].state == Entry.DONE:
            queue.entries.popleft()
            queue.delivered = max(0, queue.delivered - 1)
        if not queue.entries:
            del self.key_queues[queue.key]
        elif queue.delivered == 0:
            self._free(queue)

    def discard(self, entry: Entry) -> None:
        """Dead-lettered (after `release`): gone for good, never resent with its key."""
        queue = self._key_queue(entry)
        if queue is not None and queue.entries[0] is not entry:
            queue.entries.remove(entry)  # released, so past the part that went out
        self.finish(entry)

    def _free(self, queue: KeyQueue) -> None:
        """Nothing of the key is out: its first message goes back to whoever pulls next."""
        if queue.holder is not None:
            queue.holder.ready_keys.pop(queue.key, None)
            queue.holder = None
        if not queue.entries[0].not_before:
            self._push_ready(queue.entries[0])
