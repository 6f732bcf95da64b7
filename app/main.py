"""The FastAPI application: `create_app(settings)` wires routers, errors, static files and the
lifespan that opens the database and starts (and cleanly stops) the subscribers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from urllib.parse import quote

from fastapi import Depends, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from app.body_limit import BodyLimit
from app.context import AppContext
from app.crud import chats, macros, secrets
from app.crud.ingest import ingest_dead_letter, ingest_insight
from app.db import Database
from app.deps import verify_csrf
from app.errors import Conflict, Forbidden, Invalid, NotAuthenticated, NotFound, RateLimited
from app.json_body import printable
from app.live import EventHub
from app.routers import api, auth, live, ops, pages
from app.settings import DashboardSettings
from app.subscriber import StreamSubscriber, make_client_factory
from app.web import is_htmx, render

log = logging.getLogger(__name__)

STATIC_DIR = Path(__file__).parent / "static"
SWAGGER_DIR = "/static/vendor/swagger-ui-5.35.0"
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'; object-src 'none'")
DOCS_CSP = CSP.replace("script-src 'self'", "script-src 'self' 'unsafe-inline'").replace(
    "style-src 'self'", "style-src 'self' 'unsafe-inline'")


def build_subscribers(ctx: AppContext) -> list[StreamSubscriber]:
    s = ctx.settings
    factory = make_client_factory(s.pubsub_emulator_host)
    notify = ctx.hub.notify if ctx.hub else None
    common = {"max_messages": s.subscriber_max_messages, "workers": s.subscriber_workers,
              "lease_seconds": s.subscriber_lease_seconds,
              "probe_seconds": s.subscriber_probe_seconds, "max_backoff": s.subscriber_max_backoff_seconds,
              "on_stored": notify}
    return [
        StreamSubscriber("insights", s.insights_subscription_path(),
                         lambda data, **kw: ingest_insight(ctx.db, data, **kw), factory, **common),
        StreamSubscriber("deadletters", s.deadletter_subscription_path(),
                         lambda data, **kw: ingest_dead_letter(ctx.db, data, **kw), factory, **common),
    ]


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    ctx: AppContext = app.state.ctx
    s = ctx.settings
    await asyncio.to_thread(ctx.db.upgrade)
    # The pipeline reads the library the dashboard keeps: it gets the file before the first change.
    await asyncio.to_thread(macros.export_library, ctx.db, s.reply_library)
    ctx.secret = (s.session_secret.get_secret_value() if s.session_secret
                  else await asyncio.to_thread(secrets.get_or_create, ctx.db, "session_secret"))
    ctx.hub = EventHub(ctx.db, s.event_poll_seconds, s.event_retention, ctx.feed_status)
    await ctx.hub.start()
    if s.subscribe:
        ctx.subscribers = build_subscribers(ctx)
        for subscriber in ctx.subscribers:
            subscriber.start()
    log.info("dashboard ready (database %s, search %s, subscribers %s)", ctx.db.engine.url.render_as_string(),
             "fts5" if ctx.db.fts else "like", "on" if s.subscribe else "off")
    try:
        yield
    finally:
        ctx.hub.close()
        await asyncio.gather(*(asyncio.to_thread(sub.stop) for sub in ctx.subscribers))
        await ctx.hub.stop()
        ctx.db.dispose()
        log.info("dashboard stopped")


def _wants_json(request: Request) -> bool:
    return request.url.path.startswith("/api") or "application/json" in request.headers.get("accept", "")


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(NotAuthenticated)
    async def not_authenticated(request: Request, error: NotAuthenticated) -> Response:
        if _wants_json(request):
            return JSONResponse({"detail": str(error)}, status_code=401)
        target = "/login?next=" + quote(request.url.path + (f"?{request.url.query}" if request.url.query else ""))
        if is_htmx(request):
            return Response(status_code=401, headers={"HX-Redirect": target})
        if request.method not in ("GET", "HEAD"):
            target = "/login"
        return RedirectResponse(target, status_code=303)

    @app.exception_handler(Forbidden)
    async def forbidden(request: Request, error: Forbidden) -> Response:
        if _wants_json(request) or is_htmx(request):
            return JSONResponse({"detail": str(error)}, status_code=403)
        return render(request, "message.html", status_code=403, title="Not allowed", message=str(error))

    @app.exception_handler(NotFound)
    async def not_found(request: Request, error: NotFound) -> Response:
        if _wants_json(request):
            return JSONResponse({"detail": str(error)}, status_code=404)
        return render(request, "message.html", status_code=404, title="Not found", message=str(error))

    @app.exception_handler(Invalid)
    async def invalid(request: Request, error: Invalid) -> Response:
        return JSONResponse({"detail": str(error)}, status_code=422)

    @app.exception_handler(Conflict)
    async def conflict(request: Request, error: Conflict) -> Response:
        ctx: AppContext = request.app.state.ctx
        with ctx.db.read() as session:
            try:
                current = chats.chat_detail(session, error.current.chat_id)
            except NotFound:
                current = None
        return JSONResponse({"detail": str(error), "current": current.model_dump(mode="json") if current else None},
                            status_code=409)

    @app.exception_handler(RateLimited)
    async def rate_limited(request: Request, error: RateLimited) -> Response:
        return JSONResponse({"detail": str(error)}, status_code=429,
                            headers={"Retry-After": str(error.retry_after)})

    @app.exception_handler(RequestValidationError)
    async def validation(request: Request, error: RequestValidationError) -> Response:
        if _wants_json(request) or request.method not in ("GET", "HEAD"):
            # Not the input: it may be a megabyte, or text that cannot be encoded again.
            detail = [{k: v for k, v in e.items() if k != "input"} for e in error.errors()]
            return JSONResponse({"detail": jsonable_encoder(detail)}, status_code=422)
        return render(request, "message.html", status_code=422, title="Bad request",
                      message="The address has values this page does not understand.")


def install_security_headers(app: FastAPI) -> None:
    @app.middleware("http")
    async def headers(request: Request, call_next) -> Response:
        try:
            response = await call_next(request)
        except Exception:  # an unexpected error still answers with the headers, and no details
            log.exception("unhandled error on %s %s", request.method, printable(request.url.path))
            response = JSONResponse({"detail": "internal error"}, status_code=500)
        # (What call_next returns has no media_type: the header says what it is.)
        if request.url.path.startswith("/api/") or response.headers.get("content-type", "").startswith(
                "application/json"):
            # JSON carries the CSRF token and transcripts: never kept by a browser or proxy cache.
            response.headers.setdefault("Cache-Control", "no-store")
        docs = request.url.path == "/docs"
        response.headers.setdefault("Content-Security-Policy", DOCS_CSP if docs else CSP)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        return response


def create_app(settings: DashboardSettings | None = None) -> FastAPI:
    """Build the dashboard; nothing is opened or started until the lifespan runs."""
    settings = settings or DashboardSettings()
    app = FastAPI(
        title="ChatLens dashboard", version="1.0",
        description="Review queue for drafted support replies. Log in with POST /api/session; "
                    "send the returned csrf_token as X-CSRF-Token on every change.",
        lifespan=lifespan, dependencies=[Depends(verify_csrf)],
        docs_url=None, redoc_url=None,
    )
    app.state.ctx = AppContext(settings=settings, db=Database(settings.database_url, settings.search_backend))
    install_error_handlers(app)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    install_security_headers(app)  # after BodyLimit, so outside it: a 413 gets the headers too
    if settings.trusted_proxies:  # outermost: every layer sees the real client address
        app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=settings.trusted_proxies)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    for module in (auth, pages, api, live, ops):
        app.include_router(module.router)

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="ChatLens dashboard API",
                                   swagger_js_url=f"{SWAGGER_DIR}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{SWAGGER_DIR}/swagger-ui.css",
                                   swagger_favicon_url="/static/favicon.svg")

    return app
