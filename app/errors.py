"""Domain errors raised by `app.crud` and turned into HTTP answers by the routers.

Keeping them free of HTTP lets the CLI and the subscriber use the same functions.
"""

from __future__ import annotations

from typing import Any


class DashboardError(Exception):
    """Base class: `str(error)` is a sentence a support agent can act on."""


class NotFound(DashboardError):
    pass


class Invalid(DashboardError):
    """The request itself is wrong (empty reply, unknown user, ...)."""


class Conflict(DashboardError):
    """Someone changed the chat since the caller loaded it; `current` is what is there now."""

    def __init__(self, message: str, current: Any) -> None:
        super().__init__(message)
        self.current = current


class NotAuthenticated(DashboardError):
    pass


class Forbidden(DashboardError):
    pass


class RateLimited(DashboardError):
    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.retry_after = retry_after
