"""Storing what the subscribers receive, searching it, and the `chatlens users` command."""

from __future__ import annotations

import io
import json
from datetime import datetime, timedelta
from typing import Annotated, Literal

import pytest
from tests.support.app import T0, insight_bytes, make_insight, sqlite_url
from pydantic import AwareDatetime, StringConstraints
from sqlalchemy import JSON, Boolean, Float, Integer, Text, func, select

from app.crud import chats
from app.crud.chats import QueueFilter
from app.crud.ingest import Outcome, ingest_dead_letter, ingest_insight, waiting_since
from app.db import Database
from app.models import CHAT_WINDOW_COPY, Chat, ErrorEvent, Event, Insight, UTCDateTime, column_type
from chatlens.contracts import ANALYSIS_FIELDS, ChatAnalysis, DeadLetter, SentimentScores
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
