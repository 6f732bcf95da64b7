"""The login flow shared by the HTML form and the JSON API: throttle, verify, open a session."""

from __future__ import annotations

from fastapi import Request, Response

from app.context import AppContext
from app.crud import sessions, throttle, users
from app.crud.sessions import Principal
from app.deps import SESSION_COOKIE
from app.errors import Invalid

WRONG_LOGIN = "Wrong username or password."


def client_ip(request: Request) -> str | None:
    """The client's address; behind a trusted proxy (`trusted_proxies`) uvicorn's
    ProxyHeadersMiddleware has already taken it from X-Forwarded-For."""
    return request.client.host if request.client else None


def login(ctx: AppContext, username: str, password: str, ip: str | None) -> tuple[str, Principal]:
    """Return (session token, principal), or raise RateLimited / Invalid (wrong credentials)."""
    s = ctx.settings
    throttle.claim(ctx.db, username, ip, s.login_max_failures, s.login_lockout_seconds, s.login_window_seconds)
    user = users.authenticate(ctx.db, username, password)
    if user is None:
        raise Invalid(WRONG_LOGIN)  # the claim already counted it
    throttle.succeeded(ctx.db, username, ip)
    return sessions.create(ctx.db, ctx.secret, user, s.session_hours, ip, s.session_max_hours)


def set_session_cookie(response: Response, ctx: AppContext, token: str) -> None:
    hours = min(ctx.settings.session_hours, ctx.settings.session_max_hours)
    response.set_cookie(SESSION_COOKIE, token, max_age=int(hours * 3600),
                        httponly=True, secure=ctx.settings.cookie_secure, samesite="lax", path="/")


def clear_session_cookie(response: Response, ctx: AppContext) -> None:
    response.delete_cookie(SESSION_COOKIE, httponly=True, secure=ctx.settings.cookie_secure,
                           samesite="lax", path="/")
