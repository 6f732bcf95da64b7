"""Helpers for the dashboard tests: real ChatInsight messages, apps, users, servers and waits."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path

from chatlens.contracts import ChatInsight, ChatMessage, SentimentScores

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=timezone.utc)
PASSWORD = "correct horse battery"

_SCORES = {
    -1: {"negative": 0.82, "neutral": 0.13, "positive": 0.05},
    0: {"negative": 0.15, "neutral": 0.7, "positive": 0.15},
    1: {"negative": 0.04, "neutral": 0.16, "positive": 0.8},
}
_REPLIES = {
    -1: "I'm sorry your order is late. I've checked with the courier: it arrives tomorrow, and I've refunded the delivery fee.",
    0: "Thanks for reaching out! Your order is on its way and should arrive today.",
    1: "Thank you so much for the kind words, we're glad it arrived in time!",
}


def make_insight(
    chat_id: str = "c-1",
    window_id: str = "w1",
    sentiment: int = -1,
    texts: list[tuple[str, str]] | None = None,
    *,
    tenant: str | None = "quickbite",
    customer_id: str | None = None,
    summary: str | None = None,
    reply: str | None = "default",
    start: datetime | None = None,
    flags: list[str] | None = None,
    step: float = 1.0,
) -> ChatInsight:
    """A valid ChatInsight; `texts` are (sender, text) pairs, one second apart from `start`."""
    start = start or T0
    texts = texts or [("customer", "Where is my order? It is two hours late."),
                      ("agent", "Let me check that for you."),
                      ("customer", "This is the third time this month!")]
    transcript = [
        ChatMessage(chat_id=chat_id, message_id=f"{window_id}-m{i}", sender=sender,
                    user_id=(customer_id or f"cust-{chat_id}") if sender == "customer" else "agent-7",
                    text=text, sent_at=start + timedelta(seconds=i * step))
        for i, (sender, text) in enumerate(texts)
    ]
    last = transcript[-1].sent_at
    return ChatInsight(
        chat_id=chat_id, window_id=window_id, tenant=tenant, language="en",
        customer_id=customer_id or f"cust-{chat_id}", sentiment=sentiment,
        confidence=max(_SCORES[sentiment].values()), scores=SentimentScores(**_SCORES[sentiment]),
        summary=summary or f"Customer of chat {chat_id} asks about a late order.",
        reply_draft=_REPLIES[sentiment] if reply == "default" else reply,
        flags=flags or [], model_id="gemma3-270m-test", prompt_version="v-test",
        published_at=last + timedelta(seconds=2), analyzed_at=last + timedelta(seconds=1),
        transcript=transcript,
    )


def insight_bytes(insight: ChatInsight) -> bytes:
    return insight.model_dump_json().encode("utf-8")


def wait_until(predicate: Callable[[], object], timeout: float = 10.0, interval: float = 0.05,
               message: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    if not predicate():
        raise AssertionError(f"timed out after {timeout}s waiting for {message}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def sqlite_url(tmp_path: Path, name: str = "dashboard.db") -> str:
    return f"sqlite:///{tmp_path / name}"


def dashboard_settings(database_url: str, *, emulator: str | None = None, **overrides):
    """Settings for a test app: no .env, subscribers only when an emulator is given."""
    from app.settings import DashboardSettings

    values = dict(
        database_url=database_url, subscribe=emulator is not None, pubsub_emulator_host=emulator,
        session_secret=TEST_SECRET, event_poll_seconds=0.2, subscriber_probe_seconds=1.0,
        subscriber_max_backoff_seconds=2.0, login_lockout_seconds=30.0,
    )
    values.update(overrides)
    return DashboardSettings(_env_file=None, **values)


def add_user(database_url: str, username: str, role: str = "agent", password: str = PASSWORD) -> None:
    from app.crud import users
    from app.db import Database

    db = Database(database_url)
    try:
        db.upgrade()
        users.create_user(db, username, password, role)
    finally:
        db.dispose()


def store(database_url: str, *insights: ChatInsight) -> None:
    """Put insights straight into the database, as the subscriber would."""
    from app.crud.ingest import ingest_insight
    from app.db import Database

    db = Database(database_url)
    try:
        db.upgrade()
        for insight in insights:
            ingest_insight(db, insight_bytes(insight))
    finally:
        db.dispose()


def api_login(client, username: str, password: str = PASSWORD) -> str:
    """Log a TestClient/httpx client in through the JSON API; returns the CSRF token."""
    response = client.post("/api/session", json={"username": username, "password": password})
    assert response.status_code == 200, response.text
    return response.json()["csrf_token"]


@contextmanager
def running_server(app) -> Iterator[str]:
    """Serve `app` with a real uvicorn on a free port in a thread; yields the base URL."""
    from app.server import DashboardServer

    port = free_port()
    server = DashboardServer(app, "127.0.0.1", port, log_level="warning")
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    wait_until(lambda: server.started, 20, message="uvicorn to start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
        thread.join(20)
        assert not thread.is_alive(), "uvicorn did not stop"


def publisher(emulator: str):
    """A real google-cloud-pubsub PublisherClient talking to the local server."""
    import grpc
    from google.cloud import pubsub_v1
    from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport

    channel = grpc.insecure_channel(emulator)
    return pubsub_v1.PublisherClient(
        transport=PublisherGrpcTransport(channel=channel, host=emulator),
        client_options={"api_endpoint": emulator},
    )


def sample_queue(now: datetime | None = None) -> list[ChatInsight]:
    """A realistic morning queue (three brands, all sentiments) for screenshots and browser tests."""
    now = now or datetime.now(timezone.utc)
    m = lambda minutes: now - timedelta(minutes=minutes)  # noqa: E731
    rows = [
        ("qb-30518", -1, "quickbite", 42, "cust-701596",
         [("bot", "Hi there! I'm the QuickBite helper. Is this about a current order?"),
          ("customer", "yes. order 30518. the app has said \"rider nearby\" for 35 minutes"),
          ("agent", "Hi, I'm Jonas. I'm sorry, the rider had a puncture and we're reassigning the order."),
          ("customer", "reassigning means someone picks up the same cold food?"),
          ("customer", "I want a refund, not cold food. this is the second time this week")],
         "Order 30518 is 35+ minutes late after a rider puncture; customer expects cold food and wants a refund.",
         "I'm really sorry about order 30518, and that this happened twice this week. I've cancelled the "
         "reassignment and refunded the full amount to your card; you'll see it within 3-5 days. "
         "I've also added a €10 voucher to your account for the trouble.", ["refund_request", "repeat_issue"]),
        ("sm-8812", -1, "streamly", 18, "cust-220114",
         [("customer", "I was charged twice for my subscription this month."),
          ("bot", "I can help with billing. Can you confirm the last 4 digits of the card?"),
          ("customer", "4242. Fix it today please, I'm not paying double.")],
         "Double subscription charge this month; customer wants it fixed today.",
         "Thanks for confirming. I can see the duplicate charge on your card ending 4242 and I've refunded it; "
         "it should be back on your statement within 3 business days.", ["billing"]),
        ("qb-30577", -1, "quickbite", 9, "cust-118822",
         [("customer", "The burger had onions even though I asked for none. I'm allergic."),
          ("agent", "I'm so sorry. Are you feeling alright?"),
          ("customer", "I'm fine, I noticed before eating. But this is not ok.")],
         "Allergy request (no onions) ignored; customer is unharmed but upset.",
         "I'm very sorry, and glad you noticed in time. I've refunded the order and flagged the allergy note "
         "with the restaurant so it doesn't happen again.", ["allergy"]),
        ("fl-1209", 0, "flyway", 25, "cust-550931",
         [("customer", "Can I change the name on my booking FW-1209? There's a typo in the surname."),
          ("bot", "Small spelling corrections are free. Which letters need changing?"),
          ("customer", "It says Meyer, should be Meier.")],
         "Wants a surname typo corrected on booking FW-1209 (Meyer → Meier).",
         "No problem! I've corrected the surname on booking FW-1209 to Meier. You'll get an updated "
         "confirmation by email in a few minutes.", []),
        ("sm-8790", 0, "streamly", 14, "cust-889010",
         [("customer", "How do I download episodes to watch offline?"),
          ("bot", "Downloads are available on the mobile app for Premium plans.")],
         "Asks how to download episodes for offline viewing.",
         "Downloads work in the Streamly mobile app on Premium: tap the arrow next to an episode, and find it "
         "later under Downloads.", []),
        ("qb-30490", 1, "quickbite", 33, "cust-300777",
         [("customer", "Just wanted to say the rider was super friendly and the food was still hot!"),
          ("agent", "That's lovely to hear, thank you!"),
          ("customer", "Will order again :)")],
         "Customer praises the rider and the hot food.",
         "Thank you for the kind words! I've passed them on to your rider. Enjoy your next meal!", ["praise"]),
        ("fl-1188", 1, "flyway", 6, "cust-412345",
         [("customer", "Your team rebooked me so fast after the cancellation, thanks a lot.")],
         "Thanks the team for a fast rebooking after a cancellation.",
         "We're glad we could get you on your way quickly. Have a great flight!", ["praise"]),
    ]
    insights = []
    for chat_id, sentiment, tenant, waited, customer, texts, summary, reply, flags in rows:
        start = m(waited + 50 * (len(texts) - 1) / 60)
        insights.append(make_insight(chat_id, "w1", sentiment, texts, tenant=tenant, customer_id=customer,
                                     summary=summary, reply=reply, start=start, flags=flags, step=50))
    return insights


DATABASE_PARAMS = ["sqlite", "postgresql"]


def database_url_for(kind: str, tmp_path: Path) -> str:
    """A fresh database: a SQLite file, or CHATLENS_TEST_DATABASE_URL (see conftest.py) emptied."""
    import os

    import pytest

    if kind == "sqlite":
        return sqlite_url(tmp_path)
    url = os.environ.get("CHATLENS_TEST_DATABASE_URL")
    if not url:
        pytest.fail("PostgreSQL variant: no server: " + os.environ.get("CHATLENS_TEST_POSTGRES_ERROR", "none started"))
    from sqlalchemy import create_engine, text

    from app.models import Base

    engine = create_engine(url)
    try:
        Base.metadata.drop_all(engine)
        with engine.begin() as conn:  # or the next upgrade would take the empty database for migrated
            conn.execute(text("DROP TABLE IF EXISTS alembic_version"))
    finally:
        engine.dispose()
    return url


STAFF = {"sam": "supervisor", "alice": "agent", "bob": "agent"}
TEST_SECRET = "test-secret-" + "x" * 32
_TEMPLATE: dict[str, object] = {}


def _create_staff(database_url: str) -> dict[str, tuple[str, str]]:
    """Create STAFF and one session each (as a login would); {username: (cookie token, csrf)}."""
    from app.crud import sessions, users
    from app.db import Database

    db = Database(database_url)
    try:
        db.upgrade()
        tokens = {}
        for username, role in STAFF.items():
            user = users.create_user(db, username, PASSWORD, role)
            token, principal = sessions.create(db, TEST_SECRET, user, 12, "127.0.0.1")
            tokens[username] = (token, principal.csrf_token)
        return tokens
    finally:
        db.dispose()


def staffed_database(kind: str, tmp_path: Path) -> tuple[str, dict[str, tuple[str, str]]]:
    """A fresh database with STAFF signed in. Argon2 is slow on purpose, so the SQLite
    variant copies a file made once per test run instead of hashing again for every test."""
    import shutil
    import tempfile

    url = database_url_for(kind, tmp_path)
    if kind != "sqlite":
        return url, _create_staff(url)
    if not _TEMPLATE:
        template = Path(tempfile.mkdtemp(prefix="chatlens-template-")) / "staff.db"
        _TEMPLATE["tokens"] = _create_staff(f"sqlite:///{template}")
        _TEMPLATE["path"] = template
    for suffix in ("", "-wal", "-shm"):
        source = Path(f"{_TEMPLATE['path']}{suffix}")
        if source.exists():
            shutil.copy(source, tmp_path / f"dashboard.db{suffix}")
    return url, dict(_TEMPLATE["tokens"])  # type: ignore[arg-type]


def sign_in(client, tokens: dict[str, tuple[str, str]], username: str):
    """Give a client `username`'s session cookie and CSRF header."""
    token, csrf = tokens[username]
    client.cookies.set("chatlens_session", token)
    client.headers["X-CSRF-Token"] = csrf
    return client


@contextmanager
def dashboard_process(command: list[str], port: int, *, cwd: Path, env: dict[str, str], ready_path: str = "/readyz",
                      timeout: float = 30.0) -> Iterator[tuple[subprocess.Popen, list[str]]]:
    """A `chatlens dashboard` child, yielded once `ready_path` answers 200 with its output so far
    (it keeps filling); killed at exit if the test did not stop it. A child that exits while
    starting fails the wait with its output."""
    import httpx

    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(process.stdout), daemon=True)
    reader.start()

    def ready() -> bool:
        assert process.poll() is None, f"the dashboard exited with {process.returncode}: {''.join(output)[-4000:]}"
        try:
            return httpx.get(f"http://127.0.0.1:{port}{ready_path}", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(ready, timeout, 0.2, f"the dashboard to answer {ready_path}")
        yield process, output
    finally:
        if process.poll() is None:
            process.kill()
        reader.join(5)
