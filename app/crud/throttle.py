"""Login throttling: failures per username+IP (and per IP) earn a lockout that doubles.

Kept in the database so that every process agrees and a restart does not reset it.
"""

from __future__ import annotations

import math
from datetime import timedelta

from app.db import Database
from app.errors import RateLimited
from app.models import LoginThrottle, utcnow

MAX_LOCKOUT_SECONDS = 15 * 60
IP_FACTOR = 5  # one address may fail this many times more than one username from it


def keys(username: str, ip: str | None) -> list[tuple[str, int]]:
    """(key, failure factor) pairs a login attempt is counted under."""
    ip = ip or "unknown"
    return [(f"user:{username.strip().lower()}|ip:{ip}", 1), (f"ip:{ip}", IP_FACTOR)]


def check(db: Database, username: str, ip: str | None) -> None:
    """Raise RateLimited while any key of this attempt is locked."""
    now = utcnow()
    with db.read() as session:
        for key, _factor in keys(username, ip):
            row = session.get(LoginThrottle, key)
            if row is not None and row.locked_until is not None and row.locked_until > now:
                wait = math.ceil((row.locked_until - now).total_seconds())
                raise RateLimited(f"Too many failed logins. Try again in {wait} seconds.", wait)


def record_failure(db: Database, username: str, ip: str | None, max_failures: int,
                   lockout_seconds: float, window_seconds: float) -> None:
    now = utcnow()
    with db.writing() as session:
        for key, factor in keys(username, ip):
            row = session.get(LoginThrottle, key)
            if row is None:
                row = LoginThrottle(key=key, failures=0, first_failure_at=now)
                session.add(row)
            elif (now - row.first_failure_at).total_seconds() > window_seconds and not (
                    row.locked_until and row.locked_until > now):
                row.failures, row.first_failure_at = 0, now
            row.failures += 1
            allowed = max_failures * factor
            if row.failures >= allowed:
                seconds = min(lockout_seconds * 2 ** min(row.failures - allowed, 16), MAX_LOCKOUT_SECONDS)
                row.locked_until = now + timedelta(seconds=seconds)
        session.commit()


def reset(db: Database, username: str, ip: str | None) -> None:
    """A successful login clears its username+IP key (the IP key keeps counting down)."""
    with db.writing() as session:
        key = keys(username, ip)[0][0]
        row = session.get(LoginThrottle, key)
        if row is not None:
            session.delete(row)
            session.commit()
