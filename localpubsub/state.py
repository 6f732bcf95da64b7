"""In-memory Pub/Sub state: the broker behind both gRPC services.

It owns topics, subscriptions (see `queues`), leases and ack deadlines, all guarded
by one lock. Each subscription has a condition variable on that lock, so Pull calls
and streams sleep until a publish, ack, nack or expiry concerns them; one reaper
thread sleeps until the earliest ack deadline. The broker speaks protobuf messages
and gRPC status codes but knows nothing of the transport.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import logging
import math
import random
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import grpc
from google.protobuf import timestamp_pb2

from localpubsub.filters import compile_filter
from localpubsub.names import (
    EmulatorError,
    check_project,
    check_resource,
    invalid,
    not_found,
    project_of,
    unimplemented,
)
from localpubsub.protos import PubsubMessage, PullResponse, StreamingPullResponse, Subscription, Topic
from localpubsub.queues import Batch, Entry, Stream, SubscriptionQueue
from localpubsub.storage import Journal

log = logging.getLogger(__name__)

DELETED_TOPIC = "_deleted-topic_"
MIN_ACK_DEADLINE, MAX_ACK_DEADLINE, DEFAULT_ACK_DEADLINE = 10, 600, 10
MIN_DELIVERY_ATTEMPTS, MAX_DELIVERY_ATTEMPTS, DEFAULT_DELIVERY_ATTEMPTS = 5, 100, 5
# RetryPolicy: both backoffs 0-600 s, maximum >= minimum; an empty policy means 10 s and 600 s
MAX_BACKOFF, DEFAULT_MIN_BACKOFF, DEFAULT_MAX_BACKOFF = 600, 10, 600
# message_retention_duration: a subscription's 10 min-7 days (7 days unless set), a topic's 10 min-31 days
MIN_RETENTION, MAX_SUBSCRIPTION_RETENTION, MAX_TOPIC_RETENTION = 600, 7 * 86400, 31 * 86400
DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE = 100, 1000
MAX_RESPONSE_MESSAGES = 1000
MAX_RESPONSE_BYTES = 3 * 1024 * 1024  # clients' channels keep gRPC's 4 MiB receive limit

# The service's documented publish limits (cloud.google.com/pubsub/quotas#resource_limits)
MAX_PUBLISH_MESSAGES = 1000
MAX_PUBLISH_BYTES = 10 * 1000 * 1000  # a request's messages, and one message: 10 MB
MAX_ATTRIBUTES = 100
MAX_ATTRIBUTE_KEY_BYTES = 256
MAX_ATTRIBUTE_VALUE_BYTES = 1024
MAX_ORDERING_KEY_BYTES = 1024

_SUBSCRIPTION_UPDATABLE = {
    "ack_deadline_seconds",
    "dead_letter_policy",
    "retry_policy",
    "labels",
    "message_retention_duration",
    "retain_acked_messages",
    "expiration_policy",
    "enable_exactly_once_delivery",
}
_SUBSCRIPTION_DELIVERY_CONFIGS = ("push_config", "bigquery_config", "cloud_storage_config", "bigtable_config")
_TOPIC_UPDATABLE = {"labels", "message_retention_duration", "message_storage_policy", "kms_key_name"}

MIXED_ORDERING_KEYS = ("In a single publish request, all messages must have no ordering key "
                       "or they must all have the same ordering key.")


@dataclass(frozen=True)
class WorstCase:
    """Worst-case delivery, as at-least-once allows it, for subscriptions without message ordering:
    messages go out in a random order (within and across responses, new ones before old ones),
    and a `redeliver_share` of deliveries is followed by a spontaneous second copy of the message
    (same message id, its own ack id) within `max_delay` seconds: while the first is still out,
    or after it was acked. Subscriptions with exactly-once delivery get no copies."""

    seed: int = 0
    redeliver_share: float = 0.02
    max_delay: float = 3.0

    def __post_init__(self):
        if not 0 <= self.redeliver_share <= 1:
            raise ValueError(f"redeliver_share must be between 0 and 1, not {self.redeliver_share}")


class Broker:
    """Topics, subscriptions and message delivery, safe to call from many threads."""

    def __init__(self, *, stream_max_age: float | None = None, max_streams: int = 1000,
                 worst_case: WorstCase | None = None, data_dir=None):
        self.stream_max_age = stream_max_age
        self.max_streams = max_streams
        self.worst_case = worst_case
        self._random = random.Random(worst_case.seed) if worst_case is not None else None
        # Deliveries by kind, for tests and the worst-case figures (see `delivery_stats`).
        self._stats = {"deliveries": 0, "first_deliveries": 0, "out_of_order": 0, "duplicates": 0}
        self._lock = threading.Lock()
        self._topics: dict[str, Topic] = {}
        self._topic_subscriptions: dict[str, set[str]] = {}
        self._subscriptions: dict[str, SubscriptionQueue] = {}
        self._streams: set[Stream] = set()
        self._deadlines: list[tuple[float, int, SubscriptionQueue, Entry, str]] = []
        self._reaper_wakeup = threading.Condition(self._lock)
        self._reaper_due = math.inf
        self._reaper: threading.Thread | None = None
        self._closing = False
        # Message ids never repeat across restarts (as the service's never do): they count on from
        # the start time in microseconds, so a consumer keyed on message ids keeps working.
        self._message_ids = itertools.count(time.time_ns() // 1000)
        self._ack_ids = itertools.count(1)
        # Ack ids differ between runs, so that a client still holding leases from a
        # server that was restarted on the same port cannot ack someone else's message.
        self._ack_prefix = uuid.uuid4().hex[:8]
        self._sequence = itertools.count()
        self._journal: Journal | None = None
        if data_dir is not None:
            self._journal = Journal(data_dir)
            try:
                self._restore()
            except BaseException:
                self._journal.close()
                raise

    # Lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread that redelivers messages whose ack deadline passed."""
        with self._lock:
            if self._reaper is None:
                self._reaper = threading.Thread(target=self._reap, name="pubsub-emulator-reaper", daemon=True)
                self._reaper.start()

    def shutdown(self) -> None:
        """Refuse new work and wake every waiting Pull and stream so that they end."""
        with self._lock:
            self._closing = True
            for subscription in self._subscriptions.values():
                subscription.cond.notify_all()
            self._reaper_wakeup.notify_all()

    def close(self) -> None:
        self.shutdown()
        if self._reaper is not None:
            self._reaper.join(timeout=5)
        with self._lock:
            if self._journal is not None:
                self._journal.close()

    @property
    def closing(self) -> bool:
        return self._closing

    # State on disk ---------------------------------------------------------------

    def _restore(self) -> None:
        """Load the data directory's topics, subscriptions and unacked messages (all ready to go out)."""
        snapshot = self._journal.load()
        with self._lock:
            for topic in snapshot.topics.values():
                self._topics[topic.name] = topic
                self._topic_subscriptions[topic.name] = set()
            for config in snapshot.subscriptions.values():
                if config.topic not in self._topics:
                    config.topic = DELETED_TOPIC
                self._add_subscription(config, compile_filter(config.filter))
            highest = 0
            for message, names in snapshot.messages():
                self._enqueue(message, [self._subscriptions[name] for name in names])
                highest = max(highest, int(message.message_id))
            self._message_ids = itertools.count(max(time.time_ns() // 1000, highest + 1))
            self._compact()
            restored = sum(state.unacked for state in self._subscriptions.values())
        log.info("restored %d topics, %d subscriptions and %d unacked messages from %s", len(self._topics),
                 len(self._subscriptions), restored, self._journal.directory)

    def _compact(self) -> None:
        """Rewrite the journal as the live state alone."""
        messages: dict[str, tuple[PubsubMessage, list[str]]] = {}
        for state in self._subscriptions.values():
            for entry in state.live_entries():
                if not entry.duplicate:
                    messages.setdefault(entry.message.message_id, (entry.message, []))[1].append(state.name)
        live = [messages[i] for i in sorted(messages, key=int)]
        self._journal.rewrite(self._topics.values(), (s.config for s in self._subscriptions.values()), live)

    def _maybe_compact(self) -> None:
        if self._journal.needs_rewrite(sum(state.unacked for state in self._subscriptions.values())):
            self._compact()

    # Topics ----------------------------------------------------------------------

    def create_topic(self, topic) -> Topic:
        check_resource(topic.name, "topics")
        for field in ("schema_settings", "ingestion_data_source_settings"):
            if topic.HasField(field):
                raise unimplemented(f"Topic {field}")
        _check_retention(topic, MAX_TOPIC_RETENTION, "topic")
        with self._lock:
            if topic.name in self._topics:
                raise EmulatorError(grpc.StatusCode.ALREADY_EXISTS, f"Topic already exists (resource={topic.name})")
            stored = Topic()
            stored.CopyFrom(topic)
            self._topics[topic.name] = stored
            self._topic_subscriptions[topic.name] = set()
            if self._journal is not None:
                self._journal.topic(stored)
            return _copy(stored)

    def get_topic(self, name: str) -> Topic:
        check_resource(name, "topics")
        with self._lock:
            return _copy(self._topic(name))

    def update_topic(self, topic, update_mask) -> Topic:
        check_resource(topic.name, "topics")
        _check_mask(update_mask, _TOPIC_UPDATABLE, "topic")
        with self._lock:
            stored = _copy(self._topic(topic.name))
            update_mask.MergeMessage(topic, stored, replace_message_field=True, replace_repeated_field=True)
            _check_retention(stored, MAX_TOPIC_RETENTION, "topic")
            self._topics[topic.name] = stored
            if self._journal is not None:
                self._journal.topic(stored)
            return _copy(stored)

    def delete_topic(self, name: str) -> None:
        check_resource(name, "topics")
        with self._lock:
            self._topic(name)
            del self._topics[name]
            if self._journal is not None:
                self._journal.delete_topic(name)
            for subscription_name in self._topic_subscriptions.pop(name):
                config = self._subscriptions[subscription_name].config
                config.topic = DELETED_TOPIC
                if self._journal is not None:
                    self._journal.subscription(config)

    def list_topics(self, project: str, page_size: int = 0, page_token: str = "") -> tuple[list[Topic], str]:
        project_id = check_project(project)
        with self._lock:
            names = sorted(n for n in self._topics if project_of(n) == project_id)
            page, token = _page(names, page_size, page_token)
            return [_copy(self._topics[n]) for n in page], token

    def list_topic_subscriptions(self, topic: str, page_size: int = 0, page_token: str = "") -> tuple[list[str], str]:
        check_resource(topic, "topics")
        with self._lock:
            self._topic(topic)
            return _page(sorted(self._topic_subscriptions[topic]), page_size, page_token)

    # Subscriptions ---------------------------------------------------------------

    def create_subscription(self, subscription) -> Subscription:
        check_resource(subscription.name, "subscriptions")
        check_resource(subscription.topic, "topics")
        config = Subscription()
        config.CopyFrom(subscription)
        config.state = Subscription.State.ACTIVE
        predicate = compile_filter(config.filter)
        with self._lock:
            if config.name in self._subscriptions:
                raise EmulatorError(
                    grpc.StatusCode.ALREADY_EXISTS, f"Subscription already exists (resource={config.name})"
                )
            self._topic(config.topic)
            self._normalize_subscription(config)
            self._add_subscription(config, predicate)
            if self._journal is not None:
                self._journal.subscription(config)
            return _copy(config)

    def _add_subscription(self, config, predicate) -> SubscriptionQueue:
        state = self._subscriptions[config.name] = SubscriptionQueue(config, self._lock, predicate)
        if self._random is not None and not config.enable_message_ordering:
            state.shuffle = self._random
        if config.topic != DELETED_TOPIC:
            self._topic_subscriptions[config.topic].add(config.name)
        return state

    def get_subscription(self, name: str) -> Subscription:
        check_resource(name, "subscriptions")
        with self._lock:
            return _copy(self._subscription(name).config)

    def update_subscription(self, subscription, update_mask) -> Subscription:
        check_resource(subscription.name, "subscriptions")
        _check_mask(update_mask, _SUBSCRIPTION_UPDATABLE, "subscription", unsupported=_SUBSCRIPTION_DELIVERY_CONFIGS)
        with self._lock:
            state = self._subscription(subscription.name)
            config = _copy(state.config)
            update_mask.MergeMessage(subscription, config, replace_message_field=True, replace_repeated_field=True)
            self._normalize_subscription(config)
            state.config = config
            if self._journal is not None:
                self._journal.subscription(config)
            state.cond.notify_all()
            return _copy(config)

    def delete_subscription(self, name: str) -> None:
        check_resource(name, "subscriptions")
        with self._lock:
            state = self._subscription(name)
            state.deleted = True
            del self._subscriptions[name]
            self._topic_subscriptions.get(state.config.topic, set()).discard(name)
            if self._journal is not None:
                self._journal.delete_subscription(name)
            state.cond.notify_all()

    def list_subscriptions(self, project: str, page_size: int = 0, page_token: str = "") -> tuple[list, str]:
        project_id = check_project(project)
        with self._lock:
            names = sorted(n for n in self._subscriptions if project_of(n) == project_id)
            page, token = _page(names, page_size, page_token)
            return [_copy(self._subscriptions[n].config) for n in page], token

    # Publish ---------------------------------------------------------------------

    def publish(self, topic: str, messages: Sequence) -> list[str]:
        """Store copies of `messages` in every subscription of `topic`; return their ids."""
        check_resource(topic, "topics")
        if not messages:
            raise invalid("The request must contain at least one message")
        if any(not m.data and not m.attributes for m in messages):
            raise invalid("Some messages contain neither data nor attributes")
        if len({m.ordering_key for m in messages}) > 1:
            # The service's answer (the client libraries batch per ordering key for this reason).
            raise EmulatorError(grpc.StatusCode.FAILED_PRECONDITION, MIXED_ORDERING_KEYS)
        _check_publish_limits(messages)
        with self._lock:
            if self._closing:
                raise EmulatorError(grpc.StatusCode.UNAVAILABLE, "The emulator is shutting down")
            return self._publish(self._topic(topic).name, messages)

    def _publish(self, topic: str, messages: Iterable) -> list[str]:
        now = timestamp_pb2.Timestamp()
        now.GetCurrentTime()
        subscriptions = [self._subscriptions[n] for n in self._topic_subscriptions[topic]]
        ids, journal = [], []
        for original in messages:
            message = PubsubMessage()
            message.CopyFrom(original)
            message.message_id = str(next(self._message_ids))
            message.publish_time.CopyFrom(now)
            ids.append(message.message_id)
            names = self._enqueue(message, subscriptions)
            if names:
                journal.append((message, names))
        if self._journal is not None:
            self._journal.publish(journal)
            self._maybe_compact()
        for subscription in subscriptions:
            subscription.cond.notify_all()
        return ids

    def _enqueue(self, message, subscriptions: Iterable[SubscriptionQueue]) -> list[str]:
        """Add `message` to those of `subscriptions` whose filter it passes; return their names."""
        size = message.ByteSize()
        names = []
        for subscription in subscriptions:
            if subscription.accepts(message):
                subscription.enqueue(Entry(next(self._sequence), message, size))
                names.append(subscription.name)
        return names

    # Pull, ack, nack -------------------------------------------------------------

    def pull(self, subscription: str, max_messages: int, wait: float) -> PullResponse:
        """Lease up to `max_messages`, waiting at most `wait` seconds for the first one."""
        check_resource(subscription, "subscriptions")
        if max_messages <= 0:
            raise invalid("max_messages must be greater than 0")
        deadline = time.monotonic() + wait
        with self._lock:
            state = self._subscription(subscription)
            while True:
                response = PullResponse()
                limit = min(max_messages, MAX_RESPONSE_MESSAGES)
                self._lease(state, response.received_messages, limit, state.config.ack_deadline_seconds, None)
                remaining = deadline - time.monotonic()
                if response.received_messages or remaining <= 0 or self._closing:
                    return response
                state.cond.wait(remaining)
                if state.deleted:
                    raise not_found("Subscription", subscription)

    def acknowledge(self, subscription: str, ack_ids: Sequence[str]) -> None:
        check_resource(subscription, "subscriptions")
        if not ack_ids:
            raise invalid("ack_ids must not be empty")
        with self._lock:
            state = self._subscription(subscription)
            rejected = self._ack(state, ack_ids)
        if rejected and state.config.enable_exactly_once_delivery:
            raise _ack_id_failure(rejected)

    def modify_ack_deadline(self, subscription: str, ack_ids: Sequence[str], seconds: int) -> None:
        check_resource(subscription, "subscriptions")
        if not ack_ids:
            raise invalid("ack_ids must not be empty")
        _check_modack_seconds([seconds])
        with self._lock:
            state = self._subscription(subscription)
            rejected = self._modify(state, ack_ids, [seconds] * len(ack_ids))
        if rejected and state.config.enable_exactly_once_delivery:
            raise _ack_id_failure(rejected)

    # Streaming pull --------------------------------------------------------------

    def open_stream(self, request) -> Stream:
        """Validate the first StreamingPullRequest and register the stream."""
        check_resource(request.subscription, "subscriptions")
        if not MIN_ACK_DEADLINE <= request.stream_ack_deadline_seconds <= MAX_ACK_DEADLINE:
            raise invalid(
                f"Invalid stream_ack_deadline_seconds ({request.stream_ack_deadline_seconds}); "
                f"it must be between {MIN_ACK_DEADLINE} and {MAX_ACK_DEADLINE}"
            )
        _check_stream_modacks(request)
        with self._lock:
            if self._closing:
                raise EmulatorError(grpc.StatusCode.UNAVAILABLE, "The emulator is shutting down")
            if len(self._streams) >= self.max_streams:
                # Each stream holds a server thread; refuse before unary calls starve.
                raise EmulatorError(grpc.StatusCode.RESOURCE_EXHAUSTED, "Too many open StreamingPull calls")
            stream = Stream(self._subscription(request.subscription), request)
            stream.subscription.streams_opened += 1
            self._streams.add(stream)
            self._apply_stream_request(stream, request)
            return stream

    def stream_request(self, stream: Stream, request) -> None:
        """Apply a later request on the stream: acks, deadline changes, or a heartbeat."""
        _check_stream_modacks(request)
        deadline = request.stream_ack_deadline_seconds
        if deadline and not MIN_ACK_DEADLINE <= deadline <= MAX_ACK_DEADLINE:
            raise invalid(f"Invalid stream_ack_deadline_seconds ({deadline})")
        with self._lock:
            if deadline:
                stream.ack_deadline = deadline
            self._apply_stream_request(stream, request)

    def next_response(self, stream: Stream):
        """Block until messages can be sent on `stream`; None once the client is gone.

        Raises EmulatorError to end the call: UNAVAILABLE on shutdown or at the stream's
        maximum age (clients reconnect), NOT_FOUND if the subscription was deleted.
        """
        state = stream.subscription
        with self._lock:
            while True:
                if stream.error is not None:
                    raise stream.error
                if stream.cancelled:
                    return None
                if state.deleted:
                    raise not_found("Subscription", state.name)
                if self._closing:
                    raise EmulatorError(grpc.StatusCode.UNAVAILABLE, "The emulator is shutting down")
                timeout = None
                if self.stream_max_age is not None:
                    timeout = stream.opened + self.stream_max_age - time.monotonic()
                    if timeout <= 0:
                        raise EmulatorError(grpc.StatusCode.UNAVAILABLE, "Stream reached its maximum age; reconnect")
                if stream.has_room():
                    response = StreamingPullResponse()
                    self._lease(state, response.received_messages, MAX_RESPONSE_MESSAGES, stream.ack_deadline, stream)
                    if response.received_messages:
                        response.subscription_properties.CopyFrom(stream.properties())
                        return response
                state.cond.wait(timeout)

    def cancel_stream(self, stream: Stream) -> None:
        """The client went away: wake the stream's sender so that it returns."""
        with self._lock:
            stream.cancelled = True
            stream.subscription.cond.notify_all()

    def fail_stream(self, stream: Stream, error: EmulatorError) -> None:
        """A later request was invalid: end the stream with `error`."""
        with self._lock:
            stream.error = error
            stream.subscription.cond.notify_all()

    def close_stream(self, stream: Stream) -> None:
        """Forget the stream. Its leases stay until acked or expired, as in the service."""
        with self._lock:
            stream.cancelled = True
            self._streams.discard(stream)

    def backlog(self, subscription: str) -> dict[str, int]:
        """For tests and debugging: unacked and leased messages, open and opened streams."""
        with self._lock:
            state = self._subscription(subscription)
            return {
                "unacked": state.unacked,
                "leased": sum(1 for e in state.by_ack_id.values() if e.state == Entry.LEASED),
                "streams": sum(1 for s in self._streams if s.subscription is state and not s.cancelled),
                "streams_opened": state.streams_opened,
            }

    # Internals (lock held) -------------------------------------------------------

    def _topic(self, name: str) -> Topic:
        topic = self._topics.get(name)
        if topic is None:
            raise not_found("Topic", name)
        return topic

    def _subscription(self, name: str) -> SubscriptionQueue:
        state = self._subscriptions.get(name)
        if state is None:
            raise not_found("Subscription", name)
        return state

    def _normalize_subscription(self, config) -> None:
        """Apply the service's defaults and limits to a subscription's settings."""
        for field in _SUBSCRIPTION_DELIVERY_CONFIGS:
            if config.HasField(field) and getattr(config, field).ByteSize():
                raise unimplemented(f"Subscription {field}")
        if config.ack_deadline_seconds == 0:
            config.ack_deadline_seconds = DEFAULT_ACK_DEADLINE
        if not MIN_ACK_DEADLINE <= config.ack_deadline_seconds <= MAX_ACK_DEADLINE:
            raise invalid(
                f"Invalid ack_deadline_seconds ({config.ack_deadline_seconds}); "
                f"it must be between {MIN_ACK_DEADLINE} and {MAX_ACK_DEADLINE}"
            )
        policy = config.dead_letter_policy
        if config.HasField("dead_letter_policy") and not policy.dead_letter_topic:
            config.ClearField("dead_letter_policy")
        elif policy.dead_letter_topic:
            check_resource(policy.dead_letter_topic, "topics")
            self._topic(policy.dead_letter_topic)
            if policy.max_delivery_attempts == 0:
                policy.max_delivery_attempts = DEFAULT_DELIVERY_ATTEMPTS
            if not MIN_DELIVERY_ATTEMPTS <= policy.max_delivery_attempts <= MAX_DELIVERY_ATTEMPTS:
                raise invalid(
                    f"Invalid max_delivery_attempts ({policy.max_delivery_attempts}); "
                    f"it must be between {MIN_DELIVERY_ATTEMPTS} and {MAX_DELIVERY_ATTEMPTS}"
                )
        if config.HasField("retry_policy"):
            retry = config.retry_policy
            if not retry.HasField("minimum_backoff"):
                retry.minimum_backoff.seconds = DEFAULT_MIN_BACKOFF
            if not retry.HasField("maximum_backoff"):
                retry.maximum_backoff.seconds = DEFAULT_MAX_BACKOFF
            low, high = _seconds(retry.minimum_backoff), _seconds(retry.maximum_backoff)
            for name, value in (("minimum_backoff", low), ("maximum_backoff", high)):
                if not 0 <= value <= MAX_BACKOFF:
                    raise invalid(f"Invalid retry_policy.{name} ({value:g}s); it must be between 0s and {MAX_BACKOFF}s")
            if high < low:
                raise invalid(f"Invalid retry_policy: maximum_backoff ({high:g}s) must not be less than "
                              f"minimum_backoff ({low:g}s)")
        if not config.HasField("message_retention_duration"):
            config.message_retention_duration.seconds = MAX_SUBSCRIPTION_RETENTION
        _check_retention(config, MAX_SUBSCRIPTION_RETENTION, "subscription")

    def _backoff(self, state: SubscriptionQueue, entry: Entry) -> float:
        """Seconds a nacked or expired message waits before it goes out again: none without a
        retry policy, else exponential in its deliveries, from minimum_backoff up to maximum_backoff."""
        if not state.config.HasField("retry_policy"):
            return 0.0
        retry = state.config.retry_policy
        low, high = _seconds(retry.minimum_backoff), _seconds(retry.maximum_backoff)
        return min(high, low * 2 ** min(max(entry.attempts - 1, 0), 30))

    def _lease(self, state: SubscriptionQueue, out, limit: int, ack_deadline: int, stream: Stream | None) -> None:
        """Lease ready messages into `out`, a repeated ReceivedMessage field."""
        now = time.monotonic()
        count_attempts = bool(state.dead_letter_topic)
        holder = stream if stream is not None else Batch()
        taken = 0
        used_bytes = 0
        while taken < limit:
            if stream is not None and not stream.has_room():
                break
            entry = state.peek(holder)
            if entry is None:
                break
            if taken and used_bytes + entry.size > MAX_RESPONSE_BYTES:
                break
            if stream is not None and not stream.fits(entry):
                break
            state.lease(entry, f"{self._ack_prefix}-{next(self._ack_ids)}", holder, stream)
            self._count_delivery(state, entry, now)
            self._set_deadline(state, entry, now + ack_deadline)
            received = out.add(ack_id=entry.ack_id, delivery_attempt=entry.attempts if count_attempts else 0)
            received.message.CopyFrom(entry.message)
            taken += 1
            used_bytes += entry.size

    def _count_delivery(self, state: SubscriptionQueue, entry: Entry, now: float) -> None:
        """Count the delivery; in worst-case mode, maybe follow it with a spontaneous second copy."""
        stats = self._stats
        stats["deliveries"] += 1
        if entry.duplicate:
            stats["duplicates"] += 1
            return
        if entry.attempts == 1:
            stats["first_deliveries"] += 1
            if entry.seq < state.previous_first_delivery:
                stats["out_of_order"] += 1  # published before the message first delivered just ahead of it
            state.previous_first_delivery = entry.seq
        worst = self.worst_case
        if (worst is None or state.shuffle is None or state.config.enable_exactly_once_delivery
                or self._random.random() >= worst.redeliver_share):
            return
        copy = Entry(next(self._sequence), entry.message, entry.size, duplicate=True)
        state.unacked += 1
        self._hold_back(state, copy, now + self._random.uniform(0, worst.max_delay))

    def _hold_back(self, state: SubscriptionQueue, entry: Entry, not_before: float) -> None:
        """Keep a READY message back until `not_before`; the reaper wakes its receivers then."""
        state.hold_back(entry, not_before)
        self._set_timer(state, not_before)

    def _set_timer(self, state: SubscriptionQueue, due: float) -> None:
        heapq.heappush(self._deadlines, (due, next(self._sequence), state, None, None))
        if due < self._reaper_due:
            self._reaper_wakeup.notify()

    def delivery_stats(self) -> dict[str, int]:
        """Deliveries so far, all subscriptions together: first deliveries, those of them published
        before the message first delivered just ahead of them on their subscription (out of order;
        about half of them in a random order), and worst-case mode's spontaneous copies."""
        with self._lock:
            return dict(self._stats)

    def _set_deadline(self, state: SubscriptionQueue, entry: Entry, deadline: float) -> None:
        entry.deadline = deadline
        heapq.heappush(self._deadlines, (deadline, next(self._sequence), state, entry, entry.ack_id))
        if deadline < self._reaper_due:
            self._reaper_wakeup.notify()

    def _ack(self, state: SubscriptionQueue, ack_ids: Iterable[str]) -> list[str]:
        """Ack what the ids name; return the ids that name no outstanding delivery (unknown,
        already acked, or superseded by a redelivery): ignored, except with exactly-once delivery."""
        changed, rejected, acked = False, [], []
        for ack_id in ack_ids:
            entry = state.by_ack_id.get(ack_id)
            if entry is None or (state.config.enable_exactly_once_delivery and entry.state != Entry.LEASED):
                rejected.append(ack_id)
                continue
            state.unlease(entry)
            state.finish(entry)
            acked.append(entry.message.message_id)
            changed = True
        if changed:
            if self._journal is not None:
                self._journal.ack(state.name, acked)
                self._maybe_compact()
            state.cond.notify_all()
        return rejected

    def _modify(self, state: SubscriptionQueue, ack_ids: Sequence[str], seconds: Sequence[int]) -> list[str]:
        """Extend or end leases; return the ack ids that name no outstanding delivery (ignored,
        except with exactly-once delivery, where the service fails them as for acks)."""
        now = time.monotonic()
        changed, rejected = False, []
        for ack_id, delay in zip(ack_ids, seconds):
            entry = state.by_ack_id.get(ack_id)
            if entry is None or entry.state != Entry.LEASED or entry.ack_id != ack_id:
                rejected.append(ack_id)
                continue
            if delay == 0:
                self._redeliver(state, entry)
                changed = True
            else:
                self._set_deadline(state, entry, now + delay)
        if changed:
            state.cond.notify_all()
        return rejected

    def _apply_stream_request(self, stream: Stream, request) -> None:
        state = stream.subscription
        if state.deleted:
            return
        if request.ack_ids:
            self._ack(state, request.ack_ids)
        if request.modify_deadline_ack_ids:
            self._modify(state, request.modify_deadline_ack_ids, request.modify_deadline_seconds)

    def _redeliver(self, state: SubscriptionQueue, entry: Entry) -> None:
        """Nack or expiry: make the message ready again (with ordering, its key's later
        ones sent so far too), or dead-letter it."""
        policy = state.config.dead_letter_policy
        dead = bool(policy.dead_letter_topic) and entry.attempts >= policy.max_delivery_attempts
        dead = dead and self._dead_letter(state, entry)
        backoff = 0.0 if dead else self._backoff(state, entry)
        not_before = time.monotonic() + backoff if backoff > 0 else 0.0
        state.release(entry, not_before)
        if not_before:
            self._set_timer(state, not_before)
        if dead:
            state.discard(entry)
            if self._journal is not None and not entry.duplicate:
                self._journal.ack(state.name, [entry.message.message_id])

    def _dead_letter(self, state: SubscriptionQueue, entry: Entry) -> bool:
        topic = state.dead_letter_topic
        if topic not in self._topics:
            log.warning("dead-letter topic %s of %s does not exist; redelivering", topic, state.name)
            return False
        message = PubsubMessage()
        message.CopyFrom(entry.message)
        message.ClearField("message_id")
        message.ClearField("publish_time")
        attributes = message.attributes
        attributes["CloudPubSubDeadLetterSourceDeliveryCount"] = str(entry.attempts)
        attributes["CloudPubSubDeadLetterSourceSubscription"] = state.name.rsplit("/", 1)[1]
        attributes["CloudPubSubDeadLetterSourceSubscriptionProject"] = project_of(state.name)
        attributes["CloudPubSubDeadLetterSourceTopicPublishTime"] = entry.message.publish_time.ToJsonString()
        self._publish(topic, [message])
        log.debug("dead-lettered message %s of %s to %s", entry.message.message_id, state.name, topic)
        return True

    def _reap(self) -> None:
        """Reaper thread: redeliver leased messages whose ack deadline has passed."""
        with self._lock:
            while not self._closing:
                now = time.monotonic()
                touched = set()
                while self._deadlines and self._deadlines[0][0] <= now:
                    deadline, _, state, entry, ack_id = heapq.heappop(self._deadlines)
                    if entry is None:  # a timer: held-back messages are due
                        if not state.deleted and state.promote(now):
                            touched.add(state)
                        continue
                    current = entry.state == Entry.LEASED and entry.ack_id == ack_id and entry.deadline == deadline
                    if current and not state.deleted:
                        self._redeliver(state, entry)
                        touched.add(state)
                for state in touched:
                    state.cond.notify_all()
                self._reaper_due = self._deadlines[0][0] if self._deadlines else math.inf
                timeout = None if self._reaper_due == math.inf else self._reaper_due - now
                self._reaper_wakeup.wait(timeout)


def _seconds(duration) -> float:
    return duration.seconds + duration.nanos / 1e9


def _check_retention(resource, maximum: int, kind: str) -> None:
    if not resource.HasField("message_retention_duration"):
        return
    value = _seconds(resource.message_retention_duration)
    if not MIN_RETENTION <= value <= maximum:
        raise invalid(f"Invalid message_retention_duration ({value:g}s) for a {kind}; "
                      f"it must be between {MIN_RETENTION}s (10 minutes) and {maximum}s ({maximum // 86400} days)")


def _copy(message):
    duplicate = type(message)()
    duplicate.CopyFrom(message)
    return duplicate


def _page(names: list[str], page_size: int, page_token: str) -> tuple[list[str], str]:
    """One page of sorted names; the token is the last name returned."""
    if page_size < 0:
        raise invalid("page_size must not be negative")
    size = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
    start = bisect.bisect_right(names, page_token) if page_token else 0
    page = names[start:start + size]
    more = start + size < len(names)
    return page, (page[-1] if more else "")


def _check_mask(mask, updatable: set[str], kind: str, unsupported: Iterable[str] = ()) -> None:
    if not mask.paths:
        raise invalid("update_mask must name at least one field")
    for path in mask.paths:
        field = path.split(".", 1)[0]
        if field in unsupported:
            raise unimplemented(f"Updating {kind} {field}")
        if field not in updatable:
            raise invalid(f"Invalid update_mask path {path!r}: the {kind}'s {field} cannot be updated")


def _ack_id_failure(ack_ids: Sequence[str]) -> EmulatorError:
    """The service's answer to acks that cannot succeed on an exactly-once subscription."""
    from google.rpc import error_details_pb2

    info = error_details_pb2.ErrorInfo(reason="EXACTLY_ONCE_ACKID_FAILURE", domain="pubsub.googleapis.com",
                                       metadata={ack_id: "PERMANENT_FAILURE_INVALID_ACK_ID" for ack_id in ack_ids})
    return EmulatorError(grpc.StatusCode.INVALID_ARGUMENT, "Some acknowledgement ids in the request were invalid.",
                         [info])


def _check_publish_limits(messages: Sequence) -> None:
    """INVALID_ARGUMENT where the service would refuse the request, with its reason."""
    if len(messages) > MAX_PUBLISH_MESSAGES:
        raise invalid(f"The value for message_count is too large. You passed {len(messages)} in the request, "
                      f"but the maximum value is {MAX_PUBLISH_MESSAGES}.")
    total = 0
    for message in messages:
        size = message.ByteSize()
        total += size
        if size > MAX_PUBLISH_BYTES:
            raise invalid(f"Message size {size} bytes exceeds the limit of {MAX_PUBLISH_BYTES} bytes")
        if len(message.attributes) > MAX_ATTRIBUTES:
            raise invalid(f"A message has {len(message.attributes)} attributes; the maximum is {MAX_ATTRIBUTES}")
        for key, value in message.attributes.items():
            if len(key.encode()) > MAX_ATTRIBUTE_KEY_BYTES:
                raise invalid(f"An attribute key is {len(key.encode())} bytes; the maximum is {MAX_ATTRIBUTE_KEY_BYTES}")
            if len(value.encode()) > MAX_ATTRIBUTE_VALUE_BYTES:
                raise invalid(f"The value of attribute {key!r} is {len(value.encode())} bytes; "
                              f"the maximum is {MAX_ATTRIBUTE_VALUE_BYTES}")
        if len(message.ordering_key.encode()) > MAX_ORDERING_KEY_BYTES:
            raise invalid(f"An ordering key is {len(message.ordering_key.encode())} bytes; "
                          f"the maximum is {MAX_ORDERING_KEY_BYTES}")
    if total > MAX_PUBLISH_BYTES:
        raise invalid(f"Request payload size exceeds the limit: {MAX_PUBLISH_BYTES} bytes.")


def _check_modack_seconds(seconds: Iterable[int]) -> None:
    for value in seconds:
        if not 0 <= value <= MAX_ACK_DEADLINE:
            raise invalid(f"Invalid ack deadline ({value}); it must be between 0 and {MAX_ACK_DEADLINE}")


def _check_stream_modacks(request) -> None:
    if len(request.modify_deadline_ack_ids) != len(request.modify_deadline_seconds):
        raise invalid("modify_deadline_seconds and modify_deadline_ack_ids must have the same length")
    _check_modack_seconds(request.modify_deadline_seconds)
