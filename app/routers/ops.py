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
    """Ready (200) when the database answers, every subscriber's stream is running and none
    is degraded; otherwise 503, with status "not ready" (database or stream down) or
    "degraded" (streams up, but a subscriber's recent messages all failed to store)."""
    database = ctx.db.ping()
    feed = ctx.feed_state()
    # Error text can carry SQL parameters: it goes to the logs and /metrics, not to this open probe.
    subscribers = []
    for subscriber in ctx.subscribers:
        status = subscriber.status().as_dict()
        status["has_error"] = status.pop("last_error") is not None
        subscribers.append(status)
    degraded = [status["name"] for status in subscribers if status["degraded"]]
    up = database and feed in ("running", "off")
    state = "ready" if up and not degraded else "degraded" if up else "not ready"
    return JSONResponse(
        {"status": state, "database": database, "feed": feed, "degraded": degraded, "subscribers": subscribers},
        status_code=200 if state == "ready" else 503,
    )


@router.get("/metrics", response_class=Response)
def prometheus(ctx: Ctx) -> Response:
    return Response(metrics.render(ctx), media_type=metrics.CONTENT_TYPE)
