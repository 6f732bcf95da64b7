"""FastAPI dependencies: the app context, who is asking, and the CSRF check.

The CSRF check is installed on the whole app: every POST/PUT/PATCH/DELETE must carry the
session's token in the `X-CSRF-Token` header or a `csrf_token` form field. The two login
endpoints are the exception; they check a pre-login token of their own.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Annotated

from fastapi import Depends, Query, Request
from starlette.concurrency import run_in_threadpool

from app import security
from app.context import AppContext
from app.crud import sessions
from app.crud.chats import SENTIMENTS, STATUS_FILTERS
from app.crud.errors import KINDS as ERROR_KINDS
from app.crud.sessions import Principal
from app.db import Database
from app.errors import Forbidden, NotAuthenticated

SESSION_COOKIE = "chatlens_session"
LOGIN_CSRF_COOKIE = "chatlens_login_csrf"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf_token"
SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}
CSRF_EXEMPT = {("POST", "/login"), ("POST", "/api/session")}  # they check a pre-login token


def get_ctx(request: Request) -> AppContext:
    return request.app.state.ctx


def get_db(request: Request) -> Database:
    return get_ctx(request).db


def session_principal(ctx: AppContext, token: str | None) -> Principal | None:
    """Who a session token belongs to, or None when it is unknown, expired or its user disabled."""
    s = ctx.settings
    return sessions.lookup(ctx.db, ctx.secret, token, s.session_hours, s.session_max_hours)


def _principal(request: Request) -> Principal | None:
    if not hasattr(request.state, "principal"):
        request.state.principal = session_principal(get_ctx(request), request.cookies.get(SESSION_COOKIE))
    return request.state.principal


def optional_user(request: Request) -> Principal | None:
    return _principal(request)


def current_user(request: Request) -> Principal:
    principal = _principal(request)
    if principal is None:
        raise NotAuthenticated("Log in first.")
    return principal


def supervisor(user: Annotated[Principal, Depends(current_user)]) -> Principal:
    if not user.is_supervisor:
        raise Forbidden("This page is for supervisors.")
    return user


async def verify_csrf(request: Request) -> None:
    if request.method in SAFE_METHODS or (request.method, request.url.path) in CSRF_EXEMPT:
        return
    principal = await run_in_threadpool(_principal, request)
    if principal is None:
        raise NotAuthenticated("Log in first.")
    token = request.headers.get(CSRF_HEADER) or None
    if token is None and request.headers.get("content-type", "").startswith(
            ("application/x-www-form-urlencoded", "multipart/form-data")):
        form = await request.form()
        value = form.get(CSRF_FIELD)
        token = value if isinstance(value, str) else None
    if not security.same(token, principal.csrf_token):
        raise Forbidden("Missing or wrong CSRF token: reload the page and try again.")


Ctx = Annotated[AppContext, Depends(get_ctx)]
DB = Annotated[Database, Depends(get_db)]
User = Annotated[Principal, Depends(current_user)]
OptionalUser = Annotated[Principal | None, Depends(optional_user)]
Supervisor = Annotated[Principal, Depends(supervisor)]

# Row ids and offsets fit a 32-bit SQL INTEGER: a bigger value is a 422, not an overflow (500).
MAX_SQL_INT = 2**31 - 1
BeforeId = Annotated[int | None, Query(ge=1, le=MAX_SQL_INT)]
Offset = Annotated[int, Query(ge=0, le=MAX_SQL_INT)]


def one_of(values: Iterable[str]) -> str:
    """A query pattern that accepts exactly `values`, so the choices are written once."""
    return "^(" + "|".join(re.escape(value) for value in values) + ")$"


StatusFilter = Annotated[str, Query(pattern=one_of(STATUS_FILTERS))]
SentimentFilter = Annotated[str | None, Query(pattern=one_of(SENTIMENTS))]
ErrorKind = Annotated[str | None, Query(pattern=one_of(ERROR_KINDS))]
