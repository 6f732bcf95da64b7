"""PublishFn against the real local Pub/Sub server and the real google-cloud-pubsub client."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone

import pytest

from chatlens.config import LAYOUT
from chatlens.contracts import DeadLetter
from pipeline.io.publish import PublishFn
from pipeline.transforms.records import Output
from tests.support.pipeline import PROJECT, Collector, wait_until


def dead_letter(n: int) -> Output:
    return Output(DeadLetter(payload=b"{not json", stage="parse", error_class="ValueError",
                             error_message=f"bad {n}", failed_at=datetime.now(timezone.utc)), {"n": str(n)})


def test_a_bundle_waits_for_a_topic_that_comes_back_and_publishes_it_all(pubsub_server, pubsub_broker, monkeypatch):
    """A restarted server serves no topics until its layout is made again: the bundle keeps trying
    rather than failing at once (the runner retries a failed bundle only a few times)."""
    from localpubsub.admin import ensure_layout

    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", pubsub_server)
    # The layout is made topics first, subscriptions next: a publish that lands in between goes to
    # a topic with no subscription and is delivered to no one, as in Pub/Sub. Publishes wait at this
    # gate while the layout is made, so the test sees the layout appear at once.
    gate, publish = threading.Lock(), pubsub_broker.publish

    def publish_through_gate(topic, messages):
        with gate:
            return publish(topic, messages)

    monkeypatch.setattr(pubsub_broker, "publish", publish_through_gate)
    topic = f"projects/{PROJECT}/topics/{LAYOUT.deadletter_topic}"
    fn = PublishFn(topic, "dead_letters")
    fn.setup()
    made = {}

    def make_layout_later():
        time.sleep(3)
        with gate:
            ensure_layout(PROJECT)
            made["collector"] = Collector(f"projects/{PROJECT}/subscriptions/{LAYOUT.deadletter_subscription}")
            made["at"] = time.monotonic()

    later = threading.Thread(target=make_layout_later)
    try:
        fn.start_bundle()
        later.start()
        for n in range(3):
            fn.process(dead_letter(n))
        fn.finish_bundle()
        finished = time.monotonic()
        later.join(30)
        assert finished >= made["at"], "the bundle finished before its topic existed"
        # Every try before the layout was turned away: all three were published after it came back
        collector = made["collector"]
        assert wait_until(lambda: len(collector) == 3, 30), "three dead letters delivered"
        assert sorted(a["n"] for a in collector.attributes()) == ["0", "1", "2"]
        collector.close()
    finally:
        later.join(30)
        fn.teardown()


def test_a_topic_that_never_comes_fails_the_bundle(pubsub_server, monkeypatch):
    """NotFound is retried only for a while: then the bundle fails, and nothing of it is settled."""
    import pipeline.io.publish as publish

    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", pubsub_server)
    monkeypatch.setattr(publish, "PUBLISH_TIMEOUT", 3.0)
    monkeypatch.setattr(publish, "PUBLISH_RETRY", publish.PUBLISH_RETRY.with_timeout(2.0))
    fn = PublishFn(f"projects/{PROJECT}/topics/never-made", "dead_letters")
    fn.setup()
    try:
        fn.start_bundle()
        fn.process(dead_letter(0))
        with pytest.raises(Exception) as failed:
            fn.finish_bundle()
        assert "not found" in str(failed.value).lower() or isinstance(failed.value, TimeoutError)
    finally:
        fn.teardown()
