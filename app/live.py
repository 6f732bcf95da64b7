"""Live updates for browsers: one poller per process fans database events out to SSE streams.

Events are rows in the `events` table (written with the change they announce), so an event
id means the same in every process and after a restart. A browser that reconnects with
Last-Event-ID gets what it missed from the table; if that is no longer there (pruned, or
too much), it gets `resync` and reloads its list. Changes made in this process wake the
poller at once; other processes' changes are seen within `poll_seconds`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from app.crud import events as event_rows
from app.db import Database

log = logging.getLogger(__name__)

REPLAY_LIMIT = 1000
QUEUE_LIMIT = 2000
GAP_PATIENCE_SECONDS = 10.0  # PostgreSQL may commit id 10 after id 11: wait for it this long
PRUNE_EVERY_SECONDS = 60.0
STATUS_EVERY_SECONDS = 2.0


@dataclass(frozen=True)
class LiveEvent:
    kind: str  # chat | errorlog | hello | resync | status
    data: dict[str, Any] = field(default_factory=dict)
    id: int | None = None  # only durable events (and hello/resync markers) carry one


_QUIET = LiveEvent("quiet", {})
"""What the stream sees when nothing arrived for `check_seconds`: time to re-check, nothing to send."""


class EventHub:
    def __init__(self, db: Database, poll_seconds: float = 1.0, retention: int = 10_000,
                 status_provider: Callable[[], dict[str, Any]] | None = None) -> None:
        self._db = db
        self._poll_seconds = poll_seconds
        self._retention = retention
        self._status_provider = status_provider or (lambda: {})
        self._listeners: set[asyncio.Queue[LiveEvent | None]] = set()
        self._missing: dict[int, float] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._last_status: dict[str, Any] | None = None
        self.last_id = 0

    # -- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self.last_id = await asyncio.to_thread(self._read_last_id)
        # Every stream starts with the status of its moment: later ones go out only on a change.
        self._last_status = self._status()
        self._task = asyncio.create_task(self._poll_forever(), name="live-events")

    def close(self) -> None:
        """End every stream now (server shutting down); safe to call more than once."""
        self._closed = True
        for queue in list(self._listeners):
            queue.put_nowait(None)
        if self._wake is not None:
            self._wake.set()

    def close_threadsafe(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.close)

    async def stop(self) -> None:
        self.close()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def notify(self) -> None:
        """Something was committed: look now rather than at the next poll (any thread)."""
        if self._loop is not None and self._wake is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wake.set)

    @property
    def listeners(self) -> int:
        return len(self._listeners)

    # -- streams ----------------------------------------------------------------------------

    async def stream(self, after: int | None, still_allowed: Callable[[], Awaitable[bool]] | None = None,
                     check_seconds: float = 3.0) -> AsyncIterator[LiveEvent]:
        """Events for one browser: what it missed since `after`, then everything new.

        `still_allowed` is asked at least every `check_seconds`, events or not: the stream ends
        when it says no (the session was logged out, expired or its user disabled).
        """
        queue: asyncio.Queue[LiveEvent | None] = asyncio.Queue()
        self._listeners.add(queue)
        try:
            if self._closed:
                return
            sent = self.last_id
            if after is None or after > self.last_id:
                yield LiveEvent("hello" if after is None else "resync", {}, self.last_id)
            else:
                replay, complete = await asyncio.to_thread(self._replay, after)
                if not complete:
                    yield LiveEvent("resync", {}, self.last_id)
                else:
                    sent = after
                    for event in replay:
                        yield event
                        sent = max(sent, event.id or 0)
            yield LiveEvent("status", self._status())
            next_check = time.monotonic() + check_seconds
            while True:
                # Wait no longer than the next check is due: events arriving just under
                # `check_seconds` apart must not push every check back to the event after it.
                try:
                    event = await asyncio.wait_for(queue.get(), timeout=max(0.0, next_check - time.monotonic()))
                except TimeoutError:
                    event = _QUIET
                if time.monotonic() >= next_check:
                    if still_allowed is not None and not await still_allowed():
                        return
                    next_check = time.monotonic() + check_seconds
                if event is None:
                    return
                if event is _QUIET:
                    continue
                if event.id is not None and event.id <= sent:
                    continue
                yield event
                if event.id is not None:
                    sent = event.id
        finally:
            self._listeners.discard(queue)

    def _replay(self, after: int) -> tuple[list[LiveEvent], bool]:
        with self._db.read() as session:
            first = event_rows.first_event_id(session)
            if first and after < first - 1:
                return [], False  # some were pruned: the browser must reload
            rows = event_rows.events_after(session, after, REPLAY_LIMIT)
        if len(rows) == REPLAY_LIMIT:
            return [], False
        return [LiveEvent(row.kind, row.data, row.id) for row in rows], True

    def _status(self) -> dict[str, Any]:
        try:
            return self._status_provider()
        except Exception:  # noqa: BLE001 - a status light must never break a stream
            log.exception("status provider failed")
            return {}

    # -- the poller -------------------------------------------------------------------------

    def _read_last_id(self) -> int:
        with self._db.read() as session:
            return event_rows.last_event_id(session)

    def _fetch(self) -> list[LiveEvent]:
        """New rows since the last look, plus any late-committed ids from earlier gaps."""
        now = time.monotonic()
        found: list[LiveEvent] = []
        with self._db.read() as session:
            if self._missing:
                late = event_rows.events_by_id(session, list(self._missing))
                for row in late:
                    self._missing.pop(row.id, None)
                    found.append(LiveEvent(row.kind, row.data, row.id))
            rows = event_rows.events_after(session, self.last_id, REPLAY_LIMIT)
        expected = self.last_id + 1
        for row in rows:
            for gap in range(expected, min(row.id, expected + 100)):
                self._missing[gap] = now
            expected = row.id + 1
            found.append(LiveEvent(row.kind, row.data, row.id))
        if rows:
            self.last_id = rows[-1].id
        self._missing = {i: t for i, t in self._missing.items() if now - t < GAP_PATIENCE_SECONDS}
        return found

    def _prune(self) -> None:
        with self._db.writing() as session:
            event_rows.prune_events(session, self._retention)
            session.commit()

    def _publish(self, event: LiveEvent) -> None:
        for queue in list(self._listeners):
            if queue.qsize() >= QUEUE_LIMIT:  # a stalled browser: make it start over
                self._listeners.discard(queue)
                queue.put_nowait(None)
            else:
                queue.put_nowait(event)

    async def _poll_forever(self) -> None:
        assert self._wake is not None
        last_prune = last_status = time.monotonic()
        while not self._closed:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self._poll_seconds)
            except TimeoutError:
                pass
            self._wake.clear()
            if self._closed:
                break
            try:
                for event in await asyncio.to_thread(self._fetch):
                    self._publish(event)
                now = time.monotonic()
                if now - last_status >= STATUS_EVERY_SECONDS:
                    last_status = now
                    status = self._status()
                    if status != self._last_status:
                        self._last_status = status
                        self._publish(LiveEvent("status", status))
                if now - last_prune >= PRUNE_EVERY_SECONDS:
                    last_prune = now
                    await asyncio.to_thread(self._prune)
            except Exception:  # noqa: BLE001 - the database may be away for a while
                log.exception("live events: poll failed")
