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
import threading
import time
import uuid
from collections.abc import Iterable, Sequence

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

log = logging.getLogger(__name__)

DELETED_TOPIC = "_deleted-topic_"
MIN_ACK_DEADLINE, MAX_ACK_DEADLINE, DEFAULT_ACK_DEADLINE = 10, 600, 10
MIN_DELIVERY_ATTEMPTS, MAX_DELIVERY_ATTEMPTS, DEFAULT_DELIVERY_ATTEMPTS = 5, 100, 5
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


class Broker:
    """Topics, subscriptions and message delivery, safe to call from many threads."""

    def __init__(self, *, stream_max_age: float | None = None, max_streams: int = 1000):
        self.stream_max_age = stream_max_age
        self.max_streams = max_streams
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

    @property
    def closing(self) -> bool:
        return self._closing

    # Topics ----------------------------------------------------------------------

    def create_topic(self, topic) -> Topic:
        check_resource(topic.name, "topics")
        for field in ("schema_settings", "ingestion_data_source_settings"):
            if topic.HasField(field):
                raise unimplemented(f"Topic {field}")
        with self._lock:
            if topic.name in self._topics:
                raise EmulatorError(grpc.StatusCode.ALREADY_EXISTS, f"Topic already exists (resource={topic.name})")
            stored = Topic()
            stored.CopyFrom(topic)
            self._topics[topic.name] = stored
            self._topic_subscriptions[topic.name] = set()
            return _copy(stored)

    def get_topic(self, name: str) -> Topic:
        check_resource(name, "topics")
        with self._lock:
            return _copy(self._topic(name))

    def update_topic(self, topic, update_mask) -> Topic:
        check_resource(topic.name, "topics")
        _check_mask(update_mask, _TOPIC_UPDATABLE, "topic")
        with self._lock:
            stored = self._topic(topic.name)
            update_mask.MergeMessage(topic, stored, replace_message_field=True, replace_repeated_field=True)
            return _copy(stored)

    def delete_topic(self, name: str) -> None:
        check_resource(name, "topics")
        with self._lock:
            self._topic(name)
            del self._topics[name]
            for subscription_name in self._topic_subscriptions.pop(name):
                self._subscriptions[subscription_name].config.topic = DELETED_TOPIC

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
            self._subscriptions[config.name] = SubscriptionQueue(config, self._lock, predicate)
            self._topic_subscriptions[config.topic].add(config.name)
            return _copy(config)

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
            state.cond.notify_all()
            return _copy(config)

    def delete_subscription(self, name: str) -> None:
        check_resource(name, "subscriptions")
        with self._lock:
            state = self._subscription(name)
            state.deleted = True
            del self._subscriptions[name]
            self._topic_subscriptions.get(state.config.topic, set()).discard(name)
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
        _check_publish_limits(messages)
        with self._lock:
            if self._closing:
                raise EmulatorError(grpc.StatusCode.UNAVAILABLE, "The emulator is shutting down")
            return self._publish(self._topic(topic).name, messages)

    def _publish(self, topic: str, messages: Iterable) -> list[str]:
        now = timestamp_pb2.Timestamp()
        now.GetCurrentTime()
        subscriptions = [self._subscriptions[n] for n in self._topic_subscriptions[topic]]
        ids = []
        for original in messages:
            message = PubsubMessage()
            message.CopyFrom(original)
            message.message_id = str(next(self._message_ids))
            message.publish_time.CopyFrom(now)
            size = message.ByteSize()
            ids.append(message.message_id)
            for subscription in subscriptions:
                if subscription.accepts(message):
                    subscription.enqueue(Entry(next(self._sequence), message, size))
        for subscription in subscriptions:
            subscription.cond.notify_all()
        return ids

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
            self._modify(state, ack_ids, [seconds] * len(ack_ids))

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
            self._set_deadline(state, entry, now + ack_deadline)
            received = out.add(ack_id=entry.ack_id, delivery_attempt=entry.attempts if count_attempts else 0)
            received.message.CopyFrom(entry.message)
            taken += 1
            used_bytes += entry.size

    def _set_deadline(self, state: SubscriptionQueue, entry: Entry, deadline: float) -> None:
        entry.deadline = deadline
        heapq.heappush(self._deadlines, (deadline, next(self._sequence), state, entry, entry.ack_id))
        if deadline < self._reaper_due:
            self._reaper_wakeup.notify()

    def _ack(self, state: SubscriptionQueue, ack_ids: Iterable[str]) -> list[str]:
        """Ack what the ids name; return the ids that name no outstanding delivery (unknown,
        already acked, or superseded by a redelivery): ignored, except with exactly-once delivery."""
        changed, rejected = False, []
        for ack_id in ack_ids:
            entry = state.by_ack_id.get(ack_id)
            if entry is None or (state.config.enable_exactly_once_delivery and entry.state != Entry.LEASED):
                rejected.append(ack_id)
                continue
            state.unlease(entry)
            state.finish(entry)
            changed = True
        if changed:
            state.cond.notify_all()
        return rejected

    def _modify(self, state: SubscriptionQueue, ack_ids: Sequence[str], seconds: Sequence[int]) -> None:
        now = time.monotonic()
        changed = False
        for ack_id, delay in zip(ack_ids, seconds):
            entry = state.by_ack_id.get(ack_id)
            if entry is None or entry.state != Entry.LEASED or entry.ack_id != ack_id:
                continue
            if delay == 0:
                self._redeliver(state, entry)
                changed = True
            else:
                self._set_deadline(state, entry, now + delay)
        if changed:
            state.cond.notify_all()

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
        state.release(entry)
        if dead:
            state.discard(entry)

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
                    current = entry.state == Entry.LEASED and entry.ack_id == ack_id and entry.deadline == deadline
                    if current and not state.deleted:
                        self._redeliver(state, entry)
                        touched.add(state)
                for state in touched:
                    state.cond.notify_all()
                self._reaper_due = self._deadlines[0][0] if self._deadlines else math.inf
                timeout = None if self._reaper_due == math.inf else self._reaper_due - now
                self._reaper_wakeup.wait(timeout)


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
