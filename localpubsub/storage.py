"""Optional state on disk (`--data-dir`): topics, subscriptions and unacked messages survive a restart.

One append-only journal, DIR/journal.jsonl, one JSON object a line, written as the broker
changes (under its lock) and replayed in order on start:

    {"op": "topic", "topic": B64}              a topic created or updated (a serialized Topic)
    {"op": "del_topic", "name": NAME}
    {"op": "sub", "sub": B64}                  a subscription created or updated (a Subscription)
    {"op": "del_sub", "name": NAME}
    {"op": "pub", "msgs": [[B64, [SUB, ...]], ...]}   one Publish: each message and the subscriptions it went to
    {"op": "ack", "sub": NAME, "ids": [MESSAGE_ID, ...]}  acked (or dead-lettered) there

After the replay the journal is rewritten as the live state alone (and again whenever it
has grown to several times that). Leases, delivery attempts and backoffs are not kept: a
restarted server delivers every unacked message again, as the service may after any outage.

Each line is flushed to the operating system at once, so a killed server (kill -9) loses
nothing; lines are not fsynced, so a crash of the machine itself may lose the last ones.
A torn last line (a kill mid-write) is ignored. A lock file keeps a second server off the
same directory.
"""

from __future__ import annotations

import base64
import fcntl
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from localpubsub.protos import PubsubMessage, Subscription, Topic

log = logging.getLogger("localpubsub.emulator")

COMPACT_MIN_RECORDS = 10_000  # rewrite once the journal has this many lines past the last rewrite...
COMPACT_FACTOR = 4  # ...and more than this many times the live messages


def _encode(message) -> str:
    return base64.b64encode(message.SerializeToString()).decode("ascii")


def _decode(kind, text: str):
    return kind.FromString(base64.b64decode(text))


class Snapshot:
    """What a journal holds: topics, subscriptions, and each unacked message with the subscriptions it waits in."""

    def __init__(self):
        self.topics: dict[str, Topic] = {}
        self.subscriptions: dict[str, Subscription] = {}
        self._pending: dict[str, dict[str, None]] = {}  # subscription -> message ids, in publish order
        self._messages: dict[str, PubsubMessage] = {}

    def apply(self, record: dict) -> None:
        op = record["op"]
        if op == "topic":
            topic = _decode(Topic, record["topic"])
            self.topics[topic.name] = topic
        elif op == "del_topic":
            self.topics.pop(record["name"], None)
        elif op == "sub":
            subscription = _decode(Subscription, record["sub"])
            self.subscriptions[subscription.name] = subscription
            self._pending.setdefault(subscription.name, {})
        elif op == "del_sub":
            self.subscriptions.pop(record["name"], None)
            self._pending.pop(record["name"], None)
        elif op == "pub":
            for data, names in record["msgs"]:
                message = _decode(PubsubMessage, data)
                for name in names:
                    if name in self._pending:
                        self._pending[name][message.message_id] = None
                        self._messages[message.message_id] = message
        elif op == "ack":
            pending = self._pending.get(record["sub"])
            if pending is not None:
                for message_id in record["ids"]:
                    pending.pop(message_id, None)
        else:
            raise ValueError(f"unknown journal record {op!r}")

    def messages(self) -> list[tuple[PubsubMessage, list[str]]]:
        """The unacked messages in publish order, each with the subscriptions that still hold it."""
        holders: dict[str, list[str]] = {}
        for name, pending in self._pending.items():
            for message_id in pending:
                holders.setdefault(message_id, []).append(name)
        return [(self._messages[i], holders[i]) for i in sorted(holders, key=int)]


class Journal:
    """The broker's state in `directory`; see the module's docstring for the format."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / "journal.jsonl"
        self._lock_file = open(self.directory / "lock", "a+")  # noqa: SIM115 - held until close()
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock_file.close()
            raise OSError(f"data directory {self.directory} is in use by another Pub/Sub server") from None
        self._file = None
        self.records = 0  # lines written since the last rewrite

    def load(self) -> Snapshot:
        """Replay the journal (nothing there: an empty snapshot)."""
        snapshot = Snapshot()
        if not self.path.exists():
            return snapshot
        with self.path.open("rb") as file:
            lines = file.read().split(b"\n")
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                if number >= len(lines) - 1:  # the last line, torn by a kill mid-write
                    log.warning("ignoring a torn last line in %s", self.path)
                    break
                raise ValueError(f"{self.path}:{number} is not a journal record") from None
            snapshot.apply(record)
        return snapshot

    def rewrite(self, topics: Iterable[Topic], subscriptions: Iterable[Subscription],
                messages: Iterable[tuple[PubsubMessage, list[str]]]) -> None:
        """Replace the journal by the given live state, atomically."""
        temporary = self.path.with_suffix(".tmp")
        with temporary.open("w", encoding="utf-8") as file:
            for topic in topics:
                file.write(json.dumps({"op": "topic", "topic": _encode(topic)}) + "\n")
            for subscription in subscriptions:
                file.write(json.dumps({"op": "sub", "sub": _encode(subscription)}) + "\n")
            batch: list = []
            for message, names in messages:
                batch.append([_encode(message), names])
                if len(batch) == 1000:
                    file.write(json.dumps({"op": "pub", "msgs": batch}) + "\n")
                    batch = []
            if batch:
                file.write(json.dumps({"op": "pub", "msgs": batch}) + "\n")
            file.flush()
            os.fsync(file.fileno())
        if self._file is not None:
            self._file.close()
        os.replace(temporary, self.path)
        self._file = self.path.open("a", encoding="utf-8")
        self.records = 0

    def needs_rewrite(self, live_messages: int) -> bool:
        return self.records >= COMPACT_MIN_RECORDS and self.records > COMPACT_FACTOR * live_messages

    # Records ------------------------------------------------------------------------

    def _append(self, record: dict) -> None:
        if self._file is None:
            self._file = self.path.open("a", encoding="utf-8")
        self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
        self._file.flush()
        self.records += 1

    def topic(self, topic: Topic) -> None:
        self._append({"op": "topic", "topic": _encode(topic)})

    def delete_topic(self, name: str) -> None:
        self._append({"op": "del_topic", "name": name})

    def subscription(self, subscription: Subscription) -> None:
        self._append({"op": "sub", "sub": _encode(subscription)})

    def delete_subscription(self, name: str) -> None:
        self._append({"op": "del_sub", "name": name})

    def publish(self, messages: list[tuple[PubsubMessage, list[str]]]) -> None:
        if messages:
            self._append({"op": "pub", "msgs": [[_encode(m), names] for m, names in messages]})

    def ack(self, subscription: str, message_ids: list[str]) -> None:
        if message_ids:
            self._append({"op": "ack", "sub": subscription, "ids": message_ids})

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if not self._lock_file.closed:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()
