"""The HTML pages: the queue with its review pane, and the supervisors' audit, errors and reply
library views.

Pages work without JavaScript (forms post and redirect); with htmx they swap only the
queue list or the review pane. Review forms answer htmx with the refreshed pane, with
status 409 and the colleague's newer text when a save lost the race.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any
from urllib.parse import urlencode

from fastapi import APIRouter, Form, Path, Query, Request
from fastapi.responses import RedirectResponse, Response

from app.context import AppContext
from app.crud import audit, chats, macros, review, users
from app.crud import errors as error_rows
from app.crud.chats import SENTIMENTS, STATUS_FILTERS, UNASSIGNED, QueueFilter, resolve_assignee
from app.crud.sessions import Principal
from app.deps import MAX_SQL_INT, BeforeId, Ctx, Supervisor, User
from app.errors import Conflict, Invalid
from app.schemas import AuditOut, ChatSummary, ErrorOut, MacroOut
from app.web import is_htmx, render
from chatlens.contracts import MAX_MACRO_BODY_CHARS, MAX_REPLY_CHARS

router = APIRouter(include_in_schema=False)
FILTER_KEYS = ("status", "sentiment", "assignee", "tenant", "q")


def read_filter(request: Request, user: Principal, limit: int) -> tuple[QueueFilter, dict[str, str]]:
    """The queue filter from the query string (unknown values ignored), and its raw values."""
    params = request.query_params
    raw = {key: (params.get(key) or "").strip()[:200] for key in FILTER_KEYS}
    if raw["status"] not in STATUS_FILTERS:
        raw["status"] = "open"
    if raw["sentiment"] not in SENTIMENTS:
        raw["sentiment"] = ""
    f = QueueFilter(status=raw["status"], sentiment=raw["sentiment"] or None,
                    assignee=resolve_assignee(raw["assignee"], user.username),
                    tenant=raw["tenant"] or None, q=raw["q"] or None, limit=limit)
    return f, raw


def _query(raw: dict[str, str]) -> str:
    kept = {k: v for k, v in raw.items() if v and not (k == "status" and v == "open")}
    return ("?" + urlencode(kept)) if kept else ""


def queue_context(ctx: AppContext, request: Request, user: Principal, selected: str | None = None) -> dict:
    f, raw = read_filter(request, user, ctx.settings.page_size)
    with ctx.db.read() as session:
        page = chats.list_chats(session, f, ctx.db.fts)
        tenant_names = chats.tenants(session)
    return {
        "oob": False, "sentiments": SENTIMENTS,
        "items": [ChatSummary.of(c) for c in page.items], "total": page.total, "counts": page.counts,
        "filters": raw, "query": _query(raw), "tenants": tenant_names,
        "assignees": users.active_usernames(ctx.db), "selected": selected,
        "statuses": STATUS_FILTERS, "unassigned": UNASSIGNED,
    }


def detail_context(ctx: AppContext, user: Principal, chat_id: str) -> dict[str, Any]:
    with ctx.db.read() as session:
        chat_detail = chats.chat_detail(session, chat_id)
        history = ([AuditOut.of(e) for e in audit.list_entries(session, chat_id=chat_id, limit=20)]
                   if user.is_supervisor else [])
    return {"chat": chat_detail, "history": history, "max_reply": MAX_REPLY_CHARS,
            "conflict": None, "error": None, "mine": None, "assignees": users.active_usernames(ctx.db)}


@router.get("/")
def queue_page(request: Request, ctx: Ctx, user: User) -> Response:
    with ctx.db.read() as session:
        glance = chats.overview(session, user.username)
        next_up = ChatSummary.of(glance.next_up) if glance.next_up else None
    return render(request, "queue.html", **queue_context(ctx, request, user), detail=None,
                  overview=glance, next_up=next_up)


@router.get("/partials/queue")
def queue_partial(request: Request, ctx: Ctx, user: User, selected: str | None = None) -> Response:
    return render(request, "partials/queue_list.html",
                  **(queue_context(ctx, request, user, selected) | {"oob": True}))


@router.get("/chats/{chat_id}")
def chat_page(request: Request, ctx: Ctx, user: User, chat_id: str) -> Response:
    if is_htmx(request) and request.headers.get("hx-target") == "detail":
        return render(request, "partials/detail.html", detail=detail_context(ctx, user, chat_id))
    return render(request, "queue.html", **queue_context(ctx, request, user, chat_id),
                  detail=detail_context(ctx, user, chat_id))


def _after_action(request: Request, ctx: AppContext, user: Principal, chat_id: str, flash: str,
                  status_code: int = 200, **extra: Any) -> Response:
    """htmx: the refreshed review pane; plain form: back to the chat's page."""
    if ctx.hub is not None and status_code == 200:
        ctx.hub.notify()
    if not is_htmx(request) and status_code == 200:
        return RedirectResponse(f"/chats/{chat_id}", status_code=303)
    context = detail_context(ctx, user, chat_id) | extra
    if is_htmx(request):
        return render(request, "partials/detail.html", status_code=status_code, flash=flash,
                      headers={"HX-Trigger": "queue-changed"}, detail=context)
    return render(request, "queue.html", status_code=status_code, flash=flash,
                  **queue_context(ctx, request, user, chat_id), detail=context)


