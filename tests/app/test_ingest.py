"""Storing what the subscribers receive, searching it, and the `chatlens users` command."""

from __future__ import annotations

import io
import itertools
import json
from datetime import datetime, timedelta
from typing import Annotated, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.support.app import T0, insight_bytes, make_insight, sqlite_url
from pydantic import AwareDatetime, StringConstraints
from sqlalchemy import JSON, Boolean, Float, Integer, Text, func, select

from app.crud import chats
from app.crud.chats import QueueFilter
from app.crud.ingest import Outcome, ingest_dead_letter, ingest_insight, waiting_since
from app.db import Database
from app.models import CHAT_WINDOW_COPY, Chat, ErrorEvent, Event, Insight, UTCDateTime, column_type
from chatlens.contracts import ANALYSIS_FIELDS, ChatAnalysis, ChatInsight, DeadLetter, SentimentScores
from cli.main import main as chatlens


@pytest.fixture(params=["fts5", "like"])
def db(request, tmp_path):
    database = Database(sqlite_url(tmp_path), search_backend=request.param)
    database.upgrade()
    assert database.fts == (request.param == "fts5")
    yield database
    database.dispose()


def count(db: Database, model) -> int:
    with db.read() as session:
        return session.scalar(select(func.count()).select_from(model))


def test_each_window_is_stored_once_however_often_it_arrives(db):
    data = insight_bytes(make_insight("c-1", "w1"))
    assert ingest_insight(db, data, message_id="1") == Outcome.stored
    assert ingest_insight(db, data, message_id="2") == Outcome.duplicate
    assert ingest_insight(db, data, message_id="1") == Outcome.duplicate
    assert count(db, Insight) == 1
    assert count(db, Event) == 1  # a duplicate announces nothing


def test_anything_that_is_not_a_chat_insight_becomes_an_error_row(db):
    wrong = json.loads(insight_bytes(make_insight()))
    wrong["confidence"] = 7
    for message_id, payload in [("a", b"\xff\xfe not json"), ("b", b'{"chat_id": "x"}'),
                                ("c", json.dumps(wrong).encode())]:
        assert ingest_insight(db, payload, message_id=message_id, attributes={"k": "v"}) == Outcome.invalid
    assert ingest_insight(db, b"again", message_id="a") == Outcome.duplicate  # redelivered bad message
    with db.read() as session:
        rows = list(session.scalars(select(ErrorEvent).order_by(ErrorEvent.id)))
    assert [row.kind for row in rows] == ["invalid_insight"] * 3
    assert rows[0].payload == b"\xff\xfe not json" and rows[0].attributes == {"k": "v"}
    assert rows[1].chat_id == "x" and "customer_id" in rows[1].error_message
    assert "confidence" in rows[2].error_message
    assert count(db, Insight) == 0


def test_dead_letters_keep_their_payload_and_reason(db):
    letter = DeadLetter.from_exception(b'{"broken": ', "parse", ValueError("not JSON"),
                                       attributes={"origin": "web"}, chat_id="c-9")
    assert ingest_dead_letter(db, letter.model_dump_json().encode(), message_id="d1",
                              attributes={"x": "y"}) == Outcome.stored
    assert ingest_dead_letter(db, letter.model_dump_json().encode(), message_id="d1") == Outcome.duplicate
    assert ingest_dead_letter(db, b"garbage", message_id="d2") == Outcome.invalid
    with db.read() as session:
        first, second = session.scalars(select(ErrorEvent).order_by(ErrorEvent.id))
    assert (first.kind, first.stage, first.error_class, first.chat_id) == ("dead_letter", "parse", "ValueError", "c-9")
    assert first.payload == b'{"broken": ' and first.attributes == {"origin": "web", "pubsub.x": "y"}
    assert second.kind == "invalid_dead_letter" and second.payload == b"garbage"


