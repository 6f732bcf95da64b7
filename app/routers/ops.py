"""Probes for orchestrators and scrapers: liveness, readiness, Prometheus metrics.

They need no login: they reveal counts, never chat content.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response

from app import metrics
from app.deps import Ctx

router = APIRouter(tags=["ops"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process answers."""
    return {"status": "ok"}


@router.get("/readyz")
def readyz(ctx: Ctx) -> JSONResponse:
    """Ready when the database answers and every subscriber's stream is running."""
    database = ctx.db.ping()
    feed = ctx.feed_state()
    # Error text can carry SQL parameters: it goes to the logs and /metrics, not to this open probe.
    subscribers = []
    for subscriber in ctx.subscribers:
        status = subscriber.status().as_dict()
        status["has_error"] = status.pop("last_error") is not None
        subscribers.append(status)
    ready = database and feed in ("running", "off")
    return JSONResponse(
        {"status": "ready" if ready else "not ready", "database": database, "feed": feed,
         "subscribers": subscribers},
        status_code=200 if ready else 503,
    )


@router.get("/metrics", response_class=Response)
def prometheus(ctx: Ctx) -> Response:
    return Response(metrics.render(ctx), media_type=metrics.CONTENT_TYPE)
