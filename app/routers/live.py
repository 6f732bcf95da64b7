"""Server-Sent Events: the live queue. Resumes from Last-Event-ID after a reconnect."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import APIRouter, Header, Query, Request
from fastapi.sse import EventSourceResponse, ServerSentEvent
from starlette.concurrency import run_in_threadpool

from app.deps import MAX_SQL_INT, SESSION_COOKIE, Ctx, User, session_principal

router = APIRouter(tags=["live"])
RETRY_MS = 2000
SESSION_CHECK_SECONDS = 3.0  # how long a stream may outlive its session


def _parse_id(value: str | None) -> int | None:
    """An event id, clamped to what the events table can hold (a far-out one overflowed the query)."""
    try:
        number = int(value) if value not in (None, "") else None
    except ValueError:
        return None
    return None if number is None else max(0, min(number, MAX_SQL_INT))


@router.get("/api/events", response_class=EventSourceResponse)
async def events(
    request: Request, ctx: Ctx, user: User,
    last_event_id: Annotated[str | None, Header(max_length=32)] = None,
    after: Annotated[str | None, Query(max_length=32, description="Last-Event-ID for new EventSources")] = None,
) -> AsyncIterator[ServerSentEvent]:
    """`chat` and `errorlog` events carry ids; `hello` (first connect) and `resync` (reload your
    list: the events you missed are gone) carry the id to resume from; `status` tells the
    state of the Pub/Sub feed. `errorlog` goes to supervisors only. The stream ends within a
    few seconds of a logout, an expiry or the user being disabled."""
    assert ctx.hub is not None
    start = _parse_id(last_event_id) if last_event_id else _parse_id(after)
    token = request.cookies.get(SESSION_COOKIE)

    async def still_allowed() -> bool:
        return await run_in_threadpool(session_principal, ctx, token) is not None

    first = True
    async for event in ctx.hub.stream(start, still_allowed, SESSION_CHECK_SECONDS):
        if event.kind == "errorlog" and not user.is_supervisor:
            continue
        yield ServerSentEvent(
            event=event.kind, data=event.data,
            id=str(event.id) if event.id is not None else None,
            retry=RETRY_MS if first else None,
        )
        first = False
