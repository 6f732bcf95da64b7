"""The append-only tables (audit log, errors): newest-first pages continued by `before_id`, and counts."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.orm import InstrumentedAttribute, Session


def newest_first(model: Any, limit: int, before_id: int | None, **equal: str | None) -> Select:
    """Rows of `model`, highest id first, below `before_id`; each given non-empty value must match its column."""
    query = select(model).order_by(model.id.desc()).limit(limit)
    for column, value in equal.items():
        if value:
            query = query.where(getattr(model, column) == value)
    if before_id:
        query = query.where(model.id < before_id)
    return query


def counts(session: Session, column: InstrumentedAttribute) -> dict[Any, int]:
    """Rows per value of `column`."""
    return dict(session.execute(select(column, func.count()).group_by(column)).tuples().all())