def _run(request: Request, ctx: AppContext, user: Principal, chat_id: str, flash: str, action,
         mine: str | None = None) -> Response:
    try:
        action()
    except Conflict as error:
        return _after_action(request, ctx, user, chat_id, "", 409, conflict=str(error), mine=mine)
    except Invalid as error:
        return _after_action(request, ctx, user, chat_id, "", 422, error=str(error), mine=mine)
    return _after_action(request, ctx, user, chat_id, flash)


Version = Annotated[int, Form()]
Text = Annotated[str, Form(max_length=MAX_REPLY_CHARS * 2)]


@router.post("/chats/{chat_id}/draft")
def save_draft(request: Request, ctx: Ctx, user: User, chat_id: str, version: Version, text: Text = "") -> Response:
    return _run(request, ctx, user, chat_id, "Draft saved.",
                lambda: review.save_draft(ctx.db, chat_id, user.username, text, version), mine=text)


@router.post("/chats/{chat_id}/approve")
def approve(request: Request, ctx: Ctx, user: User, chat_id: str, version: Version, text: Text = "") -> Response:
    return _run(request, ctx, user, chat_id, "Reply approved.",
                lambda: review.approve(ctx.db, chat_id, user.username, version, text or None), mine=text)


@router.post("/chats/{chat_id}/reject")
def reject(request: Request, ctx: Ctx, user: User, chat_id: str, version: Version,
           reason: Annotated[str, Form(max_length=1000)] = "") -> Response:
    return _run(request, ctx, user, chat_id, "Draft rejected.",
                lambda: review.reject(ctx.db, chat_id, user.username, version, reason))


@router.post("/chats/{chat_id}/assign")
def assign(request: Request, ctx: Ctx, user: User, chat_id: str,
           assignee: Annotated[str, Form(max_length=64)] = "") -> Response:
    target = resolve_assignee(assignee, user.username)
    flash = "Assigned to you." if target == user.username else (
        f"Assigned to {target}." if target else "Unassigned.")
    return _run(request, ctx, user, chat_id, flash,
                lambda: review.assign(ctx.db, chat_id, user.username, target))


@router.post("/chats/{chat_id}/handled")
def handled(request: Request, ctx: Ctx, user: User, chat_id: str) -> Response:
    return _run(request, ctx, user, chat_id, "Marked as handled.",
                lambda: review.mark_handled(ctx.db, chat_id, user.username))


@router.post("/chats/{chat_id}/reopen")
def reopen(request: Request, ctx: Ctx, user: User, chat_id: str) -> Response:
    return _run(request, ctx, user, chat_id, "Reopened.",
                lambda: review.reopen(ctx.db, chat_id, user.username))


@router.post("/chats/{chat_id}/sentiment")
def correct_sentiment(request: Request, ctx: Ctx, user: User, chat_id: str,
                      corrected: Annotated[str, Form(max_length=16)] = "") -> Response:
    if corrected not in SENTIMENTS:
        return _after_action(request, ctx, user, chat_id, "", 422, error="Pick a sentiment.")
    return _run(request, ctx, user, chat_id, f"Sentiment set to {corrected}. Thanks — this trains the model.",
                lambda: review.correct_sentiment(ctx.db, chat_id, user.username, corrected))


@router.post("/chats/{chat_id}/copied", status_code=204)
def copied(ctx: Ctx, user: User, chat_id: str) -> Response:
    review.record_copy(ctx.db, chat_id, user.username)
    return Response(status_code=204)


LOG_PAGE = 100  # audit and error rows a page


def _older(path: str, rows: list, filters: dict[str, str]) -> str | None:
    """The link to the older rows after a full page, with the same filters."""
    return f"{path}?{urlencode({'before_id': rows[-1].id} | filters)}" if len(rows) == LOG_PAGE else None


@router.get("/audit")
def audit_page(request: Request, ctx: Ctx, user: Supervisor, chat_id: str | None = None,
               actor: str | None = None, action: str | None = None, before_id: BeforeId = None) -> Response:
    with ctx.db.read() as session:
        rows = [AuditOut.of(e) for e in audit.list_entries(
            session, chat_id or None, actor or None, action or None, LOG_PAGE, before_id)]
        actions = sorted(audit.action_counts(session))
    filters = {"chat_id": chat_id or "", "actor": actor or "", "action": action or ""}
    return render(request, "audit.html", entries=rows, actions=actions, filters=filters,
                  older=_older("/audit", rows, filters))


