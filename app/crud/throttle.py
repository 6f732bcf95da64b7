"""Login throttling per account and per (account, client), atomic across threads and processes.

An attempt is *claimed* before its password is checked: in one write transaction the locks
are checked and the attempt is counted as a failure; a correct password then takes its count
back. So 12 parallel wrong passwords cannot all be verified while the limit is 5: the sixth
claim already finds the lock. Kept in the database so every process agrees and a restart
does not reset it. There is no per-address key: behind a proxy every client shares one
address, and a lockout by address would lock everyone out.
"""

from __future__ import annotations

import math
from datetime import timedelta

from sqlalchemy import delete, or_, select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from app.db import Database
from app.errors import RateLimited
from app.models import LoginThrottle, utcnow

MAX_LOCKOUT_SECONDS = 15 * 60
ACCOUNT_FACTOR = 4  # an account may fail this many times more, summed over all clients


def keys(username: str, client: str | None) -> list[tuple[str, int]]:
    """(key, failure factor) pairs a login attempt is counted under."""
    account = username.strip().lower()
    return [(f"user:{account}|client:{client or 'unknown'}", 1), (f"user:{account}", ACCOUNT_FACTOR)]


def claim(db: Database, username: str, client: str | None, max_failures: int, lockout_seconds: float,
          window_seconds: float) -> None:
    """Count this attempt as a failure, or raise RateLimited while any of its keys is locked."""
    now = utcnow()
    attempt = keys(username, client)
    insert = sqlite_insert if db.is_sqlite else pg_insert
    with db.writing() as session:  # SQLite: BEGIN IMMEDIATE; PostgreSQL: the rows are locked below
        # Rows whose window and lockout are both over mean nothing more (a new failure starts
        # afresh): deleted here, or every name ever tried would stay forever.
        session.execute(delete(LoginThrottle).where(
            LoginThrottle.first_failure_at < now - timedelta(seconds=window_seconds),
            or_(LoginThrottle.locked_until.is_(None), LoginThrottle.locked_until <= now)))
        session.execute(insert(LoginThrottle).values(
            [{"key": key, "failures": 0, "first_failure_at": now} for key, _ in attempt]).on_conflict_do_nothing())
        rows = {row.key: row for row in session.scalars(
            select(LoginThrottle).where(LoginThrottle.key.in_([k for k, _ in attempt])).with_for_update())}
        for key, _factor in attempt:
            row = rows[key]
            if row.locked_until is not None and row.locked_until > now:
                session.rollback()
                wait = math.ceil((row.locked_until - now).total_seconds())
                raise RateLimited(f"Too many failed logins. Try again in {wait} seconds.", wait)
        for key, factor in attempt:
            row = rows[key]
            if (now - row.first_failure_at).total_seconds() > window_seconds:
                row.failures, row.first_failure_at = 0, now
            row.failures += 1
            allowed = max_failures * factor
            if row.failures >= allowed:
                seconds = min(lockout_seconds * 2 ** min(row.failures - allowed, 16), MAX_LOCKOUT_SECONDS)
                row.locked_until = now + timedelta(seconds=seconds)
        session.commit()


def succeeded(db: Database, username: str, client: str | None) -> None:
    """A correct password: clear its (account, client) key and take its claim off the account."""
    (client_key, _), (account_key, _) = keys(username, client)
    with db.writing() as session:
        rows = {row.key: row for row in session.scalars(
            select(LoginThrottle).where(LoginThrottle.key.in_([client_key, account_key])).with_for_update())}
        if client_key in rows:
            session.delete(rows[client_key])
        if account_key in rows and rows[account_key].failures > 0:
            rows[account_key].failures -= 1
        session.commit()
