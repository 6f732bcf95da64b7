"""Secrets generated on first use and kept in the database, shared by every process using it."""

from __future__ import annotations

import secrets as random

from sqlalchemy.exc import IntegrityError

from app.db import Database
from app.models import AppSecret


def get_or_create(db: Database, name: str) -> str:
    with db.read() as session:
        row = session.get(AppSecret, name)
        if row is not None:
            return row.value
    try:
        with db.writing() as session:
            session.add(AppSecret(name=name, value=random.token_urlsafe(48)))
            session.commit()
    except IntegrityError:  # another process created it first: use theirs
        pass
    with db.read() as session:
        return session.get(AppSecret, name).value  # type: ignore[union-attr]
