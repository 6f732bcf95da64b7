"""Live updates over Server-Sent Events, through a real uvicorn: ids, resume, resync."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from tests.support.app import (
    dashboard_settings,
    make_insight,
    running_server,
    staffed_database,
    sqlite_url,
    store,
)

from app.crud import events as event_rows
from app.crud import users
from app.crud.ingest import ingest_dead_letter
from app.db import Database
from app.live import EventHub
from app.main import create_app
from chatlens.contracts import DeadLetter


_LINES: dict[int, object] = {}


def read_events(response: httpx.Response, count: int) -> list[dict]:
    """The next `count` events (comments and keep-alives skipped) as {event, id, data}."""
    lines = _LINES.setdefault(id(response), response.iter_lines())  # one line iterator per response
    events: list[dict] = []
    current: dict = {}
    for line in lines:
        if line == "":
            if current.get("event") or current.get("data"):
                events.append(current)
                if len(events) == count:
                    return events
            current = {}
        elif not line.startswith(":"):
            field, _, value = line.partition(":")
            current[field] = value[1:] if value.startswith(" ") else value
    return events


@pytest.fixture
def staffed_server(tmp_path):
    """(database url, a function giving a signed-in httpx client per username)."""
    url, tokens = staffed_database("sqlite", tmp_path)
    app = create_app(dashboard_settings(url))
    clients = []
    with running_server(app) as base:
        def client_for(username: str) -> httpx.Client:
            clients.append(httpx.Client(base_url=base, cookies={"chatlens_session": tokens[username][0]},
                                        headers={"X-CSRF-Token": tokens[username][1]}, timeout=httpx.Timeout(10.0)))
            return clients[-1]
        yield url, client_for
        for client in clients:
            client.close()


@pytest.fixture
def server(staffed_server):
    url, client_for = staffed_server
    return url, client_for("alice")


def test_events_carry_ids_and_resume_from_last_event_id(server):
    url, client = server
    with client.stream("GET", "/api/events") as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        hello, status = read_events(response, 2)
        assert hello["event"] == "hello" and status["event"] == "status"
        assert '"feed": "off"' in status["data"] or '"feed":"off"' in status["data"]
        store(url, make_insight("c-1"))
        (event,) = read_events(response, 1)
    assert event["event"] == "chat" and '"chat_id":"c-1"' in event["data"].replace(" ", "")
    assert int(event["id"]) > int(hello["id"])

    # Missed while disconnected: two more chats. Reconnecting with Last-Event-ID replays them.
    store(url, make_insight("c-2"), make_insight("c-3"))
    with client.stream("GET", "/api/events", headers={"Last-Event-ID": event["id"]}) as response:
        missed = read_events(response, 2)
    assert [e["event"] for e in missed] == ["chat", "chat"]
    assert ['"c-2"' in missed[0]["data"], '"c-3"' in missed[1]["data"]] == [True, True]
    assert int(missed[0]["id"]) == int(event["id"]) + 1 and int(missed[1]["id"]) == int(event["id"]) + 2

    # The same through the query parameter a new EventSource uses.
    with client.stream("GET", "/api/events", params={"after": event["id"]}) as response:
        assert [e["id"] for e in read_events(response, 2)] == [missed[0]["id"], missed[1]["id"]]


def test_an_unknown_last_event_id_asks_the_page_to_reload(server):
    _url, client = server
    with client.stream("GET", "/api/events", headers={"Last-Event-ID": "999999"}) as response:
        (event,) = read_events(response, 1)
    assert event["event"] == "resync"


def test_review_actions_are_announced_to_other_browsers(server):
    url, client = server
    store(url, make_insight("c-9"))
    csrf = client.get("/api/session").json()["csrf_token"]
    with client.stream("GET", "/api/events") as response:
        read_events(response, 2)  # hello, status
        assert client.post("/api/chats/c-9/approve", json={"version": 1},
                           headers={"X-CSRF-Token": csrf}).status_code == 200
        event = read_events(response, 1)[0]
        if '"insight"' in event["data"]:  # stored just before we connected: announced first
            event = read_events(response, 1)[0]
    assert event["event"] == "chat"
    data = event["data"].replace(" ", "")
    assert '"action":"approve"' in data and '"actor":"alice"' in data and '"status":"approved"' in data


def assert_stream_ends(response: httpx.Response) -> None:
    """The server closes the stream: no keep-alive keeps it open past the read timeout."""
    for _ in _LINES.setdefault(id(response), response.iter_lines()):
        pass


def test_a_live_stream_ends_soon_after_logout(staffed_server):
    _url, client_for = staffed_server
    alice = client_for("alice")
    with alice.stream("GET", "/api/events", timeout=httpx.Timeout(10.0, read=8.0)) as response:
        read_events(response, 2)  # hello, status
        assert alice.delete("/api/session").status_code == 204
        assert_stream_ends(response)


def test_a_live_stream_ends_soon_after_its_user_is_disabled(staffed_server):
    url, client_for = staffed_server
    alice = client_for("alice")
    with alice.stream("GET", "/api/events", timeout=httpx.Timeout(10.0, read=8.0)) as response:
        read_events(response, 2)
        users.set_disabled(Database(url), "alice")
        assert_stream_ends(response)


def test_dead_letter_events_go_to_supervisors_only(staffed_server):
    url, client_for = staffed_server
    letter = DeadLetter.from_exception(b"not json", "parse", ValueError("bad input"))
    with client_for("alice").stream("GET", "/api/events") as agent, \
            client_for("sam").stream("GET", "/api/events") as supervisor:
        read_events(agent, 2)
        read_events(supervisor, 2)
        ingest_dead_letter(Database(url), letter.model_dump_json().encode(), message_id="m-dl")
        store(url, make_insight("c-after"))
        assert [e["event"] for e in read_events(supervisor, 2)] == ["errorlog", "chat"]
        assert [e["event"] for e in read_events(agent, 1)] == ["chat"]


@pytest.mark.parametrize("value", ["-" + "9" * 30, "9" * 31, "-1"])
def test_out_of_range_event_ids_are_clamped_not_overflowed(server, value):
    _url, client = server
    for request in ({"headers": {"Last-Event-ID": value}}, {"params": {"after": value}}):
        with client.stream("GET", "/api/events", **request) as response:
            events = read_events(response, 1)
        assert [e["event"] for e in events] in (["resync"], ["status"]), (request, events)


def test_the_session_is_checked_on_time_while_events_flow(tmp_path):
    """Events every 0.8 s used to postpone each check to the first event after `check_seconds`:
    checks 1.6 s apart, and a stream outliving its logout by up to twice the promise."""
    url = sqlite_url(tmp_path)
    db = Database(url)
    db.upgrade()

    def add_event() -> None:
        with db.writing() as session:
            event_rows.add_event(session, "chat", "c-1")
            session.commit()

    async def scenario() -> list[float]:
        hub = EventHub(db, poll_seconds=0.05)
        await hub.start()
        checks = [time.monotonic()]

        async def still_allowed() -> bool:
            checks.append(time.monotonic())
            return True

        async def write_events() -> None:
            for _ in range(6):
                await asyncio.sleep(0.8)
                await asyncio.to_thread(add_event)
                hub.notify()
            await asyncio.sleep(0.3)
            hub.close()

        writer = asyncio.create_task(write_events())
        received = [event async for event in hub.stream(None, still_allowed, check_seconds=1.0)]
        await writer
        await hub.stop()
        assert [e.kind for e in received].count("chat") == 6
        return checks

    checks = asyncio.run(scenario())
    db.dispose()
    gaps = [later - earlier for earlier, later in zip(checks, checks[1:])]
    assert len(gaps) >= 4 and max(gaps) < 1.4, gaps


def test_a_status_event_is_sent_only_when_the_status_changes(tmp_path):
    """Every stream starts with the status; the poller used to send the same status again ~2 s after
    starting (it remembered none), which browsers saw as a change that did not happen."""
    from app.live import STATUS_EVERY_SECONDS

    db = Database(sqlite_url(tmp_path))
    db.upgrade()
    status = {"feed": "running"}

    async def scenario() -> list[str]:
        hub = EventHub(db, poll_seconds=0.05, status_provider=lambda: dict(status))
        await hub.start()

        async def later() -> None:
            await asyncio.sleep(STATUS_EVERY_SECONDS * 1.5)  # the poller has checked the status by now
            status["feed"] = "reconnecting"
            await asyncio.sleep(STATUS_EVERY_SECONDS * 1.5)
            hub.close()

        changer = asyncio.create_task(later())
        kinds = [(event.kind, event.data.get("feed")) async for event in hub.stream(None)]
        await changer
        await hub.stop()
        return kinds

    kinds = asyncio.run(scenario())
    db.dispose()
    assert kinds == [("hello", None), ("status", "running"), ("status", "reconnecting")]