def test_the_newest_window_is_current_whatever_the_arrival_order(db):
    w1 = make_insight("c-1", "w1", -1, start=T0)
    w2 = make_insight("c-1", "w2", 1, start=T0 + timedelta(minutes=5))
    w3 = make_insight("c-1", "w3", 0, start=T0 + timedelta(minutes=9))
    for insight in (w2, w3, w1):
        ingest_insight(db, insight_bytes(insight))
    with db.read() as session:
        chat = chats.get_chat(session, "c-1")
        assert (chat.window_id, chat.sentiment, chat.windows_seen) == ("w3", 0, 3)
        assert chats.current_insight(session, chat).window_id == "w3"
    assert count(db, Insight) == 3


def test_every_model_output_is_stored_in_its_column_and_the_chat_copies_its_own(db):
    first = make_insight("c-1", "w1", -1, flags=["refund", "late"], start=T0)
    second = make_insight("c-1", "w2", 1, reply=None, summary="Thanked us.", start=T0 + timedelta(minutes=5))
    for insight in (first, second):
        assert ingest_insight(db, insight_bytes(insight)) == Outcome.stored
    assert set(CHAT_WINDOW_COPY.values()) <= set(ANALYSIS_FIELDS)
    assert CHAT_WINDOW_COPY == {"sentiment": "sentiment", "confidence": "confidence", "summary": "summary",
                                "draft": "reply_draft"}
    with db.read() as session:
        rows = {row.window_id: row for row in session.scalars(select(Insight))}
        chat = session.get(Chat, "c-1")
    for insight in (first, second):
        sent = insight.model_dump(mode="json")
        assert {name: getattr(rows[insight.window_id], name) for name in ANALYSIS_FIELDS} == {
            name: sent[name] for name in ANALYSIS_FIELDS}
    assert rows["w1"].flags == ["refund", "late"] and rows["w2"].reply_draft is None
    current = second.model_dump(mode="json")  # the chat row shows the newest window's copies
    assert {column: getattr(chat, column) for column in CHAT_WINDOW_COPY} == {
        column: current[field] for column, field in CHAT_WINDOW_COPY.items()}


def test_each_output_has_a_column_typed_and_nullable_as_the_contract_says():
    for name, field in ChatAnalysis.model_fields.items():
        column = Insight.__table__.c[name]
        type_, nullable = column_type(field.annotation)
        assert (type(column.type), column.nullable, column.info["analysis_field"]) == (type(type_), nullable, name)


@pytest.mark.parametrize(("annotation", "expected"), [
    (str, (Text, False)),
    (Annotated[str, StringConstraints(max_length=64)], (Text, False)),  # limits stay the contract's
    (Annotated[str, StringConstraints(max_length=64)] | None, (Text, True)),
    (int | None, (Integer, True)),
    (Literal[-1, 0, 1], (Integer, False)),
    (Literal["billing", "delivery"], (Text, False)),
    (float, (Float, False)),
    (bool, (Boolean, False)),
    (AwareDatetime, (UTCDateTime, False)),
    (datetime | None, (UTCDateTime, True)),
    (list[str], (JSON, False)),
    (dict[str, float], (JSON, False)),
    (SentimentScores | None, (JSON, True)),
])
def test_contract_types_map_to_column_types(annotation, expected):
    column, nullable = column_type(annotation)
    assert (type(column), nullable) == expected


@pytest.mark.parametrize("annotation", [int | str, Literal[1, "one"], bytes])
def test_a_contract_type_without_a_column_type_fails_at_import_not_at_runtime(annotation):
    with pytest.raises(TypeError, match="no column type"):
        column_type(annotation)


def test_waiting_time_starts_at_the_first_unanswered_customer_message():
    insight = make_insight(texts=[("customer", "a"), ("agent", "b"), ("customer", "c"), ("bot", "d"),
                                  ("customer", "e")], step=60)
    assert waiting_since(insight.transcript) == T0 + timedelta(minutes=2)  # the bot is no answer
    answered = make_insight(texts=[("customer", "a"), ("agent", "b")], step=60)
    assert waiting_since(answered.transcript) == T0 + timedelta(minutes=1)


