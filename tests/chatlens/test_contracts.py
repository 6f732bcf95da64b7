"""The message contracts: strict, limited, with reasons a person can act on."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest

from chatlens.contracts import (
    ANALYSIS_FIELDS,
    MAX_WINDOW_MESSAGES,
    ChatAnalysis,
    ChatInsight,
    ChatWindow,
    ContractError,
    DeadLetter,
    parse_message,
    parse_window,
)
from chatlens.schemas import render_schemas, stale_schemas

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=timezone.utc)


def message(i: int = 0, text: str = "my order is late", chat_id: str = "c-1", sender: str = "customer") -> dict:
    return {
        "chat_id": chat_id, "message_id": f"m{i}", "sender": sender, "user_id": "u-1",
        "text": text, "sent_at": (T0 + timedelta(seconds=i)).isoformat(),
    }


def window(**overrides) -> dict:
    data = {"chat_id": "c-1", "window_id": "w1", "customer_id": "u-1", "messages": [message(0), message(1)]}
    data.update(overrides)
    return data


def test_valid_window_round_trips_through_json():
    parsed = parse_window(json.dumps(window(tenant="quickbite", language="de")))
    assert parsed.messages[1].sent_at == T0 + timedelta(seconds=1)
    assert parse_window(parsed.model_dump_json()) == parsed


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\xff\xfe not json", "not JSON"),
        (b'{"chat_id": "c-1"', "not JSON"),
        (json.dumps(window(messages=[])).encode(), "messages: List should have at least 1 item"),
        (json.dumps(window(extra_field=1)).encode(), "extra_field: Extra inputs are not permitted"),
        (json.dumps(window(chat_id="")).encode(), "chat_id"),
        (json.dumps(window(chat_id="a b")).encode(), "chat_id"),
        (json.dumps(window(messages=[message(i) for i in range(MAX_WINDOW_MESSAGES + 1)])).encode(),
         "at most 200 items"),
        (json.dumps(window(messages=[message(0, "x" * 7000), *[message(i, "y" * 7000) for i in range(1, 11)]])).encode(),
         "more than the 65536 allowed"),
        (json.dumps(window(messages=[message(1), message(0)])).encode(), "older than the message before it"),
        (json.dumps(window(messages=[message(0, chat_id="other")])).encode(), "belongs to chat 'other'"),
        (json.dumps(window(messages=[message(0, "   ")])).encode(), "no text to analyse"),
        (json.dumps(window(messages=[{**message(0), "sender": "robot"}])).encode(), "sender"),
        (json.dumps(window(messages=[{**message(0), "sent_at": "2026-11-02T09:00:00"}])).encode(), "timezone"),
        (json.dumps(window(schema_version=2)).encode(), "schema_version"),
        (json.dumps(window(closed="yes")).encode(), "closed"),
    ],
)
def test_bad_windows_are_rejected_with_a_reason(payload, reason):
    with pytest.raises(ContractError) as caught:
        parse_window(payload)
    assert reason in str(caught.value)


def test_message_contract():
    parsed = parse_message(json.dumps(message(3, "hi 👋", sender="agent")))
    assert parsed.sender == "agent"
    with pytest.raises(ContractError, match="text"):
        parse_message(json.dumps(message(0, "x" * 8001)))


def insight(**overrides) -> dict:
    data = {
        "chat_id": "c-1", "window_id": "w1", "customer_id": "u-1", "sentiment": -1, "confidence": 0.7,
        "scores": {"negative": 0.7, "neutral": 0.2, "positive": 0.1}, "summary": "Late order.",
        "reply_draft": "Sorry about the delay.", "model_id": "gemma3-270m", "prompt_version": "v1",
        "published_at": T0.isoformat(), "analyzed_at": T0.isoformat(), "transcript": [message(0)],
    }
    data.update(overrides)
    return data


def test_insight_contract_limits_and_consistency():
    parsed = ChatInsight.model_validate_json(json.dumps(insight()))
    assert parsed.sentiment == -1
    for bad, reason in [
        (insight(summary="s" * 513), "summary"),
        (insight(sentiment=2), "sentiment"),
        (insight(sentiment=1), "highest probability"),
        (insight(scores={"negative": 0.7, "neutral": 0.7, "positive": 0.1}), "sum to"),
    ]:
        with pytest.raises(Exception, match=reason):
            ChatInsight.model_validate_json(json.dumps(bad))


def test_the_model_outputs_are_declared_once_and_carried_by_every_insight():
    assert ANALYSIS_FIELDS == tuple(ChatAnalysis.model_fields)
    assert {"sentiment", "confidence", "scores", "summary", "reply_draft", "flags"} <= set(ANALYSIS_FIELDS)
    assert issubclass(ChatInsight, ChatAnalysis)
    for name in ANALYSIS_FIELDS:
        assert repr(ChatInsight.model_fields[name]) == repr(ChatAnalysis.model_fields[name]), name
    parsed = ChatInsight.model_validate_json(json.dumps(insight()))
    analysis = ChatAnalysis.model_validate(parsed.model_dump(include=set(ANALYSIS_FIELDS)))
    assert analysis.model_dump() == parsed.model_dump(include=set(ANALYSIS_FIELDS))
    with pytest.raises(Exception, match="highest probability"):  # checked on the analysis alone too
        ChatAnalysis.model_validate(analysis.model_dump() | {"sentiment": 1})
    # The window's identity still leads a published insight, as before the analysis had a class.
    assert list(json.loads(parsed.model_dump_json()))[:8] == [
        "schema_version", "chat_id", "window_id", "tenant", "language", "customer_id", "closed", "sentiment"]


def test_the_contracts_need_neither_a_database_nor_a_web_framework():
    code = ("import sys, chatlens.contracts; "
            "print(sorted(m for m in ('sqlalchemy', 'fastapi', 'alembic', 'starlette') if m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"


def test_dead_letter_keeps_the_exact_payload_as_base64():
    raw = b"\x00\xffnot json"
    letter = DeadLetter.from_exception(raw, "validate", ContractError("not JSON: x"), {"k": "v"})
    data = json.loads(letter.model_dump_json())
    assert base64.b64decode(data["payload"]) == raw
    assert data["error_class"] == "ContractError" and data["stage"] == "validate"
    assert DeadLetter.model_validate_json(letter.model_dump_json()).payload == raw


def test_long_error_messages_are_shortened_visibly():
    letter = DeadLetter.from_exception(b"x", "model", RuntimeError("e" * 5000))
    assert len(letter.error_message) <= 2000 and letter.error_message.endswith("(shortened)")


def test_committed_json_schemas_match_the_contracts():
    assert stale_schemas() == [], "run `chatlens schemas --write`"
    schema = json.loads(render_schemas()["chat_window.schema.json"])
    assert schema["properties"]["messages"]["maxItems"] == MAX_WINDOW_MESSAGES
