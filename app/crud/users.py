"""Staff accounts: create, list, disable, and the password check used at login."""

from __future__ import annotations

import re

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError

from app import security
from app.db import Database
from app.errors import Invalid, NotFound
from app.models import User, UserSession, utcnow

ROLES = ("agent", "supervisor")
RESERVED = {"me", "none", "pipeline", "system"}  # words the queue filter and audit log use
_USERNAME = re.compile(r"^[a-z0-9][a-z0-9._@-]{0,63}$")


def normalize(username: str) -> str:
    return username.strip().lower()


def create_user(db: Database, username: str, password: str, role: str = "agent") -> User:
    username = normalize(username)
    if not _USERNAME.match(username) or username in RESERVED:
        raise Invalid(f"{username!r} is not a usable username (a-z, 0-9, . _ @ -; not {sorted(RESERVED)}).")
    if role not in ROLES:
        raise Invalid(f"role must be one of {ROLES}")
    try:
        security.check_new_password(password, [username, *re.split(r"[._@-]", username)])
    except ValueError as error:
        raise Invalid(str(error)) from None
    password_hash = security.hash_password(password)
    try:
        with db.writing() as session:
            user = User(username=username, password_hash=password_hash, role=role)
            session.add(user)
            session.commit()
            return user
    except IntegrityError:
        raise Invalid(f"user {username!r} already exists") from None


def list_users(db: Database) -> list[User]:
    with db.read() as session:
        return list(session.scalars(select(User).order_by(User.username)))


def active_usernames(db: Database) -> list[str]:
    with db.read() as session:
        return list(session.scalars(
            select(User.username).where(User.disabled.is_(False)).order_by(User.username)))


def set_disabled(db: Database, username: str, disabled: bool = True) -> User:
    """Disable (or enable) an account; disabling also ends its sessions at once."""
    with db.writing() as session:
        user = session.scalar(select(User).where(User.username == normalize(username)))
        if user is None:
            raise NotFound(f"no user {normalize(username)!r}")
        user.disabled = disabled
        if disabled:
            session.execute(delete(UserSession).where(UserSession.user_id == user.id))
        session.commit()
        return user


def authenticate(db: Database, username: str, password: str) -> User | None:
    """The active user with this password, or None; as slow for unknown names as for known."""
    with db.read() as session:
        user = session.scalar(select(User).where(User.username == normalize(username)))
    ok = security.verify_password(user.password_hash if user else None, password)
    if not ok or user is None or user.disabled:
        return None
    with db.writing() as session:
        row = session.get(User, user.id)
        if row is not None:
            row.last_login_at = utcnow()
            if security.needs_rehash(row.password_hash):
                row.password_hash = security.hash_password(password)
            session.commit()
    return user
