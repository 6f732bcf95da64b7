"""`chatlens replay`: stored dead letters go back to their input topic, through the real local
Pub/Sub server and a real SQLite dashboard database, once each."""

from __future__ import annotations

import json
from datetime import datetime, timezone

from app.crud.ingest import ingest_dead_letter
from app.db import Database
from chatlens.config import LAYOUT, subscription_path
from chatlens.contracts import DeadLetter
from cli.main import main

from tests.support.pipeline import PROJECT, Collector, e2e_malformed, e2e_windows, message_json, wait_until


def letter(payload: bytes, stage: str, **attributes: str) -> bytes:
    return DeadLetter(payload=payload, attributes=attributes, stage=stage, error_class="RuntimeError",
                      error_message="model endpoint down", chat_id=None,
                      failed_at=datetime.now(timezone.utc)).model_dump_json().encode()


def test_replay_sends_fixable_dead_letters_back_once(emulator, tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'dashboard.db'}"
    db = Database(url, search_backend="like")
    db.upgrade()
    window, malformed = e2e_windows()[0], e2e_malformed()[0]
    message = message_json("m-1", 1, "hello?", datetime(2026, 11, 20, 9, 0, tzinfo=timezone.utc))
    for data, stage in ((window, "inference"), (message, "reply"), (malformed, "validate"),
                        (b"not json at all", "inference")):
        ingest_dead_letter(db, letter(data, stage, source="crm"), message_id=f"dl-{stage}-{len(data)}",
                           attributes={"stage": stage})
    db.dispose()
    windows = Collector(subscription_path(PROJECT, LAYOUT.windows_subscription))
    messages = Collector(subscription_path(PROJECT, LAYOUT.messages_subscription))
    try:
        assert main(["replay", "--database-url", url, "--project", PROJECT]) == 0  # a dry run
        out = capsys.readouterr().out
        assert out.count("would ") == 2 and "skip" in out and "validate" not in out
        assert not wait_until(lambda: len(windows) + len(messages) > 0, 2, interval=0.5)

        assert main(["replay", "--database-url", url, "--project", PROJECT, "--yes"]) == 0
        assert wait_until(lambda: len(windows) == 1 and len(messages) == 1, 30, interval=0.5)
        [(data, attributes)] = windows.messages
        assert data == window and attributes["source"] == "crm" and attributes["replayed_from"]
        assert not any(key.startswith("pubsub.") or key == "stage" for key in attributes)
        assert messages.messages[0][0] == message

        assert main(["replay", "--database-url", url, "--project", PROJECT, "--yes"]) == 0  # nothing twice
        assert "0 replayed" in capsys.readouterr().err
        assert main(["replay", "--database-url", url, "--project", PROJECT, "--stage", "validate", "--yes"]) == 0
        assert "skip" in capsys.readouterr().out  # a broken payload is never sent back
        assert not wait_until(lambda: len(windows) + len(messages) > 2, 2, interval=0.5)
    finally:
        windows.close()
        messages.close()
    db = Database(url, search_backend="like")
    with db.read() as session:
        from app.crud import audit

        entries = [e for e in audit.list_entries(session) if e.action == "replay"]
    assert sorted(e.after["topic"] for e in entries) == sorted([LAYOUT.windows_topic, LAYOUT.messages_topic])
    assert all(json.dumps(e.before) and e.actor == "chatlens replay" for e in entries)
