"""The Pub/Sub emulator, driven by the real google-cloud-pubsub clients over gRPC."""

from __future__ import annotations

import collections
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from google.api_core import exceptions
from google.cloud import pubsub_v1
from google.protobuf import field_mask_pb2

from chatlens.config import LAYOUT, subscription_path, topic_path
from localpubsub.admin import admin_clients, ensure_layout
from localpubsub.emulator import EmulatorServer, wait_ready
from localpubsub.filters import compile_filter
from localpubsub.names import EmulatorError
from localpubsub.protos import StreamingPullRequest, StreamingPullResponse, Subscription, Topic

PROJECT = "chatlens-test"
CHATLENS = Path(sys.executable).with_name("chatlens")

pytestmark = pytest.mark.timeout(60)


def wait_for(condition, timeout: float = 20.0, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class Clients:
    """A publisher and a subscriber pointed at one emulator, plus naming helpers."""

    def __init__(self, ordered: bool = False):
        options = pubsub_v1.types.PublisherOptions(enable_message_ordering=ordered)
        self.publisher = pubsub_v1.PublisherClient(publisher_options=options)
        self.subscriber = pubsub_v1.SubscriberClient()

    def topic(self) -> str:
        return self.publisher.create_topic(name=topic_path(PROJECT, unique("topic"))).name

    def subscription(self, topic: str, **settings) -> str:
        path = subscription_path(PROJECT, unique("sub"))
        return self.subscriber.create_subscription(request={"name": path, "topic": topic, **settings}).name

    def close(self) -> None:
        self.publisher.stop()
        self.subscriber.close()


@pytest.fixture
def emulator(monkeypatch):
    """The server object itself, for tests that look at its state."""
    with EmulatorServer("localhost", 0) as server:
        monkeypatch.setenv("PUBSUB_EMULATOR_HOST", server.address)
        yield server


@pytest.fixture
def clients(emulator):
    made = Clients()
    yield made
    made.close()


def publish_concurrently(publisher, topic: str, count: int, threads: int = 4) -> list[str]:
    """Publish `count` messages with attributes from `threads` threads; return the ids."""

    def publish_share(worker: int) -> list[str]:
        pending = [
            publisher.publish(topic, f"message {n}".encode(), seq=str(n), worker=str(worker))
            for n in range(worker, count, threads)
        ]
        return [future.result(timeout=30) for future in pending]

    with futures.ThreadPoolExecutor(threads) as pool:
        return [message_id for ids in pool.map(publish_share, range(threads)) for message_id in ids]


def test_streaming_pull_receives_every_message_once(clients, emulator):
    topic = clients.topic()
    subscription = clients.subscription(topic)
    count = 2000
    seen = collections.Counter()
    message_ids = set()
    garbled = []
    lock = threading.Lock()

    def callback(message):
        seq = message.attributes["seq"]
        with lock:
            seen[seq] += 1
            message_ids.add(message.message_id)
            if message.data != f"message {seq}".encode() or message.attributes["worker"] != str(int(seq) % 4):
                garbled.append(message)
        message.ack()

    streaming = clients.subscriber.subscribe(subscription, callback)
    try:
        published = publish_concurrently(clients.publisher, topic, count)
        assert len(set(published)) == count
        assert wait_for(lambda: len(seen) == count, timeout=30)
        assert wait_for(lambda: emulator.broker.backlog(subscription)["unacked"] == 0)
    finally:
        streaming.cancel()
        streaming.result(timeout=10)
    assert set(seen.values()) == {1}
    assert message_ids == set(published)
    assert not garbled


def test_unary_pull_and_acknowledge(clients, emulator):
    topic = clients.topic()
    subscription = clients.subscription(topic)
    count = 2000
    published = publish_concurrently(clients.publisher, topic, count)
    received = []
    deadline = time.monotonic() + 30
    while len(received) < count and time.monotonic() < deadline:
        response = clients.subscriber.pull(subscription=subscription, max_messages=300, timeout=10)
        received += [m.message for m in response.received_messages]
        if response.received_messages:
            clients.subscriber.acknowledge(
                subscription=subscription, ack_ids=[m.ack_id for m in response.received_messages]
            )
    assert sorted(m.message_id for m in received) == sorted(published)
    assert {m.attributes["seq"] for m in received} == {str(n) for n in range(count)}
    assert all(m.publish_time.timestamp() > 0 for m in received)
    assert emulator.broker.backlog(subscription)["unacked"] == 0
    started = time.monotonic()
    assert not clients.subscriber.pull(subscription=subscription, max_messages=10, timeout=30).received_messages
    assert time.monotonic() - started < 5  # an empty Pull answers long before the client's deadline


def test_publish_ids_are_in_request_order(clients):
    topic = clients.topic()
    subscription = clients.subscription(topic)
    response = clients.publisher.api.publish(topic=topic, messages=[{"data": b"%d" % n} for n in range(50)])
    pulled = clients.subscriber.pull(subscription=subscription, max_messages=100, timeout=10).received_messages
    by_id = {m.message.message_id: m.message.data for m in pulled}
    assert [by_id[i] for i in response.message_ids] == [b"%d" % n for n in range(50)]


def test_message_ids_never_repeat_across_server_restarts(monkeypatch):
    """The service never reuses a message id; consumers that key on ids (dead letters from other
    producers, the dashboard's error rows) would drop new messages as old ones otherwise."""
    ids = []
    for _ in range(2):  # the same port twice would also do; a restart starts from empty state
        with EmulatorServer("localhost", 0) as server:
            monkeypatch.setenv("PUBSUB_EMULATOR_HOST", server.address)
            clients = Clients()
            try:
                topic = clients.topic()
                ids += clients.publisher.api.publish(topic=topic, messages=[{"data": b"x"}] * 3).message_ids
            finally:
                clients.close()
    assert len(set(ids)) == 6 and [int(i) for i in ids] == sorted(int(i) for i in ids)


def pull_one(clients: Clients, subscription: str, timeout: float = 10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        response = clients.subscriber.pull(subscription=subscription, max_messages=1, timeout=10)
        if response.received_messages:
            return response.received_messages[0]
    raise AssertionError(f"no message on {subscription} within {timeout} s")


def test_nack_expiry_delivery_attempts_and_dead_letter(clients):
    topic = clients.topic()
    dead_letter_topic = clients.topic()
    dead_letters = clients.subscription(dead_letter_topic)
    policy = {"dead_letter_topic": dead_letter_topic, "max_delivery_attempts": 5}
    subscription = clients.subscription(topic, dead_letter_policy=policy)
    plain = clients.subscription(topic)
    clients.publisher.publish(topic, b"poison", kind="test").result(timeout=10)

    first = pull_one(clients, subscription)
    assert first.delivery_attempt == 1
    clients.subscriber.modify_ack_deadline(subscription=subscription, ack_ids=[first.ack_id], ack_deadline_seconds=0)
    second = pull_one(clients, subscription)
    assert (second.delivery_attempt, second.message.message_id) == (2, first.message.message_id)
    assert second.ack_id != first.ack_id

    # Expiry: a 1 s lease that nobody extends ends in a redelivery, not before.
    leased_at = time.monotonic()
    clients.subscriber.modify_ack_deadline(subscription=subscription, ack_ids=[second.ack_id], ack_deadline_seconds=1)
    third = pull_one(clients, subscription)
    assert third.delivery_attempt == 3
    assert time.monotonic() - leased_at >= 0.99

    attempt = third
    for expected in (4, 5):
        clients.subscriber.modify_ack_deadline(subscription=subscription, ack_ids=[attempt.ack_id], ack_deadline_seconds=0)
        attempt = pull_one(clients, subscription)
        assert attempt.delivery_attempt == expected
    clients.subscriber.modify_ack_deadline(subscription=subscription, ack_ids=[attempt.ack_id], ack_deadline_seconds=0)

    forwarded = pull_one(clients, dead_letters).message
    assert forwarded.data == b"poison"
    assert forwarded.attributes["kind"] == "test"
    assert forwarded.attributes["CloudPubSubDeadLetterSourceDeliveryCount"] == "5"
    assert not clients.subscriber.pull(subscription=subscription, max_messages=1, timeout=10).received_messages
    # Without a dead-letter policy the service leaves delivery_attempt unset.
    assert pull_one(clients, plain).delivery_attempt == 0


def test_streaming_nack_is_redelivered_with_attempt_count(clients):
    topic = clients.topic()
    dead_letter_topic = clients.topic()
    subscription = clients.subscription(
        topic, dead_letter_policy={"dead_letter_topic": dead_letter_topic, "max_delivery_attempts": 10}
    )
    attempts = []
    done = threading.Event()

    def callback(message):
        attempts.append(message.delivery_attempt)
        if message.delivery_attempt < 3:
            message.nack()
        else:
            message.ack()
            done.set()

    streaming = clients.subscriber.subscribe(subscription, callback)
    try:
        clients.publisher.publish(topic, b"retry me").result(timeout=10)
        assert done.wait(20)
    finally:
        streaming.cancel()
        streaming.result(timeout=10)
    assert attempts == [1, 2, 3]


def test_ordering_key_messages_go_out_in_batches_and_a_nack_rewinds_the_key(emulator):
    """As in the service: a key's messages are out several at once, in order, to one receiver;
    a nack or an expired lease redelivers that message and every later one of its key that
    went out, acked or not (issue 13)."""
    ordered = Clients(ordered=True)
    subscriber = ordered.subscriber

    def pull():
        return subscriber.pull(subscription=subscription, max_messages=100, timeout=10).received_messages

    def by_key(received):
        keys = collections.defaultdict(list)
        for m in received:
            keys[m.message.ordering_key].append(m.message.data.decode())
        return dict(keys)

    try:
        topic = ordered.topic()
        subscription = ordered.subscription(topic, enable_message_ordering=True)
        pending = [
            ordered.publisher.publish(topic, f"{key}{n}".encode(), ordering_key=key) for n in range(4) for key in "abc"
        ]
        for future in pending:
            future.result(timeout=10)
        first = pull()
        assert by_key(first) == {key: [f"{key}{n}" for n in range(4)] for key in "abc"}
        ack_id = {m.message.data.decode(): m.ack_id for m in first}

        # A key's next message waits while its earlier ones are out with another receiver.
        ordered.publisher.publish(topic, b"a4", ordering_key="a").result(timeout=10)
        assert not pull()
        subscriber.acknowledge(subscription=subscription, ack_ids=[ack_id[f"a{n}"] for n in range(4)])
        [a4] = pull()
        assert a4.message.data == b"a4"
        subscriber.acknowledge(subscription=subscription, ack_ids=[a4.ack_id])

        # A nack of b1 resends b1 and what followed it, b2 although it was acked; not b0 before it.
        subscriber.acknowledge(subscription=subscription, ack_ids=[ack_id["b0"], ack_id["b2"]])
        subscriber.modify_ack_deadline(subscription=subscription, ack_ids=[ack_id["b1"]], ack_deadline_seconds=0)
        # Clients send acks and nacks apart: an ack of b3's first delivery arriving after the
        # nack is superseded, and b3 is resent all the same (the Node client's flaky check).
        subscriber.acknowledge(subscription=subscription, ack_ids=[ack_id["b3"]])
        again = pull()
        assert by_key(again) == {"b": ["b1", "b2", "b3"]}

        # An expired lease does the same: c0's ends in 1 s and brings back c0..c3.
        subscriber.modify_ack_deadline(subscription=subscription, ack_ids=[ack_id["c0"]], ack_deadline_seconds=1)
        expired = []
        assert wait_for(lambda: expired.extend(pull()) or expired, timeout=10)
        assert by_key(expired) == {"c": ["c0", "c1", "c2", "c3"]}

        subscriber.acknowledge(subscription=subscription, ack_ids=[m.ack_id for m in [*again, *expired]])
        assert emulator.broker.backlog(subscription)["unacked"] == 0
    finally:
        ordered.close()


def test_one_keys_messages_stream_in_batches_in_order(emulator):
    """Ordered delivery no longer waits for each ack (issue 13): 500 messages of one key reach the
    Python client in order, complete and within seconds, several of them out at once."""
    ordered = Clients(ordered=True)
    count = 500
    received, most_leased = [], [0]
    done = threading.Event()

    def callback(message):
        received.append(int(message.data))
        most_leased[0] = max(most_leased[0], emulator.broker.backlog(subscription)["leased"])
        message.ack()
        if len(received) == count:
            done.set()

    try:
        topic = ordered.topic()
        subscription = ordered.subscription(topic, enable_message_ordering=True)
        pulled = ordered.subscription(topic, enable_message_ordering=True)
        streaming = ordered.subscriber.subscribe(subscription, callback)
        try:
            started = time.monotonic()
            pending = [ordered.publisher.publish(topic, b"%d" % n, ordering_key="one") for n in range(count)]
            for future in pending:
                future.result(timeout=30)
            assert done.wait(30), f"{len(received)} of {count} received"
            elapsed = time.monotonic() - started
        finally:
            streaming.cancel()
            streaming.result(timeout=10)
        # One Pull response carries the key's whole backlog, in order.
        batch = ordered.subscriber.pull(subscription=pulled, max_messages=1000, timeout=10).received_messages
    finally:
        ordered.close()
    assert received == list(range(count))
    assert most_leased[0] > 1
    print(f"ordered, one key: {count} messages in {elapsed:.2f} s ({count / elapsed:.0f} msgs/s)")
    assert elapsed < 20  # the Python client runs a key's callbacks one by one, an ack batch (10 ms) apart
    assert [int(m.message.data) for m in batch] == list(range(count))


def test_ordering_keys_keep_per_key_order_when_streaming(emulator):
    """Per key, the callback sees messages in order; a nack starts the key over from that message
    (the server resends it and the later ones), so each run ascends and every message gets acked."""
    ordered = Clients(ordered=True)
    keys, per_key = ["k1", "k2", "k3", "k4"], 40
    delivered = collections.defaultdict(list)
    acked = collections.defaultdict(set)
    nacked_once = set()
    lock = threading.Lock()

    def callback(message):
        key, n = message.ordering_key, int(message.data)
        with lock:
            delivered[key].append(n)
            if n % 15 == 7 and (key, n) not in nacked_once:
                nacked_once.add((key, n))
                message.nack()
                return
            acked[key].add(n)
        message.ack()

    try:
        topic = ordered.topic()
        subscription = ordered.subscription(topic, enable_message_ordering=True)
        streaming = ordered.subscriber.subscribe(subscription, callback)
        try:
            for n in range(per_key):
                for key in keys:
                    ordered.publisher.publish(topic, str(n).encode(), ordering_key=key)
            assert wait_for(lambda: all(len(acked[key]) == per_key for key in keys), timeout=30)
        finally:
            streaming.cancel()
            streaming.result(timeout=10)
    finally:
        ordered.close()
    for key in keys:
        seen = delivered[key]
        assert seen[0] == 0
        for previous, current in zip(seen, seen[1:]):
            assert current == previous + 1 or (current <= previous and (key, current) in nacked_once), (key, seen)


def test_subscribers_share_one_subscription(clients, emulator):
    topic = clients.topic()
    subscription = clients.subscription(topic)
    count, consumers = 600, 3
    acks = collections.Counter()
    per_consumer = collections.Counter()
    lock = threading.Lock()
    subscribers = [pubsub_v1.SubscriberClient() for _ in range(consumers)]

    def make_callback(index):
        def callback(message):
            time.sleep(0.002)
            with lock:
                acks[message.message_id] += 1
                per_consumer[index] += 1
            message.ack()

        return callback

    flow = pubsub_v1.types.FlowControl(max_messages=10)
    streams = [s.subscribe(subscription, make_callback(i), flow_control=flow) for i, s in enumerate(subscribers)]
    try:
        assert wait_for(lambda: emulator.broker.backlog(subscription)["streams"] == consumers)
        published = publish_concurrently(clients.publisher, topic, count)
        assert wait_for(lambda: len(acks) == count, timeout=30)
        assert wait_for(lambda: emulator.broker.backlog(subscription)["unacked"] == 0)
    finally:
        for stream in streams:
            stream.cancel()
            stream.result(timeout=10)
        for subscriber in subscribers:
            subscriber.close()
    assert set(acks) == set(published)
    assert set(acks.values()) == {1}
    assert all(per_consumer[i] > 0 for i in range(consumers)), per_consumer


def test_subscriber_survives_a_server_restart(monkeypatch):
    server = EmulatorServer("localhost", 0).start()
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", server.address)
    port = server.port
    topic, subscription = topic_path(PROJECT, "restart"), subscription_path(PROJECT, "restart-sub")
    received = []
    made = Clients()
    replacement = None
    try:
        made.publisher.create_topic(name=topic)
        made.subscriber.create_subscription(name=subscription, topic=topic)
        streaming = made.subscriber.subscribe(subscription, lambda m: (received.append(m.data), m.ack()))
        made.publisher.publish(topic, b"before").result(timeout=10)
        assert wait_for(lambda: b"before" in received)

        server.stop()
        # Same port, fresh state: seed it before serving so the reconnecting stream finds its subscription.
        replacement = EmulatorServer("localhost", port)
        replacement.broker.create_topic(Topic(name=topic))
        replacement.broker.create_subscription(Subscription(name=subscription, topic=topic))
        replacement.start()

        made.publisher.publish(topic, b"after").result(timeout=20)
        assert wait_for(lambda: b"after" in received, timeout=30)
        assert not streaming.done()
        streaming.cancel()
        streaming.result(timeout=10)
    finally:
        made.close()
        server.stop()
        if replacement is not None:
            replacement.stop()


def test_streams_closed_at_their_maximum_age_reconnect(monkeypatch):
    with EmulatorServer("localhost", 0, stream_max_age=1.0) as server:
        monkeypatch.setenv("PUBSUB_EMULATOR_HOST", server.address)
        made = Clients()
        try:
            topic = made.topic()
            subscription = made.subscription(topic)
            received = []
            streaming = made.subscriber.subscribe(subscription, lambda m: (received.append(m.data), m.ack()))
            made.publisher.publish(topic, b"first").result(timeout=10)
            assert wait_for(lambda: b"first" in received)
            # Each second the stream ends with UNAVAILABLE and the client opens a new one.
            assert wait_for(lambda: server.broker.backlog(subscription)["streams_opened"] >= 3, timeout=20)
            made.publisher.publish(topic, b"second").result(timeout=10)
            assert wait_for(lambda: b"second" in received)
            assert not streaming.done()
            streaming.cancel()
            streaming.result(timeout=10)
        finally:
            made.close()


class RawStream:
    """A StreamingPull call driven by hand: requests go in through a queue."""

    def __init__(self, address: str, first_request):
        self.channel = grpc.insecure_channel(address)
        self.requests: queue.Queue = queue.Queue()
        self.requests.put(first_request)
        open_call = self.channel.stream_stream(
            "/google.pubsub.v1.Subscriber/StreamingPull",
            request_serializer=StreamingPullRequest.SerializeToString,
            response_deserializer=StreamingPullResponse.FromString,
        )
        self.call = open_call(iter(self.requests.get, None), timeout=30)

    def send(self, **fields) -> None:
        self.requests.put(StreamingPullRequest(**fields))

    def receive(self):
        return next(self.call)

    def close(self) -> None:
        self.requests.put(None)
        self.call.cancel()
        self.channel.close()


def test_stream_side_heartbeats_acks_nacks_and_closing_status(clients, emulator):
    topic = clients.topic()
    subscription = clients.subscription(topic, enable_message_ordering=True)
    other = clients.subscription(clients.topic())
    stream = RawStream(emulator.address, StreamingPullRequest(subscription=subscription, stream_ack_deadline_seconds=10))
    broken = RawStream(emulator.address, StreamingPullRequest(subscription=other, stream_ack_deadline_seconds=10))
    try:
        clients.publisher.publish(topic, b"one").result(timeout=10)
        response = stream.receive()
        assert response.subscription_properties.message_ordering_enabled
        [first] = response.received_messages
        stream.send()  # a heartbeat
        stream.send(modify_deadline_ack_ids=[first.ack_id], modify_deadline_seconds=[0])  # a nack
        [again] = stream.receive().received_messages
        assert again.message.message_id == first.message.message_id
        stream.send(ack_ids=[again.ack_id])
        assert wait_for(lambda: emulator.broker.backlog(subscription)["unacked"] == 0)

        broken.send(modify_deadline_ack_ids=["some-ack-id"], modify_deadline_seconds=[])
        with pytest.raises(grpc.RpcError) as raised:
            broken.receive()
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT

        emulator.stop()  # streams end with UNAVAILABLE, never OK
        with pytest.raises(grpc.RpcError) as raised:
            stream.receive()
        assert raised.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        stream.close()
        broken.close()


def test_bad_requests_get_the_service_status_codes(clients):
    topic = clients.topic()
    subscription = clients.subscription(topic)
    missing_topic = topic_path(PROJECT, "no-such-topic")
    missing_subscription = subscription_path(PROJECT, "no-such-subscription")
    publisher, subscriber = clients.publisher, clients.subscriber

    with pytest.raises(exceptions.NotFound):
        publisher.publish(missing_topic, b"x").result(timeout=10)
    with pytest.raises(exceptions.NotFound):
        publisher.get_topic(topic=missing_topic)
    with pytest.raises(exceptions.NotFound):
        subscriber.create_subscription(name=subscription_path(PROJECT, unique("sub")), topic=missing_topic)
    with pytest.raises(exceptions.NotFound):
        subscriber.pull(subscription=missing_subscription, max_messages=1, timeout=10)
    with pytest.raises(exceptions.AlreadyExists):
        publisher.create_topic(name=topic)
    with pytest.raises(exceptions.AlreadyExists):
        subscriber.create_subscription(name=subscription, topic=topic)
    with pytest.raises(exceptions.InvalidArgument):
        publisher.create_topic(name="")
    with pytest.raises(exceptions.InvalidArgument):
        publisher.create_topic(name="projects/p/topics/goog-reserved")
    with pytest.raises(exceptions.InvalidArgument):
        subscriber.create_subscription(name="", topic=topic)
    with pytest.raises(exceptions.InvalidArgument):
        subscriber.create_subscription(name=subscription_path(PROJECT, unique("sub")), topic=topic, ack_deadline_seconds=5)
    with pytest.raises(exceptions.InvalidArgument):
        subscriber.modify_ack_deadline(subscription=subscription, ack_ids=["x"], ack_deadline_seconds=601)
    with pytest.raises(exceptions.InvalidArgument):
        publisher.api.publish(topic=topic, messages=[{"data": b""}])
    with pytest.raises(exceptions.MethodNotImplemented):
        subscriber.create_snapshot(name=f"projects/{PROJECT}/snapshots/snap", subscription=subscription)

    # StreamingPull checks its first request; the client library sends good ones, so go raw.
    with pytest.raises(exceptions.NotFound):
        next(subscriber.api.streaming_pull(requests=iter([
            {"subscription": missing_subscription, "stream_ack_deadline_seconds": 10}
        ])))
    with pytest.raises(exceptions.InvalidArgument):
        next(subscriber.api.streaming_pull(requests=iter([{"subscription": subscription}])))
    streaming = subscriber.subscribe(missing_subscription, lambda m: m.ack())
    with pytest.raises(exceptions.NotFound):
        streaming.result(timeout=10)


def test_publish_limits_are_the_services(clients):
    """What the service answers INVALID_ARGUMENT to, found by the official Node client (issue 13)."""
    topic = clients.topic()
    publish = clients.publisher.api.publish
    refused = {
        "an 11 MiB message": [{"data": b"x" * (11 * 1024 * 1024)}],
        "101 attributes": [{"data": b"x", "attributes": {f"k{i}": "v" for i in range(101)}}],
        "a 257-byte attribute key": [{"data": b"x", "attributes": {"k" * 257: "v"}}],
        "a 1,025-byte attribute value": [{"data": b"x", "attributes": {"k": "v" * 1025}}],
        "1,001 messages": [{"data": b"x"}] * 1001,
        "a 1,025-byte ordering key": [{"data": b"x", "ordering_key": "o" * 1025}],
        "11 MB in one request": [{"data": b"x" * (2 * 1000 * 1000)}] * 6,
    }
    for what, messages in refused.items():
        with pytest.raises(exceptions.InvalidArgument):
            publish(topic=topic, messages=messages, timeout=60)
            pytest.fail(f"{what} was accepted")
    # and exactly at the limits, accepted
    at_limits = [{"data": b"x", "attributes": {"k" * 256: "v" * 1024, **{f"k{i}": "v" for i in range(99)}},
                  "ordering_key": "o" * 1024}] + [{"data": b"x", "ordering_key": "o" * 1024}] * 999
    assert len(publish(topic=topic, messages=at_limits, timeout=60).message_ids) == 1000


def test_exactly_once_rejects_superseded_ack_ids(clients):
    """With exactly-once delivery an ack id that a redelivery replaced fails, per id, as in the service."""
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    topic = clients.topic()
    subscription = clients.subscription(topic, enable_exactly_once_delivery=True)
    plain = clients.subscription(topic)
    clients.publisher.publish(topic, b"once").result(timeout=10)
    subscriber = clients.subscriber
    first = subscriber.pull(subscription=subscription, max_messages=1, timeout=10).received_messages[0]
    subscriber.modify_ack_deadline(subscription=subscription, ack_ids=[first.ack_id], ack_deadline_seconds=0)
    second = subscriber.pull(subscription=subscription, max_messages=1, timeout=10).received_messages[0]
    assert second.message.message_id == first.message.message_id and second.ack_id != first.ack_id
    with pytest.raises(exceptions.InvalidArgument) as refused:
        subscriber.acknowledge(subscription=subscription, ack_ids=[first.ack_id])
    status = rpc_status.from_call(refused.value.response)
    info = error_details_pb2.ErrorInfo()
    assert status.details[0].Unpack(info) and info.reason == "EXACTLY_ONCE_ACKID_FAILURE"
    assert dict(info.metadata) == {first.ack_id: "PERMANENT_FAILURE_INVALID_ACK_ID"}
    subscriber.acknowledge(subscription=subscription, ack_ids=[second.ack_id])  # the current one succeeds
    with pytest.raises(exceptions.InvalidArgument):
        subscriber.acknowledge(subscription=subscription, ack_ids=[second.ack_id])  # and only once
    # the client library's streaming subscriber confirms acks on such a subscription
    clients.publisher.publish(topic, b"streamed").result(timeout=10)
    confirmed = []
    future = subscriber.subscribe(subscription, lambda m: confirmed.append(m.ack_with_response().result(timeout=10)))
    try:
        deadline = time.monotonic() + 20
        while not confirmed and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        future.cancel()
    assert len(confirmed) == 1
    # without exactly-once, a stale ack id is ignored, as the service does
    stale = subscriber.pull(subscription=plain, max_messages=1, timeout=10).received_messages[0]
    subscriber.acknowledge(subscription=plain, ack_ids=[stale.ack_id])
    subscriber.acknowledge(subscription=plain, ack_ids=[stale.ack_id])


def test_exactly_once_rejects_a_stale_modify_ack_deadline(clients):
    """A deadline change or nack with an ack id that a redelivery replaced fails on an exactly-once
    subscription as an ack does (issue 32): the unary call, and the stock client's per-message futures."""
    from google.cloud.pubsub_v1.subscriber.exceptions import AcknowledgeError, AcknowledgeStatus
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    topic = clients.topic()
    subscription = clients.subscription(topic, enable_exactly_once_delivery=True)
    plain = clients.subscription(topic)
    clients.publisher.publish(topic, b"once").result(timeout=10)
    subscriber = clients.subscriber
    first = pull_one(clients, subscription)
    subscriber.modify_ack_deadline(subscription=subscription, ack_ids=[first.ack_id], ack_deadline_seconds=0)
    second = pull_one(clients, subscription)
    for seconds, ack_ids in ((30, [first.ack_id, second.ack_id]), (0, [first.ack_id])):
        with pytest.raises(exceptions.InvalidArgument) as refused:
            subscriber.modify_ack_deadline(subscription=subscription, ack_ids=ack_ids, ack_deadline_seconds=seconds)
        info = error_details_pb2.ErrorInfo()
        assert rpc_status.from_call(refused.value.response).details[0].Unpack(info)
        assert dict(info.metadata) == {first.ack_id: "PERMANENT_FAILURE_INVALID_ACK_ID"}  # only the stale one
    subscriber.acknowledge(subscription=subscription, ack_ids=[second.ack_id])
    # without exactly-once, a stale id is ignored, as the service does
    stale = pull_one(clients, plain)
    subscriber.modify_ack_deadline(subscription=plain, ack_ids=[stale.ack_id], ack_deadline_seconds=0)
    subscriber.modify_ack_deadline(subscription=plain, ack_ids=[stale.ack_id], ack_deadline_seconds=30)

    # The stock streaming subscriber: a message whose lease was ended behind its back fails its nack.
    received = queue.Queue()
    future = subscriber.subscribe(subscription, received.put)
    try:
        clients.publisher.publish(topic, b"streamed").result(timeout=10)
        held = received.get(timeout=20)
        subscriber.modify_ack_deadline(subscription=subscription, ack_ids=[held.ack_id], ack_deadline_seconds=0)
        again = received.get(timeout=20)
        assert again.message_id == held.message_id
        with pytest.raises(AcknowledgeError) as failed:
            held.nack_with_response().result(timeout=10)
        assert failed.value.error_code == AcknowledgeStatus.INVALID_ACK_ID
        assert again.ack_with_response().result(timeout=10) == AcknowledgeStatus.SUCCESS
    finally:
        future.cancel()


def test_retry_policy_backs_off_redeliveries_exponentially(clients):
    """After a nack (or an expired lease) a message waits its retry policy's backoff, doubling per
    delivery from minimum_backoff up to maximum_backoff; with ordering, its key's later ones wait too."""
    topic = clients.topic()
    policy = {"minimum_backoff": {"nanos": 400_000_000}, "maximum_backoff": {"nanos": 800_000_000}}
    subscription = clients.subscription(topic, retry_policy=policy)
    clients.publisher.publish(topic, b"retry").result(timeout=10)
    subscriber = clients.subscriber
    attempt = pull_one(clients, subscription)
    waits = []
    for _ in range(3):
        nacked = time.monotonic()
        subscriber.modify_ack_deadline(subscription=subscription, ack_ids=[attempt.ack_id], ack_deadline_seconds=0)
        attempt = pull_one(clients, subscription)
        waits.append(time.monotonic() - nacked)
    subscriber.acknowledge(subscription=subscription, ack_ids=[attempt.ack_id])
    assert 0.4 <= waits[0] < 0.75 and 0.8 <= waits[1] < 1.3 and 0.8 <= waits[2] < 1.3, waits  # 0.4, 0.8, capped

    # an expired lease backs off too
    clients.publisher.publish(topic, b"expire").result(timeout=10)
    leased = pull_one(clients, subscription)
    started = time.monotonic()  # before the call: the lease runs from when the server got it
    subscriber.modify_ack_deadline(subscription=subscription, ack_ids=[leased.ack_id], ack_deadline_seconds=1)
    pull_one(clients, subscription)
    assert time.monotonic() - started >= 1.4  # 1 s lease + 0.4 s backoff

    ordered = Clients(ordered=True)
    try:
        keyed = ordered.subscription(topic, enable_message_ordering=True, retry_policy=policy)
        for data in (b"k1", b"k2"):
            ordered.publisher.publish(topic, data, ordering_key="k")
        ordered.publisher.publish(topic, b"k3", ordering_key="k").result(timeout=10)
        batch = ordered.subscriber.pull(subscription=keyed, max_messages=10, timeout=10).received_messages
        assert [m.message.data for m in batch] == [b"k1", b"k2", b"k3"]
        nacked = time.monotonic()
        ordered.subscriber.modify_ack_deadline(subscription=keyed, ack_ids=[batch[1].ack_id], ack_deadline_seconds=0)
        ordered.subscriber.acknowledge(subscription=keyed, ack_ids=[batch[0].ack_id])
        again = []
        while len(again) < 2:
            again += ordered.subscriber.pull(subscription=keyed, max_messages=10, timeout=10).received_messages
        assert time.monotonic() - nacked >= 0.4
        assert [m.message.data for m in again] == [b"k2", b"k3"]
    finally:
        ordered.close()


def test_retry_policy_and_retention_bounds_are_the_services(clients):
    topic = clients.topic()
    subscriber = clients.subscriber

    def create(**settings):
        return subscriber.create_subscription(request={"name": subscription_path(PROJECT, unique("sub")),
                                                       "topic": topic, **settings})

    refused = {
        "minimum_backoff 601 s": {"retry_policy": {"minimum_backoff": {"seconds": 601}}},
        "maximum_backoff 601 s": {"retry_policy": {"maximum_backoff": {"seconds": 601}}},
        "a negative backoff": {"retry_policy": {"minimum_backoff": {"seconds": -1}}},
        "maximum below minimum": {"retry_policy": {"minimum_backoff": {"seconds": 20}, "maximum_backoff": {"seconds": 15}}},
        "retention of 9 minutes": {"message_retention_duration": {"seconds": 540}},
        "retention of 8 days": {"message_retention_duration": {"seconds": 8 * 86400}},
    }
    for what, settings in refused.items():
        with pytest.raises(exceptions.InvalidArgument):
            create(**settings)
            pytest.fail(f"{what} was accepted")
    defaults = create(retry_policy={})
    assert (defaults.retry_policy.minimum_backoff.total_seconds(), defaults.retry_policy.maximum_backoff.total_seconds(),
            defaults.message_retention_duration.total_seconds()) == (10, 600, 7 * 86400)
    at_limits = create(retry_policy={"minimum_backoff": {"seconds": 600}, "maximum_backoff": {"seconds": 600}},
                       message_retention_duration={"seconds": 600})
    assert at_limits.retry_policy.minimum_backoff.total_seconds() == 600
    assert not create().retry_policy  # no policy: redelivery at once
    with pytest.raises(exceptions.InvalidArgument):
        subscriber.update_subscription(
            subscription={"name": at_limits.name, "retry_policy": {"minimum_backoff": {"seconds": 700}}},
            update_mask=field_mask_pb2.FieldMask(paths=["retry_policy"]))
    assert subscriber.get_subscription(subscription=at_limits.name).retry_policy.minimum_backoff.total_seconds() == 600
    # a topic keeps messages for 10 minutes to 31 days
    for seconds in (540, 32 * 86400):
        with pytest.raises(exceptions.InvalidArgument):
            clients.publisher.create_topic(request={"name": topic_path(PROJECT, unique("topic")),
                                                    "message_retention_duration": {"seconds": seconds}})
    clients.publisher.create_topic(request={"name": topic_path(PROJECT, unique("topic")),
                                            "message_retention_duration": {"seconds": 31 * 86400}})


def test_a_publish_mixing_ordering_keys_is_refused(clients):
    """All messages of one Publish carry the same ordering key or none, or the service refuses it
    ("In a single publish request, all messages must have no ordering key or they must all have the
    same ordering key."), which is why the client libraries batch per key."""
    topic = clients.topic()
    publish = clients.publisher.api.publish
    for messages in ([{"data": b"a", "ordering_key": "k1"}, {"data": b"b", "ordering_key": "k2"}],
                     [{"data": b"a", "ordering_key": "k1"}, {"data": b"b"}]):
        with pytest.raises(exceptions.FailedPrecondition, match="same ordering key"):
            publish(topic=topic, messages=messages)
    assert len(publish(topic=topic, messages=[{"data": b"a", "ordering_key": "k"}] * 2).message_ids) == 2
    assert len(publish(topic=topic, messages=[{"data": b"a"}, {"data": b"b"}]).message_ids) == 2


def test_worst_case_delivery_reorders_and_redelivers_a_share(monkeypatch):
    """`worst_case`: subscriptions without ordering get messages out of order and a share twice (the
    same message id under another ack id); ordered keys and exactly-once subscriptions are spared."""
    from localpubsub.state import WorstCase

    with EmulatorServer("localhost", 0, worst_case=WorstCase(seed=7, redeliver_share=0.1, max_delay=0.5)) as server:
        monkeypatch.setenv("PUBSUB_EMULATOR_HOST", server.address)
        made = Clients(ordered=True)
        try:
            topic = made.topic()
            plain = made.subscription(topic)
            keyed = made.subscription(topic, enable_message_ordering=True)
            once = made.subscription(topic, enable_exactly_once_delivery=True)
            count = 300
            ids = made.publisher.api.publish(topic=topic, messages=[{"data": b"%d" % n} for n in range(count)]).message_ids
            for n in range(20):
                made.publisher.publish(topic, b"key %d" % n, ordering_key="k")
            made.publisher.publish(topic, b"last", ordering_key="k").result(timeout=10)
            received: dict[str, list] = collections.defaultdict(list)
            lock = threading.Lock()

            def collect(name):
                def callback(message):
                    with lock:
                        received[name].append(message)
                    message.ack()
                return callback

            futures_ = [made.subscriber.subscribe(s, collect(s)) for s in (plain, keyed, once)]
            try:
                assert wait_for(lambda: len({m.message_id for m in received[plain]}) == count + 21
                                and len(received[once]) >= count + 21 and len(received[keyed]) >= count + 21)
                time.sleep(1)  # the last copies arrive (max_delay 0.5 s)
            finally:
                for future in futures_:
                    future.cancel()
        finally:
            made.close()
        unordered = [m for m in received[plain] if not m.ordering_key]
        seqs = [ids.index(m.message_id) for m in unordered]
        copies = len(received[plain]) - len({m.message_id for m in received[plain]})
        inversions = sum(1 for a, b in zip(seqs, seqs[1:]) if b < a)
        print(f"\n{len(received[plain])} deliveries of {count + 21} messages: {copies} copies, "
              f"{inversions} inversions; stats {server.broker.delivery_stats()}")
        assert inversions > count // 10, "delivered in publish order"
        assert 0.03 * count <= copies <= 0.25 * count, copies
        assert [m.data for m in received[keyed] if m.ordering_key] == [b"key %d" % n for n in range(20)] + [b"last"]
        assert len(received[keyed]) == count + 21  # no copies: a spare, ordered subscription's unkeyed ones too
        assert len(received[once]) == count + 21  # no copies with exactly-once delivery
        stats = server.broker.delivery_stats()
        assert stats["duplicates"] == copies and stats["out_of_order"] > 0


def test_data_dir_keeps_topics_subscriptions_and_unacked_messages(monkeypatch, tmp_path):
    """With a data directory a restarted server has its topics, subscriptions (settings too) and
    every unacked message, with their ids: a stock subscriber carries on, none is lost (issue 32)."""
    data = tmp_path / "pubsub"
    server = EmulatorServer("localhost", 0, data_dir=data).start()
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", server.address)
    port = server.port
    made = Clients()
    replacement = None
    received = []
    try:
        topic = made.topic()
        dropped = made.topic()
        made.publisher.delete_topic(topic=dropped)
        pulled = made.subscription(topic, filter='attributes.keep = "1"', retry_policy={"minimum_backoff": {"seconds": 1}})
        streamed = made.subscription(topic)
        gone = made.subscription(topic)
        made.subscriber.delete_subscription(subscription=gone)
        ids = made.publisher.api.publish(topic=topic, messages=[
            {"data": b"%d" % n, "attributes": {"keep": "1" if n % 2 else "0"}} for n in range(6)]).message_ids
        first = made.subscriber.pull(subscription=pulled, max_messages=2, timeout=10).received_messages
        assert [m.message.data for m in first] == [b"1", b"3"]
        made.subscriber.acknowledge(subscription=pulled, ack_ids=[first[0].ack_id])  # "3" stays leased
        streaming = made.subscriber.subscribe(
            streamed, lambda m: (received.append(m.message_id), m.ack() if m.data != b"4" else None))
        assert wait_for(lambda: len(received) == 6)
        server.stop()
        locked = EmulatorServer("localhost", 0, data_dir=data)  # the stopped server let go of it
        try:
            with pytest.raises(OSError, match="in use"):  # one server per data directory
                EmulatorServer("localhost", 0, data_dir=data)
        finally:
            locked.broker.close()

        replacement = EmulatorServer("localhost", port, data_dir=data).start()
        assert {t.name for t in made.publisher.list_topics(project=f"projects/{PROJECT}")} == {topic}
        config = made.subscriber.get_subscription(subscription=pulled)
        assert config.filter == 'attributes.keep = "1"' and config.retry_policy.minimum_backoff.total_seconds() == 1
        with pytest.raises(exceptions.NotFound):
            made.subscriber.get_subscription(subscription=gone)
        again = []
        while len(again) < 2:
            again += made.subscriber.pull(subscription=pulled, max_messages=10, timeout=10).received_messages
        assert [(m.message.message_id, m.message.data) for m in again] == [(ids[3], b"3"), (ids[5], b"5")]
        # the stock subscriber reconnected on its own; the one message it never acked comes again
        restarted = time.monotonic()
        assert wait_for(lambda: received.count(ids[4]) >= 2, timeout=30)
        print(f"redelivered {time.monotonic() - restarted:.1f} s after the restart")
        after = made.publisher.publish(topic, b"after", keep="0").result(timeout=20)
        assert int(after) > int(ids[-1])
        assert wait_for(lambda: after in received, timeout=30)
        assert not streaming.done()
        streaming.cancel()
        streaming.result(timeout=10)
    finally:
        made.close()
        server.stop()
        if replacement is not None:
            replacement.stop()


def test_subscription_admin_round_trip(clients):
    topic = clients.topic()
    dead_letter_topic = clients.topic()
    subscription = clients.subscription(topic, ack_deadline_seconds=0)
    subscriber = clients.subscriber
    assert subscriber.get_subscription(subscription=subscription).ack_deadline_seconds == 10
    assert list(clients.publisher.list_topic_subscriptions(topic=topic)) == [subscription]
    assert subscription in {s.name for s in subscriber.list_subscriptions(project=f"projects/{PROJECT}")}
    paged = clients.publisher.list_topics(request={"project": f"projects/{PROJECT}", "page_size": 1})
    assert sorted(t.name for t in paged) == sorted([topic, dead_letter_topic])

    updated = subscriber.update_subscription(
        subscription={
            "name": subscription,
            "ack_deadline_seconds": 30,
            "dead_letter_policy": {"dead_letter_topic": dead_letter_topic},
            "labels": {"ignored": "not in the mask"},
        },
        update_mask=field_mask_pb2.FieldMask(paths=["ack_deadline_seconds", "dead_letter_policy"]),
    )
    assert updated.ack_deadline_seconds == 30
    assert updated.dead_letter_policy.max_delivery_attempts == 5  # the service's default
    assert not updated.labels
    with pytest.raises(exceptions.InvalidArgument):
        subscriber.update_subscription(
            subscription={"name": subscription, "enable_message_ordering": True},
            update_mask=field_mask_pb2.FieldMask(paths=["enable_message_ordering"]),
        )
    with pytest.raises(exceptions.InvalidArgument):
        subscriber.update_subscription(subscription={"name": subscription}, update_mask=field_mask_pb2.FieldMask())

    clients.publisher.delete_topic(topic=topic)
    assert subscriber.get_subscription(subscription=subscription).topic == "_deleted-topic_"
    subscriber.delete_subscription(subscription=subscription)
    with pytest.raises(exceptions.NotFound):
        subscriber.get_subscription(subscription=subscription)


def test_filter_acknowledges_what_does_not_match(clients):
    topic = clients.topic()
    subscription = clients.subscription(topic, filter='attributes.lang = "en" AND NOT attributes:spam')
    for lang, spam in [("en", False), ("fr", False), ("en", True)]:
        extra = {"spam": "1"} if spam else {}
        clients.publisher.publish(topic, f"{lang}{spam}".encode(), lang=lang, **extra).result(timeout=10)
    pulled = clients.subscriber.pull(subscription=subscription, max_messages=10, timeout=10).received_messages
    assert [m.message.data for m in pulled] == [b"enFalse"]


@pytest.mark.parametrize(
    ("expression", "attributes", "expected"),
    [
        ('attributes.lang = "en"', {"lang": "en"}, True),
        ('attributes.lang != "en"', {}, True),
        ('attributes:"odd key"', {"odd key": ""}, True),
        ('hasPrefix(attributes.chat-id, "c-")', {"chat-id": "c-42"}, True),
        ('-attributes:spam OR (attributes.a = "1" AND attributes.b = "2")', {"spam": "1", "a": "1", "b": "2"}, True),
        ('NOT (attributes:a OR attributes:b)', {"b": "x"}, False),
    ],
)
def test_filter_language(expression, attributes, expected):
    assert compile_filter(expression)(attributes) is expected


@pytest.mark.parametrize("expression", ['attributes.a = 1', 'data = "x"', 'attributes.a = "1" AND', "(attributes:a"])
def test_filter_syntax_errors_are_invalid_arguments(expression):
    with pytest.raises(EmulatorError) as raised:
        compile_filter(expression)
    assert raised.value.code.name == "INVALID_ARGUMENT"


def test_pubsub_init_creates_the_layout_idempotently(pubsub_server):
    env = {**os.environ, "PUBSUB_EMULATOR_HOST": pubsub_server}
    result = subprocess.run(
        [str(CHATLENS), "pubsub-init", "--project", PROJECT], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    expected_topics = {topic_path(PROJECT, t) for t in LAYOUT.topics()}
    expected_subscriptions = {subscription_path(PROJECT, s) for s in LAYOUT.subscriptions()}
    created = {line.removeprefix("created ") for line in result.stdout.splitlines() if line.startswith("created ")}
    assert created == expected_topics | expected_subscriptions

    assert ensure_layout(PROJECT, emulator_host=pubsub_server) == []  # idempotent
    publisher, subscriber = admin_clients(pubsub_server)
    try:
        assert {t.name for t in publisher.list_topics(project=f"projects/{PROJECT}")} == expected_topics
        listed = {s.name: s for s in subscriber.list_subscriptions(project=f"projects/{PROJECT}")}
        # A subscription made before the dashboard's got a dead-letter policy gets it from the next run.
        insights = subscription_path(PROJECT, LAYOUT.insights_subscription)
        subscriber.update_subscription(request={"subscription": {"name": insights, "dead_letter_policy": {}},
                                                "update_mask": {"paths": ["dead_letter_policy"]}})
        assert not subscriber.get_subscription(subscription=insights).dead_letter_policy.dead_letter_topic
        assert ensure_layout(PROJECT, emulator_host=pubsub_server) == []
        repaired = subscriber.get_subscription(subscription=insights).dead_letter_policy
    finally:
        publisher.transport.close()
        subscriber.close()
    assert {name: s.topic for name, s in listed.items()} == {
        subscription_path(PROJECT, s): topic_path(PROJECT, t) for s, t in LAYOUT.subscriptions().items()
    }
    # The dashboard's subscriptions give up on a message after a bounded number of deliveries.
    policies = {name: (s.dead_letter_policy.dead_letter_topic, s.dead_letter_policy.max_delivery_attempts)
                for name, s in listed.items() if s.dead_letter_policy.dead_letter_topic}
    undeliverable = topic_path(PROJECT, LAYOUT.undeliverable_topic)
    assert policies == {subscription_path(PROJECT, s): (undeliverable, LAYOUT.max_delivery_attempts)
                        for s in (LAYOUT.insights_subscription, LAYOUT.deadletter_subscription)}
    assert (repaired.dead_letter_topic, repaired.max_delivery_attempts) == (undeliverable, LAYOUT.max_delivery_attempts)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


def test_check_command_reports_readiness(pubsub_server):
    ok = subprocess.run(
        [str(CHATLENS), "pubsub-emulator", "--check", pubsub_server, "--timeout", "10"],
        capture_output=True, text=True, timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    down = subprocess.run(
        [str(CHATLENS), "pubsub-emulator", "--check", f"localhost:{free_port()}", "--timeout", "1"],
        capture_output=True, text=True, timeout=60,
    )
    assert down.returncode == 1
    assert "no Pub/Sub server answered" in down.stderr


def test_command_serves_until_sigterm():
    process = subprocess.Popen(
        [str(CHATLENS), "pubsub-emulator", "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        line = process.stdout.readline()
        assert "listening on" in line, line + process.stderr.read()
        address = line.split("listening on ")[1].split()[0]
        wait_ready(address, timeout=10)
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
            raise AssertionError(f"still running 15 s after SIGTERM; it printed:\n{out}\n{err}") from None
        assert code == 0, process.stderr.read()
        assert "Pub/Sub emulator stopping" in process.stdout.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
