"""Benchmark: the dashboard under load, on SQLite and on PostgreSQL (issue 13, section 4).

Everything is real: `chatlens pubsub-emulator` and `chatlens dashboard` run as subprocesses,
insights go through the google-cloud-pubsub PublisherClient, the browsers are httpx clients
logged in through the JSON API, PostgreSQL is a throwaway server (tests/support/postgres.py).
For each database in `--databases`:

1. fill: a fresh database gets `--chats` minus the chats the next two steps add, written in
   bulk (thousands a transaction) with the rows `ingest_insight` would store: insights, chats,
   the search index and the newest live-update events, from realistic ChatInsights (the
   labelled chats of data/train.jsonl, each copy its own chat_id, spread over 30 days). Before
   the fill, a sample is stored both ways in a scratch database and compared column by column,
   so the bulk rows cannot drift from what ingest stores. PostgreSQL is then VACUUM ANALYZEd,
   as autovacuum would do within a minute; SQLite is left as the app leaves it.
2. ingest: the dashboard starts, `--insights` insights are published in one burst; figures:
   total time from the first publish call to the last commit, throughput, and the ingest lag
   per insight = its live-update event's time (written in the transaction that stores it,
   just before the commit) - its publish call (p50/p95/max). The dashboard's own mean lag
   (/metrics, Pub/Sub publish time -> callback) is shown beside it.
3. live updates: `--sse-clients` clients open /api/events (one session), then
   `--sse-insights` insights are published at `--sse-rate` per second. Figures: clients
   connected, clients that received every insight's event, and the delivery delay per
   (client, insight): received - publish call, and received - commit (the event's time).
4. latency: with `--chats` chats stored, `--requests` GETs each of the queue page (/), the
   queue list the page re-fetches after live events (/partials/queue), the JSON queue
   (/api/chats) and one chat (/api/chats/ID), `--concurrency` at a time, after a warm-up.

Prints a table, then one line of JSON.

    .venv/bin/python bench/dashboard.py            # about 5 minutes on a 2-core CPU
    .venv/bin/python bench/dashboard.py --quick    # a smoke run, well under a minute
    .venv/bin/python bench/dashboard.py --databases sqlite --chats 20000

Percentiles are nearest-rank (with n < 100, p99 is the maximum). The bench, the Pub/Sub
server and the dashboard share the machine's cores, as they would on a small host.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.helpers import apply_quick, comma_choices, fmt, percentile, say  # noqa: E402 - after the path is set

TRAIN = ROOT / "data" / "train.jsonl"
USERNAME, PASSWORD = "bench", "bench password, long enough"
DATABASES = ("sqlite", "postgresql")
FILL_BATCH = 2000
ENDPOINTS = ("queue page", "queue list", "api queue", "api chat")
QUICK = {"insights": 200, "chats": 2000, "sse_clients": 5, "sse_insights": 40, "sse_rate": 20.0,
         "requests": 20, "concurrency": 2}


# ---- figures -------------------------------------------------------------------------------
def r(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def spread(values: list[float]) -> dict:
    """p50/p95/p99/max in seconds, the way every figure here is reported."""
    return {"p50_s": r(percentile(values, 50)), "p95_s": r(percentile(values, 95)),
            "p99_s": r(percentile(values, 99)), "max_s": r(max(values, default=None)), "n": len(values)}


def bar(total: int, desc: str, unit: str):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, dynamic_ncols=True, mininterval=0.5,
                leave=False)


# ---- realistic insights --------------------------------------------------------------------
class Insights:
    """ChatInsights made from the labelled chats of data/train.jsonl: their transcript, label,
    summary and reply, under a new chat_id, the messages shifted to end at a given time."""

    def __init__(self, seed: int = 7):
        from chatlens.contracts import ChatMessage

        self.templates = []
        for line in TRAIN.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            messages = [ChatMessage.model_validate_json(json.dumps(m)) for m in row["messages"]]
            self.templates.append((row, messages))
        random.Random(seed).shuffle(self.templates)
        self._rng = random.Random(seed)

    def make(self, n: int, chat_id: str, last_message_at: datetime):
        from chatlens.contracts import ChatInsight, SentimentScores

        row, messages = self.templates[n % len(self.templates)]
        shift = last_message_at - messages[-1].sent_at
        transcript = [m.model_copy(update={"chat_id": chat_id, "message_id": f"{chat_id}-m{i:02d}",
                                           "sent_at": m.sent_at + shift}) for i, m in enumerate(messages)]
        label = row["label"]
        top = round(0.55 + 0.4 * self._rng.random(), 3)
        rest = round((1 - top) / 2, 3)
        scores = {"negative": rest, "neutral": rest, "positive": rest}
        scores[{-1: "negative", 0: "neutral", 1: "positive"}[label]] = round(1 - 2 * rest, 3)
        return ChatInsight(
            chat_id=chat_id, window_id="w1", tenant=row.get("tenant"), language=row.get("language"),
            customer_id=row["customer_id"], closed=bool(row.get("closed")), sentiment=label,
            confidence=max(scores.values()), scores=SentimentScores(**scores), summary=row["summary"],
            reply_draft=row.get("reply") or None, flags=[], model_id="gemma3-270m-bench",
            prompt_version="bench", published_at=last_message_at + timedelta(seconds=3),
            analyzed_at=last_message_at + timedelta(seconds=2), transcript=transcript,
        )


# ---- the bulk fill: the rows ingest would store --------------------------------------------
def bulk_rows(insight, raw: bytes, received_at: datetime, message_id: str | None) -> tuple[dict, dict, dict]:
    """(insight row, chat row, event row) as `_store_insight` writes them for a chat's first window.

    The insight row is ingest's own (`insight_row`) and the chat row comes from `_apply_window`,
    so a new model output (a ChatAnalysis field) is filled here too, with nothing to add.
    """
    from app import sentiments
    from app.crud.ingest import SYSTEM_ACTOR, _apply_window, _chat_body, insight_row
    from app.models import Chat

    chat = Chat(chat_id=insight.chat_id, version=1, windows_seen=1, first_seen_at=received_at,
                updated_at=received_at, updated_by=SYSTEM_ACTOR, assignee=None, corrected_sentiment=None)
    row = insight_row(insight, raw, message_id, received_at)
    _apply_window(chat, insight, row, _chat_body(insight))
    chat_row = {column.key: getattr(chat, column.key) for column in Chat.__table__.columns}
    event_row = dict(at=received_at, kind="chat", chat_id=insight.chat_id, data={
        "chat_id": insight.chat_id, "action": "insight", "window_id": insight.window_id, "current": True,
        "version": 1, "sentiment": sentiments.name(insight.sentiment), "actor": SYSTEM_ACTOR})
    return row, chat_row, event_row


def write_batch(db, rows: list[tuple[dict, dict, dict]], events_from: int = 0) -> None:
    """One transaction of bulk inserts through the app's models (and its FTS5 table on SQLite);
    live-update events only for rows[events_from:] (the hub prunes all but the newest)."""
    from sqlalchemy import insert, text

    from app.models import Chat, Event, Insight

    with db.writing() as session:
        session.execute(insert(Insight), [i for i, _, _ in rows])
        session.execute(insert(Chat), [c for _, c, _ in rows])
        if db.fts:  # as search.index_chat: under the chat row's rowid
            session.execute(text("INSERT INTO chat_fts (rowid, chat_id, body) "
                                 "SELECT rowid, chat_id, :body FROM chats WHERE chat_id = :chat_id"),
                            [{"chat_id": c["chat_id"], "body": c["search_text"]} for _, c, _ in rows])
        if events_from < len(rows):
            session.execute(insert(Event), [e for _, _, e in rows[events_from:]])
        session.commit()


def snapshot(db) -> dict:
    """Every stored column of every row ingest writes (ids and event times aside), by table."""
    from sqlalchemy import select, text

    from app.models import Chat, Event, Insight

    def columns(obj, skip=()):
        return {c.key: getattr(obj, c.key) for c in type(obj).__table__.columns if c.key not in skip}

    with db.read() as session:
        found = {
            "insights": sorted((columns(i, ("id",)) for i in session.scalars(select(Insight))), key=str),
            "chats": sorted((columns(c) for c in session.scalars(select(Chat))), key=str),
            "events": sorted((columns(e, ("id", "at")) for e in session.scalars(select(Event))), key=str),
        }
        if db.fts:
            found["fts"] = sorted(tuple(row) for row in session.execute(text(
                "SELECT f.chat_id, f.body, f.rowid = c.rowid FROM chat_fts f LEFT JOIN chats c USING (chat_id)")))
    return found


def check_bulk_matches_ingest(insights: Insights, workdir: Path) -> None:
    """Store a few insights with `ingest_insight` and with the bulk path; the rows must be equal."""
    from app.crud.ingest import ingest_insight
    from app.db import Database

    now = datetime.now(timezone.utc).replace(microsecond=0)
    sample = [insights.make(n, f"check-{n}", now - timedelta(minutes=n)) for n in range(6)]
    stores = []
    for name in ("ingest", "bulk"):
        db = Database(f"sqlite:///{workdir / f'check-{name}.db'}")
        db.upgrade()
        if name == "ingest":
            for insight in sample:
                ingest_insight(db, insight.model_dump_json().encode(), message_id=insight.chat_id, received_at=now)
        else:
            write_batch(db, [bulk_rows(i, i.model_dump_json().encode(), now, i.chat_id) for i in sample])
        stores.append(snapshot(db))
        db.dispose()
    for table in stores[0]:
        if stores[0][table] != stores[1][table]:
            raise AssertionError(f"bulk {table} rows differ from what ingest_insight stores: the bench is stale")


def fill(db, insights: Insights, count: int, keep_events: int) -> dict:
    """`count` chats, newest last, waiting times spread over the last 30 days."""
    started = time.monotonic()
    now = datetime.now(timezone.utc)
    span = timedelta(days=30).total_seconds()
    progress = bar(count, "fill", "chats")
    try:
        for start in range(0, count, FILL_BATCH):
            rows = []
            for n in range(start, min(count, start + FILL_BATCH)):
                last = now - timedelta(seconds=span * (count - n) / max(count, 1) + 60)
                insight = insights.make(n, f"fill-{n:06d}", last)
                rows.append(bulk_rows(insight, insight.model_dump_json().encode(), last + timedelta(seconds=4),
                                     str(10**12 + n)))  # Pub/Sub message ids are numbers
            write_batch(db, rows, events_from=max(0, count - keep_events - start))
            progress.update(len(rows))
    finally:
        progress.close()
    seconds = time.monotonic() - started
    if not db.is_sqlite:
        with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE")
    return {"chats": count, "seconds": r(seconds, 1), "per_s": r(count / seconds, 1) if seconds else None}


# ---- processes -----------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def chatlens_command() -> list[str]:
    script = Path(sys.executable).with_name("chatlens")
    return [str(script)] if script.exists() else [sys.executable, "-m", "cli"]


class Process:
    """A subprocess in its own session, its output in a log file; stop() ends it, then its group."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], workdir: Path):
        self.name = name
        self.log_path = workdir / f"{name}.log"
        with self.log_path.open("ab") as log:
            self.popen = subprocess.Popen(command, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                say(f"{self.name} did not stop within {timeout:g} s: killed")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)
        return self.popen.returncode

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""