def test_search_needs_every_word_and_ignores_query_syntax(db):
    ingest_insight(db, insight_bytes(make_insight("c-1", texts=[("customer", "My parcel (DHL) is late, 50% off?")])))
    ingest_insight(db, insight_bytes(make_insight("c-2", texts=[("customer", "Café crème was cold")],
                                                  tenant="beanery")))

    def found(q: str) -> list[str]:
        with db.read() as session:
            return [c.chat_id for c in chats.list_chats(session, QueueFilter(q=q), db.fts).items]

    assert found("parcel") == ["c-1"]
    assert found("PARC dhl") == ["c-1"]
    assert found("parcel cold") == []
    assert found("beanery") == ["c-2"]
    assert found("c-2") == ["c-2"]
    assert found("crème") == ["c-2"]
    assert found("50%") == ["c-1"]
    for syntax in ['"', "*", "NEAR(", "a OR", "%", "_", "c-1 AND", ")"]:
        found(syntax)  # no error


def test_users_command_adds_lists_and_disables(tmp_path, monkeypatch, capsys):
    url = sqlite_url(tmp_path, "users.db")
    monkeypatch.setattr("sys.stdin", io.StringIO("s3cret-enough\n"))
    assert chatlens(["users", "--database-url", url, "add", "Alice", "--role", "supervisor", "--password-stdin"]) == 0
    monkeypatch.setattr("sys.stdin", io.StringIO("short\n"))
    assert chatlens(["users", "--database-url", url, "add", "bob", "--password-stdin"]) == 1
    assert "at least 8 characters" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", io.StringIO("s3cret-enough\n"))
    assert chatlens(["users", "--database-url", url, "add", "alice", "--password-stdin"]) == 1
    assert "already exists" in capsys.readouterr().err
    assert chatlens(["users", "--database-url", url, "disable", "alice"]) == 0
    assert chatlens(["users", "--database-url", url, "list"]) == 0
    listing = capsys.readouterr().out
    assert "alice" in listing and "supervisor" in listing and "disabled" in listing
    assert chatlens(["users", "--database-url", url, "disable", "nobody"]) == 1

    from app.crud import users

    database = Database(url)
    assert users.authenticate(database, "alice", "s3cret-enough") is None  # disabled
    assert chatlens(["users", "--database-url", url, "enable", "alice"]) == 0
    assert users.authenticate(database, "ALICE", "s3cret-enough").role == "supervisor"
    database.dispose()


# ---- no payload stops ingest (issue 32) ------------------------------------------------------------
# Whatever is published to the two topics ends as exactly one row: an insight, or an error row
# with the reason. One that raised instead would be nacked and redelivered, again and again.

def rows(db: Database) -> tuple[int, int]:
    return count(db, Insight), count(db, ErrorEvent)


NESTED = b"[" * 3_000


def test_deeply_nested_payloads_become_error_rows_not_exceptions(db):
    assert ingest_insight(db, NESTED, message_id="i1") == Outcome.invalid  # was a RecursionError
    assert ingest_insight(db, b'{"chat_id": ' + b"1" * 5_000 + b"}", message_id="i2") == Outcome.invalid
    nested_letter = DeadLetter.from_exception(b"[" * 100_000, "validate", ValueError("nested"))
    assert ingest_dead_letter(db, nested_letter.model_dump_json().encode(), message_id="d1") == Outcome.stored
    assert ingest_dead_letter(db, NESTED, message_id="d2") == Outcome.invalid
    with db.read() as session:
        stored = list(session.scalars(select(ErrorEvent).order_by(ErrorEvent.id)))
    assert [row.kind for row in stored] == ["invalid_insight", "invalid_insight", "dead_letter", "invalid_dead_letter"]
    assert "recursion limit" in stored[0].error_message and stored[0].payload == NESTED
    assert stored[2].payload == b"[" * 100_000 and stored[2].chat_id is None
    assert count(db, Insight) == 0