@router.get("/errors")
def errors_page(request: Request, ctx: Ctx, user: Supervisor, kind: str | None = None,
                before_id: BeforeId = None) -> Response:
    with ctx.db.read() as session:
        rows = [ErrorOut.of(e) for e in error_rows.list_errors(session, kind or None, LOG_PAGE, before_id)]
        counts = error_rows.counts(session)
    return render(request, "errors.html", rows=rows, counts=counts, kind=kind or "",
                  older=_older("/errors", rows, {"kind": kind or ""}))


# ---- the reply library (supervisors) -------------------------------------------------------
MACRO_DONE = {"added": "Macro added.", "saved": "Macro saved.", "deleted": "Macro deleted."}
MacroId = Annotated[int, Path(ge=1, le=MAX_SQL_INT)]
MacroText = Annotated[str, Form(max_length=MAX_MACRO_BODY_CHARS * 4)]  # over the contract's limit: told so
MacroLanguage = Annotated[str, Form(max_length=64)]
Shown = Annotated[str, Form(max_length=64)]  # the language filter the form was posted from


def _macros_url(language: str = "", done: str = "", anchor: str = "") -> str:
    query = urlencode({key: value for key, value in (("language", language), ("done", done)) if value})
    return "/macros" + (f"?{query}" if query else "") + (f"#{anchor}" if anchor else "")


def _macros_page(request: Request, ctx: AppContext, language: str | None, status_code: int = 200,
                 flash: str | None = None, error: str | None = None, typed: dict[str, Any] | None = None) -> Response:
    """The library page; `typed` is a refused form's values (`id`: the macro's, or "new"), shown again."""
    with ctx.db.read() as session:
        present = macros.languages(session)
        language = language if language in present else ""
        rows = [MacroOut.of(m) for m in macros.list_macros(session, language or None)]
    return render(request, "macros.html", status_code=status_code, flash=flash, error=error,
                  macros=rows, languages=present, language=language, typed=typed or {"id": None},
                  limits=macros.LIMITS, export_path=ctx.settings.reply_library)


def _change_macro(request: Request, ctx: AppContext, shown: str, typed: dict[str, Any], done: str,
                  change: Callable[[], Any]) -> Response:
    """Run `change`; back to the page (at the macro) when done, the page again with the reason when refused."""
    try:
        macro = change()
    except Invalid as error:
        return _macros_page(request, ctx, shown, 422, error=str(error), typed=typed)
    except macros.NotExported as error:  # stored, yet the pipeline does not have it: say so
        return _macros_page(request, ctx, shown, 500, error=str(error))
    if macro is None:
        return RedirectResponse(_macros_url(shown, done), status_code=303)
    return RedirectResponse(_macros_url(shown if shown == macro.language else "", done, f"macro-{macro.id}"),
                            status_code=303)


@router.get("/macros")
def macros_page(request: Request, ctx: Ctx, user: Supervisor,
                language: Annotated[str | None, Query(max_length=64)] = None,
                done: Annotated[str | None, Query(max_length=16)] = None) -> Response:
    return _macros_page(request, ctx, language, flash=MACRO_DONE.get(done or ""))


@router.post("/macros")
def add_macro(request: Request, ctx: Ctx, user: Supervisor, title: MacroText = "", language: MacroLanguage = "",
              keywords: MacroText = "", body: MacroText = "", shown: Shown = "") -> Response:
    typed = {"id": "new", "title": title, "language": language, "keywords": keywords, "body": body}
    return _change_macro(request, ctx, shown, typed, "added", lambda: macros.create_macro(
        ctx.db, user.username, title, language, keywords, body, export_to=ctx.settings.reply_library))


@router.post("/macros/{macro_id}")
def save_macro(request: Request, ctx: Ctx, user: Supervisor, macro_id: MacroId, title: MacroText = "",
               language: MacroLanguage = "", keywords: MacroText = "", body: MacroText = "",
               shown: Shown = "") -> Response:
    typed = {"id": macro_id, "title": title, "language": language, "keywords": keywords, "body": body}
    return _change_macro(request, ctx, shown, typed, "saved", lambda: macros.update_macro(
        ctx.db, macro_id, user.username, title, language, keywords, body, export_to=ctx.settings.reply_library))


@router.post("/macros/{macro_id}/delete")
def delete_macro(request: Request, ctx: Ctx, user: Supervisor, macro_id: MacroId, shown: Shown = "") -> Response:
    return _change_macro(request, ctx, shown, {"id": None}, "deleted", lambda: macros.delete_macro(
        ctx.db, macro_id, user.username, export_to=ctx.settings.reply_library))