def wait_for(predicate, timeout: float, what: str, alive=lambda: True, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if not alive():
            raise RuntimeError(f"gave up waiting for {what}: the process ended")
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")


# ---- one database --------------------------------------------------------------------------
@dataclass
class Run:
    kind: str
    url: str
    args: argparse.Namespace
    workdir: Path
    insights: Insights
    project: str = "chatlens-bench"
    figures: dict = field(default_factory=dict)
    emulator: Process | None = None
    dashboard: Process | None = None
    base: str = ""
    cookie: str = ""

    # -- set-up --
    def env(self, **extra: str) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items()
               if not key.startswith("CHATLENS_") and key != "PUBSUB_EMULATOR_HOST"}
        return env | {"PYTHONUNBUFFERED": "1", "CHATLENS_PROJECT": self.project} | extra

    def start_emulator(self) -> str:
        port = free_port()
        self.emulator = Process(f"emulator-{self.kind}", [*chatlens_command(), "pubsub-emulator", "--port", str(port)],
                                self.env(), self.workdir)
        address = f"localhost:{port}"
        done = subprocess.run([*chatlens_command(), "pubsub-init", "--project", self.project,
                               "--emulator-host", address, "--timeout", "60"],
                              cwd=self.workdir, env=self.env(), capture_output=True, text=True, timeout=120)
        if done.returncode:
            raise RuntimeError(f"pubsub-init failed: {done.stderr.strip()}\n{self.emulator.tail()}")
        return address

    def add_user(self) -> None:
        done = subprocess.run([*chatlens_command(), "users", "--database-url", self.url, "add", USERNAME,
                               "--role", "supervisor", "--password-stdin"], input=PASSWORD + "\n",
                              cwd=self.workdir, env=self.env(), capture_output=True, text=True, timeout=120)
        if done.returncode:
            raise RuntimeError(f"chatlens users add failed: {done.stderr.strip()}")

    def start_dashboard(self, emulator: str) -> None:
        import httpx

        port = free_port()
        retention = max(10_000, self.args.insights + self.args.sse_insights + 1000)  # events read back below
        self.dashboard = Process(
            f"dashboard-{self.kind}",
            [*chatlens_command(), "dashboard", "--port", str(port), "--database-url", self.url],
            self.env(PUBSUB_EMULATOR_HOST=emulator, CHATLENS_EVENT_RETENTION=str(retention)), self.workdir)
        self.base = f"http://127.0.0.1:{port}"

        def ready() -> bool:
            try:
                return httpx.get(f"{self.base}/readyz", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, 120, "the dashboard to be ready", self.dashboard.alive, 0.5)
        with httpx.Client(base_url=self.base, timeout=30) as client:
            response = client.post("/api/session", json={"username": USERNAME, "password": PASSWORD})
            response.raise_for_status()
            self.cookie = client.cookies["chatlens_session"]

    def client(self, **kwargs):
        import httpx

        return httpx.Client(base_url=self.base, cookies={"chatlens_session": self.cookie},
                            timeout=httpx.Timeout(60.0), **kwargs)

    # -- the whole run --
    def run(self) -> dict:
        from app.db import Database
        from chatlens.config import LAYOUT, topic_path

        args = self.args
        db = Database(self.url)
        try:
            db.upgrade()
            existing = args.insights + args.sse_insights
            to_fill = max(0, args.chats - existing)
            say(f"[{self.kind}] filling {to_fill} chats ({existing} more come through Pub/Sub)")
            self.figures["fill"] = fill(db, self.insights, to_fill, keep_events=10_000)
            self.add_user()
            emulator = self.start_emulator()
            self.start_dashboard(emulator)
            say(f"[{self.kind}] dashboard ready at {self.base}")
            publisher = make_publisher(emulator)
            topic = topic_path(self.project, LAYOUT.insights_topic)
            try:
                self.figures["ingest"] = self.ingest(db, publisher, topic)
                self.figures["sse"] = self.live(db, publisher, topic)
            finally:
                with contextlib.suppress(Exception):
                    publisher.stop()
            self.figures["latency"] = self.latency(db)
            self.figures["database"] = database_figures(db)
        finally:
            code = self.dashboard.stop() if self.dashboard else None
            if self.emulator:
                self.emulator.stop()
            db.dispose()
        self.figures["dashboard_exit_code"] = code
        return self.figures

    # -- 2. ingest --
    def ingest(self, db, publisher, topic: str) -> dict:
        n = self.args.insights
        now = datetime.now(timezone.utc)
        payloads = [(f"ingest-{i:06d}", self.insights.make(i, f"ingest-{i:06d}", now - timedelta(seconds=n - i))
                     .model_dump_json().encode()) for i in range(n)]
        before_insight, before_event = max_ids(db)
        metrics_before = lag_metrics(self.base)
        say(f"[{self.kind}] ingest: publishing {n} insights in one burst")
        sent_at: dict[str, float] = {}
        futures = []
        for chat_id, data in payloads:
            sent_at[chat_id] = time.time()
            futures.append(publisher.publish(topic, data, chat_id=chat_id))
        first = min(sent_at.values())
        progress = bar(n, "published", "msg")
        for future in futures:
            future.result(timeout=120)
            progress.update(1)
        progress.close()
        published_s = time.time() - first
        stored = count_stored(db, before_insight)
        progress = bar(n, "stored", "insights")
        deadline = time.monotonic() + max(120.0, n / 20)
        while stored < n and time.monotonic() < deadline and self.dashboard.alive():
            time.sleep(0.25)
            now_stored = count_stored(db, before_insight)
            progress.update(now_stored - stored)
            stored = now_stored
        progress.close()
        committed = commit_times(db, before_event, "ingest-")
        lags = [committed[c] - sent_at[c] for c in sent_at if c in committed]
        last_commit = max(committed.values(), default=None)
        metrics_after = lag_metrics(self.base)
        count = metrics_after[1] - metrics_before[1]
        figures = {
            "published": n, "stored": stored, "events_read": len(committed),
            "publish_s": r(published_s, 2),
            "total_s": r(last_commit - first, 2) if last_commit else None,
            "per_s": r(stored / (last_commit - first), 1) if last_commit and last_commit > first else None,
            "lag": spread(lags),
            "dashboard_mean_lag_s": r((metrics_after[0] - metrics_before[0]) / count) if count else None,
        }
        say(f"[{self.kind}] ingest: {stored}/{n} stored in {figures['total_s']} s "
            f"({figures['per_s']}/s), lag p95 {figures['lag']['p95_s']} s")
        if stored < n:
            say(f"[{self.kind}] only {stored} of {n} stored; dashboard log:\n{self.dashboard.tail()}")
        return figures

    # -- 3. live updates --
    def live(self, db, publisher, topic: str) -> dict:
        args = self.args
        n, clients = args.sse_insights, args.sse_clients
        now = datetime.now(timezone.utc)
        payloads = [(f"live-{i:06d}", self.insights.make(i, f"live-{i:06d}", now - timedelta(seconds=n - i))
                     .model_dump_json().encode()) for i in range(n)]
        expected = {chat_id for chat_id, _ in payloads}
        _, before_event = max_ids(db)
        listeners = Listeners(self.base, self.cookie, clients, expected)
        listeners.start()
        sent_at: dict[str, float] = {}
        try:
            say(f"[{self.kind}] live: {clients} clients connecting to /api/events")
            with contextlib.suppress(TimeoutError):
                wait_for(lambda: listeners.settled() == clients, 60, "the live clients to connect")
            connected = listeners.connected()
            say(f"[{self.kind}] live: {connected}/{clients} connected; publishing {n} insights at {args.sse_rate:g}/s")
            futures = []
            start = time.monotonic()
            progress = bar(n, "published", "msg")
            for i, (chat_id, data) in enumerate(payloads):
                delay = start + i / args.sse_rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                sent_at[chat_id] = time.time()
                futures.append(publisher.publish(topic, data, chat_id=chat_id))
                progress.update(1)
            progress.close()
            for future in futures:
                future.result(timeout=120)
            progress = bar(connected * n, "delivered", "events")
            deadline = time.monotonic() + max(60.0, n / 10)
            done = 0
            while time.monotonic() < deadline and listeners.received() < connected * n:
                time.sleep(0.25)
                now_done = listeners.received()
                progress.update(now_done - done)
                done = now_done
            progress.close()
        finally:
            listeners.stop()
        committed = commit_times(db, before_event, "live-")
        from_publish, from_commit = [], []
        for arrivals in listeners.arrivals:
            for chat_id, at in arrivals.items():
                if chat_id in sent_at:
                    from_publish.append(at - sent_at[chat_id])
                if chat_id in committed:
                    from_commit.append(at - committed[chat_id])
        complete = sum(1 for arrivals in listeners.arrivals if expected <= arrivals.keys())
        figures = {
            "clients": clients, "connected": connected, "received_all": complete, "insights": n,
            "stored": len(committed), "rate_per_s": args.sse_rate, "errors": listeners.errors[:5],
            "delay_from_publish": spread(from_publish), "delay_from_commit": spread(from_commit),
        }
        say(f"[{self.kind}] live: {complete}/{clients} clients got all {n} events; delivery p95 "
            f"{figures['delay_from_publish']['p95_s']} s after publish, "
            f"{figures['delay_from_commit']['p95_s']} s after commit")
        return figures

    # -- 4. latency --
    def latency(self, db) -> dict:
        from sqlalchemy import func, select

        from app.models import Chat

        with db.read() as session:
            total = session.scalar(select(func.count()).select_from(Chat))
            ids = list(session.scalars(select(Chat.chat_id).order_by(func.random()).limit(500)))
        rng = random.Random(3)
        paths = {
            "queue page": lambda: "/",
            "queue list": lambda: "/partials/queue",
            "api queue": lambda: "/api/chats",
            "api chat": lambda: f"/api/chats/{rng.choice(ids)}",
        }
        results = {"chats": total}
        for name, path in paths.items():
            results[name] = self.hammer(name, path, total)
        return results

    def hammer(self, name: str, path, total: int) -> dict:
        """`--requests` GETs, `--concurrency` threads at a time, each with its own connection."""
        args = self.args
        counter = itertools.count()
        times: list[float] = []
        errors: list[str] = []
        lock = threading.Lock()
        progress = bar(args.requests, name, "req")

        def check(response) -> str | None:
            if response.status_code != 200:
                return f"{response.status_code} {response.text[:200]}"
            if name == "api queue" and response.json()["total"] != total:
                return f"total {response.json()['total']} != {total}"
            if name == "queue page" and 'id="queue"' not in response.text:
                return "no queue in the page"
            return None

        def worker() -> None:
            with self.client() as client:
                for _ in range(3):  # warm-up: connection, caches; not counted
                    client.get(path())
                while next(counter) < args.requests:
                    target = path()
                    started = time.perf_counter()
                    try:
                        response = client.get(target)
                        problem = check(response)
                    except Exception as error:  # noqa: BLE001 - counted, reported
                        problem = f"{type(error).__name__}: {error}"
                    took = time.perf_counter() - started
                    with lock:
                        times.append(took)
                        if problem:
                            errors.append(f"{target}: {problem}")
                    progress.update(1)

        wall = time.perf_counter()
        threads = [threading.Thread(target=worker, name=f"bench-{name}-{i}") for i in range(args.concurrency)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(600)
        wall = time.perf_counter() - wall
        progress.close()
        figures = {**spread(times), "per_s": r(len(times) / wall, 1), "errors": len(errors),
                   "first_errors": errors[:3]}
        say(f"[{self.kind}] {name}: p50 {fmt(figures['p50_s'], 3)} s, p95 {fmt(figures['p95_s'], 3)} s, "
            f"{figures['per_s']} req/s, {len(errors)} errors")
        return figures


# ---- helpers on the database and the dashboard ---------------------------------------------
def max_ids(db) -> tuple[int, int]:
    from sqlalchemy import func, select

    from app.models import Event, Insight

    with db.read() as session:
        return (session.scalar(select(func.max(Insight.id))) or 0, session.scalar(select(func.max(Event.id))) or 0)


def count_stored(db, after_id: int) -> int:
    """Insight rows committed since `after_id` (a primary-key range: cheap on 100,000 rows)."""
    from sqlalchemy import func, select

    from app.models import Insight

    with db.read() as session:
        return session.scalar(select(func.count()).select_from(Insight).where(Insight.id > after_id)) or 0


def commit_times(db, after_event: int, prefix: str) -> dict[str, float]:
    """chat_id -> Unix time of its insight's live-update event, written just before the commit."""
    from sqlalchemy import select

    from app.models import Event

    with db.read() as session:
        rows = session.execute(select(Event.chat_id, Event.at).where(Event.id > after_event, Event.kind == "chat"))
        return {chat_id: at.timestamp() for chat_id, at in rows if chat_id and chat_id.startswith(prefix)}


def lag_metrics(base: str) -> tuple[float, float]:
    """(sum, count) of the dashboard's publish->callback lag for the insights subscriber (/metrics)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{base}/metrics", timeout=30).text
    total = count = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("subscriber") != "insights":
                continue
            if sample.name == "chatlens_dashboard_publish_to_commit_seconds_sum":
                total = sample.value
            elif sample.name == "chatlens_dashboard_publish_to_commit_seconds_count":
                count = sample.value
    return total, count


def database_figures(db) -> dict:
    if db.is_sqlite:
        path = Path(db.engine.url.database)
        size = sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
    else:
        with db.engine.connect() as conn:
            size = conn.exec_driver_sql("SELECT pg_database_size(current_database())").scalar()
    return {"size_mb": r(size / 2**20, 1)}


def make_publisher(emulator: str):
    """A real PublisherClient on its own channel to the local server."""
    import grpc
    from google.cloud import pubsub_v1
    from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport

    return pubsub_v1.PublisherClient(
        transport=PublisherGrpcTransport(channel=grpc.insecure_channel(emulator), host=emulator),
        client_options={"api_endpoint": emulator},
    )


class Listeners:
    """`count` live-update clients on one asyncio loop (a thread of its own): each keeps when
    every `chat` event arrived, by chat_id, until it has all of `expected` or is stopped."""

    def __init__(self, base: str, cookie: str, count: int, expected: set[str]):
        self.base, self.cookie, self.count, self.expected = base, cookie, count, expected
        self.arrivals: list[dict[str, float]] = [{} for _ in range(count)]
        self.hello = [False] * count
        self.failed = [False] * count
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._main, name="sse-clients", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def connected(self) -> int:
        return sum(self.hello)

    def settled(self) -> int:
        return sum(1 for h, f in zip(self.hello, self.failed) if h or f)

    def received(self) -> int:
        with self._lock:
            return sum(len(a) for a in self.arrivals)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop ended already: every client had all
                self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def _main(self) -> None:
        asyncio.run(self._all())

    async def _all(self) -> None:
        import httpx

        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        limits = httpx.Limits(max_connections=self.count + 5, max_keepalive_connections=self.count + 5)
        async with httpx.AsyncClient(base_url=self.base, cookies={"chatlens_session": self.cookie}, limits=limits,
                                     timeout=httpx.Timeout(30.0, read=None)) as client:
            tasks = [asyncio.create_task(self._one(client, i)) for i in range(self.count)]
            waiter = asyncio.create_task(self._stop.wait())
            await asyncio.wait([waiter, asyncio.gather(*tasks, return_exceptions=True)],
                               return_when=asyncio.FIRST_COMPLETED)
            for task in [*tasks, waiter]:
                task.cancel()
            await asyncio.gather(*tasks, waiter, return_exceptions=True)

    async def _one(self, client, index: int) -> None:
        arrivals = self.arrivals[index]
        try:
            async with client.stream("GET", "/api/events", headers={"Accept": "text/event-stream"}) as response:
                if response.status_code != 200:
                    raise RuntimeError(f"HTTP {response.status_code}")
                kind, data = "", []
                async for line in response.aiter_lines():
                    if line:
                        if not line.startswith(":"):
                            name, _, value = line.partition(":")
                            value = value[1:] if value.startswith(" ") else value
                            if name == "event":
                                kind = value
                            elif name == "data":
                                data.append(value)
                        continue
                    now = time.time()
                    if kind == "hello" or kind == "resync":
                        self.hello[index] = True
                    elif kind == "chat":
                        chat_id = json.loads("\n".join(data)).get("chat_id")
                        if chat_id in self.expected and chat_id not in arrivals:
                            with self._lock:
                                arrivals[chat_id] = now
                            if len(arrivals) == len(self.expected):
                                return
                    kind, data = "", []
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - counted, reported
            self.failed[index] = True
            with self._lock:
                self.errors.append(f"client {index}: {type(error).__name__}: {error}")


# ---- PostgreSQL ----------------------------------------------------------------------------
@contextlib.contextmanager
def postgres_database(server_url: str | None) -> Iterator[str]:
    """A fresh database: on the given server (created, then dropped), else on a throwaway server."""
    if server_url is None:
        sys.path.insert(0, str(ROOT / "tests"))
        from throwaway_postgres import throwaway_postgres

        with throwaway_postgres() as url:
            yield url
        return
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    name = f"chatlens_bench_{os.getpid()}_{int(time.time())}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


# ---- output --------------------------------------------------------------------------------
def table(results: dict[str, dict], args: argparse.Namespace) -> str:
    kinds = list(results)
    width = 24
    lines = [f"{'':<34}" + "".join(f"{k:>{width}}" for k in kinds), "-" * (34 + width * len(kinds))]

    def row(label: str, get) -> None:
        cells = []
        for kind in kinds:
            try:
                cells.append(get(results[kind]))
            except (KeyError, TypeError):
                cells.append("-")
        lines.append(f"{label:<34}" + "".join(f"{c:>{width}}" for c in cells))

    row("fill (bulk, not timed as ingest)", lambda f: f"{f['fill']['chats']} in {fmt(f['fill']['seconds'], 1)} s")
    row(f"ingest: {args.insights} in a burst, stored",
        lambda f: f"{f['ingest']['stored']}/{f['ingest']['published']}")
    row("  all stored after (s)", lambda f: fmt(f["ingest"]["total_s"], 1))
    row("  throughput (insights/s)", lambda f: fmt(f["ingest"]["per_s"], 0))
    row("  lag publish->commit p50 (s)", lambda f: fmt(f["ingest"]["lag"]["p50_s"]))
    row("  lag publish->commit p95 (s)", lambda f: fmt(f["ingest"]["lag"]["p95_s"]))
    row("  lag max (s)", lambda f: fmt(f["ingest"]["lag"]["max_s"]))
    row("  dashboard's mean lag, /metrics", lambda f: fmt(f["ingest"]["dashboard_mean_lag_s"]))
    row(f"live: {args.sse_clients} clients, connected", lambda f: f"{f['sse']['connected']}/{f['sse']['clients']}")
    row(f"  {args.sse_insights} insights at {args.sse_rate:g}/s, stored",
        lambda f: f"{f['sse']['stored']}/{f['sse']['insights']}")
    row(f"  clients that got all {args.sse_insights} events", lambda f: f"{f['sse']['received_all']}/{f['sse']['clients']}")
    row("  delay publish->client p50 (s)", lambda f: fmt(f["sse"]["delay_from_publish"]["p50_s"], 3))
    row("  delay publish->client p95 (s)", lambda f: fmt(f["sse"]["delay_from_publish"]["p95_s"], 3))
    row("  delay commit->client p95 (s)", lambda f: fmt(f["sse"]["delay_from_commit"]["p95_s"], 3))
    row("latency with chats stored", lambda f: str(f["latency"]["chats"]))
    for name in ENDPOINTS:
        row(f"  {name} p50 / p95 (ms)",
            lambda f, n=name: f"{fmt(1000 * f['latency'][n]['p50_s'], 0)} / {fmt(1000 * f['latency'][n]['p95_s'], 0)}")
        row(f"  {name} req/s, errors",
            lambda f, n=name: f"{fmt(f['latency'][n]['per_s'], 1)}, {f['latency'][n]['errors']}")
    row("database size (MB)", lambda f: fmt(f["database"]["size_mb"], 0))
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--insights", type=int, default=10_000,
                        help="insights published in one burst (default %(default)s)")
    parser.add_argument("--chats", type=int, default=100_000,
                        help="chats stored when latency is measured (default %(default)s)")
    parser.add_argument("--sse-clients", type=int, default=50, help="live-update clients (default %(default)s)")
    parser.add_argument("--sse-insights", type=int, default=500,
                        help="insights published while they listen (default %(default)s)")
    parser.add_argument("--sse-rate", type=float, default=25.0,
                        help="... published per second (default %(default)s)")
    parser.add_argument("--requests", type=int, default=200, help="requests per endpoint (default %(default)s)")
    parser.add_argument("--concurrency", type=int, default=4, help="requests in flight at once (default %(default)s)")
    parser.add_argument("--databases", default="sqlite,postgresql",
                        help="which databases, in order (default %(default)s)")
    parser.add_argument("--postgres-url", default=os.environ.get("CHATLENS_BENCH_POSTGRES_URL"),
                        help="a PostgreSQL server to create a scratch database on (default: "
                             "CHATLENS_BENCH_POSTGRES_URL, else a throwaway server)")
    parser.add_argument("--keep", type=Path, default=None, metavar="DIR",
                        help="copy the processes' logs here (deleted otherwise, unless a run fails)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run: " + ", ".join(f"{k.replace('_', '-')} {v:g}" for k, v in QUICK.items()))
    args = parser.parse_args(argv)
    apply_quick(args, argv, QUICK)
    args.databases = comma_choices(parser, "--databases", args.databases, DATABASES)
    if min(args.insights, args.sse_clients, args.sse_insights, args.requests, args.concurrency) < 1 or args.sse_rate <= 0:
        parser.error("counts and rates must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    load_before = os.getloadavg()  # other work on the machine shows here: the figures share its cores
    workdir = Path(tempfile.mkdtemp(prefix="chatlens-dashboard-bench-"))
    results: dict[str, dict] = {}
    failed = False
    try:
        insights = Insights()
        check_bulk_matches_ingest(insights, workdir)
        for kind in args.databases:
            context = (contextlib.nullcontext(f"sqlite:///{workdir / 'dashboard.db'}") if kind == "sqlite"
                       else postgres_database(args.postgres_url))
            run = None
            try:
                with context as url:
                    run = Run(kind, url, args, workdir, insights, project=f"chatlens-bench-{kind}")
                    results[kind] = run.run()
            except KeyboardInterrupt:
                results[kind] = run.figures if run else {}
                raise
            except Exception as error:  # noqa: BLE001 - reported, the next database still runs
                failed = True
                say(f"[{kind}] failed: {type(error).__name__}: {error}")
                if run is not None and run.dashboard is not None:
                    say(f"[{kind}] dashboard log:\n{run.dashboard.tail()}")
                results.setdefault(kind, run.figures if run else {})
    except KeyboardInterrupt:
        failed = True
        say("interrupted")
    finally:
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            for log in workdir.glob("*.log"):
                shutil.copy(log, args.keep / log.name)
        if failed and not args.keep:
            say(f"logs kept in {workdir}")
            for path in workdir.glob("*.db*"):
                path.unlink()
        else:
            shutil.rmtree(workdir, ignore_errors=True)

    complete = not failed and all(
        f.get("ingest", {}).get("stored") == args.insights and f.get("sse", {}).get("stored") == args.sse_insights
        and f.get("sse", {}).get("received_all") == args.sse_clients
        and all(f.get("latency", {}).get(n, {}).get("errors") == 0 for n in ENDPOINTS)
        for f in results.values()) and len(results) == len(args.databases)
    print(table(results, args))
    print(f"load average (1, 5, 15 min) before {' '.join(f'{x:.2f}' for x in load_before)}, "
          f"after {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    summary = {
        "bench": "dashboard", "quick": args.quick, "cpus": os.cpu_count(), "insights": args.insights,
        "chats": args.chats, "sse_clients": args.sse_clients, "sse_insights": args.sse_insights,
        "sse_rate_per_s": args.sse_rate, "requests": args.requests, "concurrency": args.concurrency,
        "wall_s": round(time.monotonic() - started), "load_avg_before": [round(x, 2) for x in load_before],
        "load_avg_after": [round(x, 2) for x in os.getloadavg()], **results, "complete": complete,
    }
    print(json.dumps(summary, default=str))
    return 0 if complete else 1


if __name__ == "__main__":
    sys.exit(main())
