"""The message contracts: strict, limited, with reasons a person can act on."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chatlens.contracts import (
    ANALYSIS_FIELDS,
    MAX_ERROR_CHARS,
    MAX_WINDOW_MESSAGES,
    ChatAnalysis,
    ChatInsight,
    ChatMessage,
    ChatWindow,
    ContractError,
    DeadLetter,
    json_object,
    parse_message,
    parse_window,
    to_json_bytes,
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


# ---- no byte string breaks the parser (issue 32) -------------------------------------------------
# Pub/Sub delivers whatever anyone published: a parser that raised anything but ContractError
# would fail the pipeline's bundle, which a streaming runner retries forever.

@pytest.mark.parametrize("parse", [parse_window, parse_message])
@pytest.mark.parametrize(("payload", "reason"), [
    (b"[" * 100_000, "nested too deeply"),  # 100 kB, well inside the size limit: was a RecursionError
    (b"{\"a\": " * 50_000, "nested too deeply"),
    (b"[" * 1_000 + b"]" * 1_000, "nested too deeply"),  # valid JSON, too deep for Python's json module
    (b"1" * 5_000, "not JSON"),  # was a ValueError (int digit limit), not a ContractError
    (b'{"chat_id": ' + b"9" * 5_000 + b"}", "not JSON"),
    (b"NaN", "should be an object"),
    ('{"chat_id": "\ud800"}', "not JSON"),  # a str with a lone surrogate: was a UnicodeEncodeError
])
def test_malformed_input_of_any_shape_is_a_contract_error_with_a_reason(parse, payload, reason):
    with pytest.raises(ContractError) as caught:
        parse(payload)
    assert reason in str(caught.value) and len(str(caught.value)) < 500


def test_json_object_never_raises():
    assert json_object(b'{"chat_id": "c-1"}') == {"chat_id": "c-1"}
    for payload in (b"[" * 100_000, b"1" * 5_000, b"\xff", b"[1]", b"", "\ud800"):
        assert json_object(payload) is None


EXAMPLES = settings(max_examples=150, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
field_names = st.sampled_from([*ChatWindow.model_fields, *ChatMessage.model_fields, "extra"])
contract_like = st.dictionaries(field_names, json_values | st.lists(st.dictionaries(field_names, json_values)),
                                max_size=8)


def _mutate(data: bytes, cuts: list[tuple[int, int, bytes]]) -> bytes:
    for start, length, insert in cuts:
        start %= len(data) + 1
        data = data[:start] + insert + data[start + length:]
    return data


valid_window_bytes = json.dumps(window(tenant="quickbite", language="de")).encode()
payloads = st.one_of(
    st.binary(max_size=512),
    st.text(max_size=200).map(str.encode),
    json_values.map(lambda value: json.dumps(value).encode()),
    contract_like.map(lambda value: json.dumps(value).encode()),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 8), st.binary(max_size=4)), min_size=1, max_size=4)
    .map(lambda cuts: _mutate(valid_window_bytes, cuts)),
    st.tuples(st.integers(1, 300) | st.integers(1_500, 5_000), st.sampled_from([b"[", b"{\"a\":", b"[{\"k\":"]),
              st.binary(max_size=8))
    .map(lambda t: t[1] * t[0] + t[2]),
)


@EXAMPLES
@given(payloads)
def test_every_byte_string_parses_or_raises_a_contract_error(payload):
    for parse in (parse_window, parse_message):
        try:
            parsed = parse(payload)
        except ContractError as error:
            assert str(error)  # always a reason
        else:
            assert parse(to_json_bytes(parsed)) == parsed


identifiers = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._:@-]{0,30}\Z")
zones = st.sampled_from([timezone.utc, timezone(timedelta(hours=5, minutes=30)), timezone(timedelta(hours=-8))])
moments = st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=zones)
texts = st.text(max_size=120)


@st.composite
def chat_windows(draw) -> ChatWindow:
    chat_id = draw(identifiers)
    times = sorted(draw(st.lists(moments, min_size=1, max_size=6)))
    senders = st.sampled_from(["customer", "agent", "bot"])
    messages = [ChatMessage(chat_id=chat_id, message_id=draw(identifiers), sender=draw(senders),
                            user_id=draw(identifiers), text=draw(texts), sent_at=sent_at) for sent_at in times]
    if not any(m.text.strip() for m in messages):
        messages[0] = messages[0].model_copy(update={"text": draw(texts.filter(str.strip)) or "x"})
    return ChatWindow(chat_id=chat_id, window_id=draw(identifiers), tenant=draw(st.none() | identifiers),
                      language=draw(st.none() | st.from_regex(r"\A[a-z]{2,3}(-[A-Za-z0-9]{2,8})?\Z")),
                      customer_id=draw(identifiers), messages=messages, closed=draw(st.booleans()))


@EXAMPLES
@given(chat_windows())
def test_windows_and_messages_round_trip_through_their_json(chat):
    assert parse_window(to_json_bytes(chat)) == chat
    for message_ in chat.messages:
        assert parse_message(to_json_bytes(message_)) == message_


@st.composite
def chat_insights(draw) -> ChatInsight:
    chat = draw(chat_windows())
    sentiment = draw(st.sampled_from([-1, 0, 1]))
    top = draw(st.floats(0.34, 1.0))
    rest = (1.0 - top) / 2
    labels = ((-1, "negative"), (0, "neutral"), (1, "positive"))
    scores = {label: top if value == sentiment else rest for value, label in labels}
    return ChatInsight(
        chat_id=chat.chat_id, window_id=chat.window_id, tenant=chat.tenant, language=chat.language,
        customer_id=chat.customer_id, closed=chat.closed, sentiment=sentiment, confidence=top, scores=scores,
        summary=draw(st.text(min_size=1, max_size=512)),
        reply_draft=draw(st.none() | st.text(min_size=1, max_size=300)),
        flags=draw(st.lists(st.text(max_size=64), max_size=16)), model_id=draw(st.text(min_size=1, max_size=200)),
        prompt_version=draw(st.text(min_size=1, max_size=64)), published_at=draw(moments), analyzed_at=draw(moments),
        transcript=chat.messages)


@EXAMPLES
@given(chat_insights(), st.binary(max_size=300),
       st.dictionaries(st.text(max_size=20), st.text(max_size=40), max_size=4), st.text(max_size=MAX_ERROR_CHARS))
def test_insights_and_dead_letters_round_trip_through_their_json(insight_, payload, attributes, error_message):
    assert ChatInsight.model_validate_json(to_json_bytes(insight_)) == insight_
    letter = DeadLetter(payload=payload, attributes=attributes, stage="validate", error_class="ContractError",
                        error_message=error_message, chat_id=insight_.chat_id, failed_at=insight_.analyzed_at)
    assert DeadLetter.model_validate_json(to_json_bytes(letter)) == letter
