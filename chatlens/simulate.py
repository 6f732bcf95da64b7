"""Publish realistic support chats to Pub/Sub, as ChatWindows and message by message.

Reads a bundled set of chats (chatlens/data/demo_chats.jsonl, disjoint from the test data)
or your own JSON Lines file, and publishes them at `--rate` chats per minute with the real
google-cloud-pubsub client: some as whole ChatWindows on the windows topic, the rest as
ChatMessages on the messages topic, one message at a time, the last one marked closed.
Works against the local server (PUBSUB_EMULATOR_HOST) or real Pub/Sub (--project).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from chatlens.config import DEFAULT_PROJECT, LAYOUT, topic_path
from chatlens.contracts import CLOSED_ATTRIBUTE, ChatWindow, parse_window, to_json_bytes

DEMO_CHATS = Path(__file__).parent / "data" / "demo_chats.jsonl"


def load_chats(path: Path) -> list[ChatWindow]:
    return [parse_window(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def replay(window: ChatWindow, round_number: int, now: datetime) -> ChatWindow:
    """A copy happening now (its last message at `now`, the gaps kept, so the queue's waiting
    times are real) with ids unique to this round (so the pipeline's dedup keeps repeats)."""
    chat_id = f"{window.chat_id}-r{round_number}" if round_number else window.chat_id
    shift = now - window.messages[-1].sent_at
    messages = [m.model_copy(update={"chat_id": chat_id, "sent_at": m.sent_at + shift}) for m in window.messages]
    return window.model_copy(update={"chat_id": chat_id, "messages": messages})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--project", default=DEFAULT_PROJECT, help="project id (default: %(default)s)")
    parser.add_argument("--data", type=Path, default=DEMO_CHATS, help="ChatWindows, JSON Lines (default: bundled demo set)")
    parser.add_argument("--rate", type=float, default=6.0, help="chats per minute (default: %(default)s)")
    parser.add_argument("--count", type=int, default=0, help="chats to publish; 0 = forever (default: %(default)s)")
    parser.add_argument("--streamed-share", type=float, default=0.3,
                        help="share of chats sent message by message (default: %(default)s)")
    parser.add_argument("--message-gap", type=float, default=1.0,
                        help="seconds between the messages of a streamed chat (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=7, help="random seed for the order (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    from google.cloud import pubsub_v1

    chats = load_chats(args.data)
    rng = random.Random(args.seed)
    publisher = pubsub_v1.PublisherClient()
    windows_topic = topic_path(args.project, LAYOUT.windows_topic)
    messages_topic = topic_path(args.project, LAYOUT.messages_topic)
    sent = {"windows": 0, "streamed": 0}
    order = itertools.count()
    try:
        for number in order:
            if args.count and number >= args.count:
                break
            round_number, index = divmod(number, len(chats))
            if index == 0:
                rng.shuffle(chats)
            window = replay(chats[index], round_number, datetime.now(timezone.utc))
            started = time.monotonic()
            if rng.random() < args.streamed_share:
                for i, message in enumerate(window.messages):
                    closed = "true" if i == len(window.messages) - 1 else "false"
                    publisher.publish(messages_topic, to_json_bytes(message), chat_id=message.chat_id,
                                      **{CLOSED_ATTRIBUTE: closed}).result(timeout=30)
                    time.sleep(args.message_gap)
                sent["streamed"] += 1
            else:
                publisher.publish(windows_topic, to_json_bytes(window), chat_id=window.chat_id).result(timeout=30)
                sent["windows"] += 1
            print(f"sent {window.chat_id} ({sent['windows']} windows, {sent['streamed']} streamed chats)",
                  flush=True)
            time.sleep(max(0.0, 60.0 / args.rate - (time.monotonic() - started)))
    except KeyboardInterrupt:
        pass
    print(json.dumps({"simulated": sent}), file=sys.stderr)
    return 0
