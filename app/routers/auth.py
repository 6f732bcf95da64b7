"""Logging in and out, as an HTML form and as JSON.

The login form is protected against login CSRF by a double-submit token: a signed cookie
set with the form and the same value in a hidden field. The JSON login accepts only
`application/json`, which a cross-site form cannot send.
"""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit

from fastapi import APIRouter, Form, HTTPException, Request, Response
from fastapi.responses import RedirectResponse
from starlette.concurrency import run_in_threadpool

from app import auth, security
from app.crud import sessions
from app.deps import LOGIN_CSRF_COOKIE, SESSION_COOKIE, Ctx, OptionalUser, User
from app.errors import Invalid, RateLimited
from app.json_body import StrictJSONRoute
from app.schemas import LoginIn, SessionOut
from app.web import render

router = APIRouter(tags=["auth"], route_class=StrictJSONRoute)


def _safe_next(target: str | None) -> str:
    """Only same-site paths: a login link must not bounce anyone to another site."""
    if not target:
        return "/"
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith(("//", "/\\")):
        return "/"
    return target


def _login_page(request: Request, ctx, next_url: str, status_code: int = 200,
                error: str | None = None, username: str = "",
                headers: dict[str, str] | None = None) -> Response:
    nonce = security.new_token()
    response = render(request, "login.html", status_code=status_code, error=error, username=username,
                      next_url=next_url, login_token=nonce, headers=headers,
                      max_password=security.MAX_PASSWORD_CHARS)
    response.set_cookie(LOGIN_CSRF_COOKIE, security.sign(ctx.secret, nonce), max_age=3600, httponly=True,
                        secure=ctx.settings.cookie_secure, samesite="strict", path="/login")
    return response


@router.get("/login", include_in_schema=False)
def login_form(request: Request, ctx: Ctx, user: OptionalUser, next: str | None = None) -> Response:
    if user is not None:
        return RedirectResponse(_safe_next(next), status_code=303)
    return _login_page(request, ctx, _safe_next(next))


@router.post("/login", include_in_schema=False)
def login_submit(
    request: Request, ctx: Ctx,
    username: Annotated[str, Form(max_length=64)] = "",
    password: Annotated[str, Form(max_length=security.MAX_PASSWORD_CHARS)] = "",
    csrf_token: Annotated[str, Form(max_length=200)] = "",
    next: Annotated[str, Form(max_length=2000)] = "/",
) -> Response:
    next_url = _safe_next(next)
    expected = security.unsign(ctx.secret, request.cookies.get(LOGIN_CSRF_COOKIE))
    if not security.same(expected, csrf_token):
        return _login_page(request, ctx, next_url, 403, "The login form expired. Please try again.",
                           username)
    try:
        token, _principal = auth.login(ctx, username, password, auth.client_ip(request))
    except RateLimited as error:
        return _login_page(request, ctx, next_url, 429, str(error), username,
                           headers={"Retry-After": str(error.retry_after)})
    except Invalid as error:
        return _login_page(request, ctx, next_url, 401, str(error), username)
    response = RedirectResponse(next_url, status_code=303)
    auth.set_session_cookie(response, ctx, token)
    response.delete_cookie(LOGIN_CSRF_COOKIE, path="/login")
    return response


@router.post("/logout", include_in_schema=False)
def logout(request: Request, ctx: Ctx, _user: User) -> Response:
    sessions.delete_session(ctx.db, ctx.secret, request.cookies.get(SESSION_COOKIE))
    response = RedirectResponse("/login", status_code=303)
    auth.clear_session_cookie(response, ctx)
    return response


@router.post("/api/session", response_model=SessionOut, responses={
    401: {"description": "Wrong username or password"}, 429: {"description": "Too many failures"}})
async def api_login(request: Request, ctx: Ctx, body: LoginIn, response: Response) -> SessionOut:
    """Log in; the session cookie is set and the CSRF token returned for later changes."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise HTTPException(415, "Send application/json.")
    try:
        token, principal = await run_in_threadpool(
            auth.login, ctx, body.username, body.password, auth.client_ip(request))
    except Invalid as error:
        raise HTTPException(401, str(error)) from None
    auth.set_session_cookie(response, ctx, token)
    return SessionOut(username=principal.username, role=principal.role, csrf_token=principal.csrf_token)


@router.get("/api/session", response_model=SessionOut)
def api_me(user: User) -> SessionOut:
    """Who is logged in, with the CSRF token to send as X-CSRF-Token."""
    return SessionOut(username=user.username, role=user.role, csrf_token=user.csrf_token)


@router.delete("/api/session", status_code=204)
def api_logout(request: Request, ctx: Ctx, _user: User) -> Response:
    sessions.delete_session(ctx.db, ctx.secret, request.cookies.get(SESSION_COOKIE))
    response = Response(status_code=204)
    auth.clear_session_cookie(response, ctx)
    return response
