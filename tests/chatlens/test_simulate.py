"""`chatlens simulate` publishes the bundled demo chats with the real client, and they are valid."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

from chatlens.config import LAYOUT, subscription_path
from chatlens.contracts import parse_message, parse_window
from chatlens.simulate import DEMO_CHATS, load_chats
from cli.main import main
from pipeline.corpus import SPLITS, load_split


def test_demo_chats_are_valid_and_disjoint_from_the_test_data():
    demo = load_chats(DEMO_CHATS)
    assert len(demo) >= 60
    test_texts = {m.text for split in SPLITS for e in load_split(split) for m in e.window.messages}
    for line in (DEMO_CHATS.parents[2] / "tests" / "data" / "e2e_windows.jsonl").read_text().splitlines():
        test_texts |= {m["text"] for m in json.loads(line)["messages"]}
    assert not test_texts & {m.text for w in demo for m in w.messages}


def test_simulate_publishes_windows_and_streamed_chats(pubsub_server, monkeypatch):
    from google.cloud import pubsub_v1

    from localpubsub.admin import ensure_layout

    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", pubsub_server)
    ensure_layout("chatlens-local")
    assert main(["simulate", "--count", "6", "--rate", "6000", "--message-gap", "0", "--streamed-share", "0.5"]) == 0
    subscriber = pubsub_v1.SubscriberClient()

    def drain(subscription: str) -> list:
        received = []
        while batch := subscriber.pull(subscription=subscription_path("chatlens-local", subscription),
                                       max_messages=100, timeout=10).received_messages:
            received += batch
        return received

    windows = drain(LAYOUT.windows_subscription)
    messages = drain(LAYOUT.messages_subscription)
    for item in windows:
        parse_window(item.message.data)
    for item in messages:
        parse_message(item.message.data)
    closed_chats = {m.message.attributes["chat_id"] for m in messages if m.message.attributes["closed"] == "true"}
    assert len(windows) + len(closed_chats) == 6 and windows and closed_chats
    # Re-timed to now: the dashboard shows them waiting seconds, not the weeks since they were written.
    now = datetime.now(timezone.utc)
    sent = [parse_window(w.message.data).messages[-1].sent_at for w in windows]
    sent += [parse_message(m.message.data).sent_at for m in messages if m.message.attributes["closed"] == "true"]
    assert all(now - timedelta(minutes=2) < t <= now for t in sent), sent
