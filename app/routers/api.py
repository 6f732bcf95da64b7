"""The JSON API: the same queue and review actions as the pages, for scripts and tools.

Changes need the session cookie and the X-CSRF-Token header (from GET /api/session).
Editing, approving and rejecting name the version they were based on; 409 means someone
else changed the chat first, and the answer carries the chat as it is now.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from app.crud import audit, chats, macros, review
from app.crud import errors as error_rows
from app.crud.chats import QueueFilter, resolve_assignee
from app.deps import (
    DB,
    BeforeId,
    Ctx,
    ErrorKind,
    Offset,
    SentimentFilter,
    StatusFilter,
    Supervisor,
    User,
    current_user,
)
from app.json_body import StrictJSONRoute
from app.schemas import (
    ApproveIn,
    AssignIn,
    AuditOut,
    ChatDetail,
    ChatSummary,
    ConflictOut,
    DraftIn,
    ErrorOut,
    QueueOut,
    RejectIn,
    SentimentIn,
)
from chatlens.contracts import ReplyLibrary

router = APIRouter(prefix="/api", tags=["queue"], dependencies=[Depends(current_user)],
                   responses={401: {"description": "Not logged in"}}, route_class=StrictJSONRoute)
CONFLICT = {409: {"model": ConflictOut, "description": "Changed by someone else since `version`"}}


def detail(ctx, chat_id: str) -> ChatDetail:
    with ctx.db.read() as session:
        return chats.chat_detail(session, chat_id)


def _announce(ctx, chat_id: str) -> ChatDetail:
    if ctx.hub is not None:
        ctx.hub.notify()
    return detail(ctx, chat_id)


@router.get("/chats", response_model=QueueOut)
def list_chats(
    ctx: Ctx, user: User,
    status: StatusFilter = "open",
    sentiment: SentimentFilter = None,
    assignee: Annotated[str | None, Query(description='username, "me" or "none"', max_length=64)] = None,
    tenant: Annotated[str | None, Query(max_length=128)] = None,
    q: Annotated[str | None, Query(max_length=200, description="full-text search")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Offset = 0,
) -> QueueOut:
    """The queue, most urgent first (negative, then longest waiting)."""
    f = QueueFilter(status=status, sentiment=sentiment, assignee=resolve_assignee(assignee, user.username),
                    tenant=tenant or None, q=q, limit=limit, offset=offset)
    with ctx.db.read() as session:
        page = chats.list_chats(session, f, ctx.db.fts)
    return QueueOut(items=[ChatSummary.of(c) for c in page.items], total=page.total, counts=page.counts)


@router.get("/chats/{chat_id}", response_model=ChatDetail, responses={404: {"description": "No such chat"}})
def get_chat(ctx: Ctx, chat_id: str) -> ChatDetail:
    return detail(ctx, chat_id)


@router.put("/chats/{chat_id}/draft", response_model=ChatDetail, responses=CONFLICT)
def save_draft(ctx: Ctx, user: User, chat_id: str, body: DraftIn) -> ChatDetail:
    review.save_draft(ctx.db, chat_id, user.username, body.text, body.version)
    return _announce(ctx, chat_id)


@router.post("/chats/{chat_id}/approve", response_model=ChatDetail, responses=CONFLICT)
def approve(ctx: Ctx, user: User, chat_id: str, body: ApproveIn) -> ChatDetail:
    review.approve(ctx.db, chat_id, user.username, body.version, body.text)
    return _announce(ctx, chat_id)


@router.post("/chats/{chat_id}/reject", response_model=ChatDetail, responses=CONFLICT)
def reject(ctx: Ctx, user: User, chat_id: str, body: RejectIn) -> ChatDetail:
    review.reject(ctx.db, chat_id, user.username, body.version, body.reason)
    return _announce(ctx, chat_id)


@router.post("/chats/{chat_id}/assign", response_model=ChatDetail)
def assign(ctx: Ctx, user: User, chat_id: str, body: AssignIn) -> ChatDetail:
    review.assign(ctx.db, chat_id, user.username, resolve_assignee(body.assignee, user.username))
    return _announce(ctx, chat_id)


@router.post("/chats/{chat_id}/handled", response_model=ChatDetail)
def handled(ctx: Ctx, user: User, chat_id: str) -> ChatDetail:
    review.mark_handled(ctx.db, chat_id, user.username)
    return _announce(ctx, chat_id)


@router.post("/chats/{chat_id}/reopen", response_model=ChatDetail)
def reopen(ctx: Ctx, user: User, chat_id: str) -> ChatDetail:
    review.reopen(ctx.db, chat_id, user.username)
    return _announce(ctx, chat_id)


@router.post("/chats/{chat_id}/sentiment", response_model=ChatDetail)
def correct_sentiment(ctx: Ctx, user: User, chat_id: str, body: SentimentIn) -> ChatDetail:
    """Record the right sentiment for the current window (kept as feedback for evaluation)."""
    review.correct_sentiment(ctx.db, chat_id, user.username, body.corrected)
    return _announce(ctx, chat_id)


@router.post("/chats/{chat_id}/copied", status_code=204)
def copied(db: DB, user: User, chat_id: str) -> None:
    """Note in the audit log that the reply was copied to the clipboard."""
    review.record_copy(db, chat_id, user.username)


@router.get("/tenants", response_model=list[str])
def tenants(ctx: Ctx) -> list[str]:
    with ctx.db.read() as session:
        return chats.tenants(session)


@router.get("/audit", response_model=list[AuditOut], tags=["supervisor"],
            responses={403: {"description": "Supervisors only"}})
def audit_log(
    ctx: Ctx, _supervisor: Supervisor,
    chat_id: Annotated[str | None, Query(max_length=128)] = None,
    actor: Annotated[str | None, Query(max_length=64)] = None,
    action: Annotated[str | None, Query(max_length=32)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
    before_id: BeforeId = None,
) -> list[AuditOut]:
    with ctx.db.read() as session:
        rows = audit.list_entries(session, chat_id, actor, action, limit, before_id)
        return [AuditOut.of(row) for row in rows]


@router.get("/errors", response_model=list[ErrorOut], tags=["supervisor"],
            responses={403: {"description": "Supervisors only"}})
def errors(
    ctx: Ctx, _supervisor: Supervisor,
    kind: ErrorKind = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
    before_id: BeforeId = None,
) -> list[ErrorOut]:
    with ctx.db.read() as session:
        return [ErrorOut.of(row) for row in error_rows.list_errors(session, kind, limit, before_id)]


@router.get("/reply-library", response_model=ReplyLibrary, tags=["supervisor"],
            responses={403: {"description": "Supervisors only"}})
def reply_library(ctx: Ctx, _supervisor: Supervisor) -> ReplyLibrary:
    """The team's reply macros, all languages, in library order: what the pipeline reads (`--reply-library`)."""
    with ctx.db.read() as session:
        return macros.library(session)
