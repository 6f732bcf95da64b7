"""Server-side login sessions: the cookie is an opaque token, the row says who and until when."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import delete, select

from app import security
from app.db import Database
from app.models import User, UserSession, utcnow

REFRESH_AFTER = timedelta(minutes=5)  # sliding expiry, written at most this often
DEFAULT_MAX_HOURS = 24.0


@dataclass(frozen=True)
class Principal:
    """Who is making the request: what routers and templates need, detached from the ORM."""

    user_id: int
    username: str
    role: str
    csrf_token: str

    @property
    def is_supervisor(self) -> bool:
        return self.role == "supervisor"


def create(db: Database, secret: str, user: User, hours: float, ip: str | None,
           max_hours: float = DEFAULT_MAX_HOURS) -> tuple[str, Principal]:
    """A new session for `user`, ending after `hours` without use or `max_hours` in all;
    returns (cookie token, principal)."""
    token = security.new_token()
    csrf = security.new_token()
    now = utcnow()
    with db.writing() as session:
        session.execute(delete(UserSession).where(UserSession.expires_at < now))
        session.add(UserSession(token_hash=security.keyed_hash(secret, token), user_id=user.id, csrf_token=csrf,
                                created_at=now, expires_at=now + timedelta(hours=min(hours, max_hours)), ip=ip))
        session.commit()
    return token, Principal(user.id, user.username, user.role, csrf)


def lookup(db: Database, secret: str, token: str | None, hours: float,
           max_hours: float = DEFAULT_MAX_HOURS) -> Principal | None:
    """The principal of a live session of an enabled user, extending the session as it is used,
    up to `max_hours` after it was made (sessions slid forever before)."""
    if not token:
        return None
    token_hash = security.keyed_hash(secret, token)
    with db.read() as session:
        row = session.execute(
            select(UserSession, User).join(User, User.id == UserSession.user_id)
            .where(UserSession.token_hash == token_hash)
        ).first()
    if row is None:
        return None
    user_session, user = row
    now = utcnow()
    end_of_life = user_session.created_at + timedelta(hours=max_hours)
    if user.disabled or user_session.expires_at <= now or end_of_life <= now:
        return None
    new_expiry = min(now + timedelta(hours=hours), end_of_life)
    if new_expiry - user_session.expires_at > REFRESH_AFTER:
        with db.writing() as session:
            stored = session.get(UserSession, token_hash)
            if stored is not None:
                stored.expires_at = new_expiry
                session.commit()
    return Principal(user.id, user.username, user.role, user_session.csrf_token)


def delete_session(db: Database, secret: str, token: str | None) -> None:
    if not token:
        return
    with db.writing() as session:
        session.execute(delete(UserSession).where(
            UserSession.token_hash == security.keyed_hash(secret, token)))
        session.commit()
