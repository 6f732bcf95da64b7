"""Jinja2 rendering for the HTML pages: autoescaping always on, a few display filters.

Everything from a chat (transcript, summary, draft) is untrusted text; autoescape makes it
inert, and nothing in the templates marks such text `|safe`.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import jinja2
from fastapi import Request
from fastapi.templating import Jinja2Templates
from starlette.responses import HTMLResponse

from app.crud.sessions import Principal

TEMPLATES_DIR = Path(__file__).parent / "templates"
HTMX_FILE = "htmx-2.0.11.min.js"

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
    autoescape=True,  # every template, whatever its file name
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def ago(value: datetime | None, now: datetime | None = None) -> str:
    """"4 min", "2 h", "3 d": how long ago, short enough for a queue row."""
    if value is None:
        return "—"
    seconds = max(0, int(((now or datetime.now(timezone.utc)) - value).total_seconds()))
    if seconds < 60:
        return "now"
    if seconds < 3600:
        return f"{seconds // 60} min"
    if seconds < 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60:02d}"
    return f"{seconds // 86400} d"


def clock(value: datetime | None) -> str:
    return value.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M UTC") if value else "—"


def hm(value: datetime | None) -> str:
    return value.astimezone(timezone.utc).strftime("%H:%M") if value else ""


def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=1, ensure_ascii=False, sort_keys=True, default=str)


_env.filters.update(ago=ago, clock=clock, hm=hm, pretty_json=pretty_json)
_env.globals.update(htmx_file=HTMX_FILE)
templates = Jinja2Templates(env=_env)


def is_htmx(request: Request) -> bool:
    return request.headers.get("hx-request") == "true"


def render(request: Request, name: str, status_code: int = 200, user: Principal | None = None,
           headers: dict[str, str] | None = None, **context: Any) -> HTMLResponse:
    """Render `name` with what every page needs (user, CSRF token, path) already filled in."""
    user = user if user is not None else getattr(request.state, "principal", None)
    context.setdefault("flash", None)
    context.setdefault("error", None)
    response = templates.TemplateResponse(
        request, name,
        {"user": user, "csrf_token": user.csrf_token if user else "", "path": request.url.path, **context},
        status_code=status_code, headers=headers,
    )
    response.headers.setdefault("Cache-Control", "no-store")
    return response