def test_error_rows_keep_what_any_database_can_store(db):
    """NUL characters (PostgreSQL's text refuses them) and over-long ids from outside are cleaned."""
    letter = DeadLetter.from_exception(b"x", "validate\x00", ValueError("bad\x00"), chat_id="c" * 500)
    assert ingest_dead_letter(db, letter.model_dump_json().encode(), message_id="d1",
                              attributes={"k\x00": "v\x00"}) == Outcome.stored
    assert ingest_insight(db, b'{"chat_id": "a\\u0000b"}', message_id="i1") == Outcome.invalid
    with db.read() as session:
        letter_row, insight_row_ = session.scalars(select(ErrorEvent).order_by(ErrorEvent.id))
    assert "\x00" not in letter_row.error_message + letter_row.stage + json.dumps(letter_row.attributes)
    assert len(letter_row.chat_id) == 200 and insight_row_.chat_id == "a\N{REPLACEMENT CHARACTER}b"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=10,
)
insight_fields = st.sampled_from([*ChatInsight.model_fields, *DeadLetter.model_fields, "extra"])
raw_payloads = st.one_of(
    st.binary(max_size=400),
    json_values.map(lambda value: json.dumps(value).encode()),
    st.dictionaries(insight_fields, json_values, max_size=8).map(lambda value: json.dumps(value).encode()),
    st.tuples(st.integers(1, 300) | st.integers(1_500, 5_000), st.sampled_from([b"[", b'{"chat_id":']))
    .map(lambda t: t[1] * t[0]),
)
attribute_maps = st.dictionaries(st.sampled_from(["chat_id", "source_key", "k", ""]), st.text(max_size=30), max_size=3)
valid_insights = st.builds(
    lambda n, sentiment, summary, texts: insight_bytes(make_insight(
        f"h-{n}", "w1", sentiment, [("customer", t) for t in texts], summary=summary or None)),
    st.integers(0, 50), st.sampled_from([-1, 0, 1]), st.text(max_size=100), st.lists(st.text(max_size=50), min_size=1,
                                                                                       max_size=3))
letters = st.builds(
    lambda payload, chat_id, attributes, message: DeadLetter(
        payload=payload, attributes=attributes, stage="validate", error_class="ContractError",
        error_message=message, chat_id=chat_id, failed_at=T0).model_dump_json().encode(),
    raw_payloads, st.none() | st.text(max_size=300), st.dictionaries(st.text(max_size=10), st.text(max_size=10),
                                                                     max_size=3), st.text(max_size=200))
MESSAGE_IDS = itertools.count()
INGEST_EXAMPLES = settings(max_examples=60, deadline=None, database=None,
                           suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@INGEST_EXAMPLES
@given(data=st.data())
def test_any_payload_on_either_topic_ends_as_exactly_one_row(db, data):
    """One row per new message id whatever the bytes: a stored insight, a duplicate of one
    already stored (no row), or an error row; never an exception (which would mean a nack)."""
    topic = data.draw(st.sampled_from(["insights", "deadletters"]))
    payload = data.draw(st.one_of(raw_payloads, valid_insights if topic == "insights" else letters))
    attributes = data.draw(attribute_maps)
    message_id = f"m-{next(MESSAGE_IDS)}"  # a new Pub/Sub message each time
    before = rows(db)
    ingest = ingest_insight if topic == "insights" else ingest_dead_letter
    outcome = ingest(db, payload, message_id=message_id, attributes=attributes)
    after = rows(db)
    added = (after[0] - before[0], after[1] - before[1])
    expected = {Outcome.stored: {(1, 0)} if topic == "insights" else {(0, 1)}, Outcome.invalid: {(0, 1)},
                Outcome.duplicate: {(0, 0)}}[outcome]
    assert added in expected, (outcome, added)
    if outcome == Outcome.duplicate:  # only a window or dead letter already stored under its own key
        assert topic == "insights" or attributes.get("source_key")
    assert ingest(db, payload, message_id=message_id, attributes=attributes) in (Outcome.duplicate, Outcome.stored)
    if topic == "deadletters" or outcome != Outcome.stored:
        assert rows(db) == after  # the same message again: no second row
