"""The team's reply library: supervisors add, edit and delete its macros here.

Each change is one transaction with its audit row; then, when `CHATLENS_REPLY_LIBRARY` names a
file (`export_to`), the whole library is written there (`chatlens.replies.write_library`), where
the pipeline reads it. A macro is checked by the contract itself (`chatlens.contracts.ReplyMacro`),
so the dashboard never keeps one the pipeline would refuse; `Invalid` says in words what is wrong.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.crud import audit
from app.db import Database
from app.errors import DashboardError, Invalid, NotFound
from app.models import Macro, utcnow
from chatlens.contracts import MAX_LIBRARY_MACROS, ReplyLibrary, ReplyMacro
from chatlens.replies import write_library

log = logging.getLogger(__name__)

CREATED, UPDATED, DELETED = "macro_created", "macro_updated", "macro_deleted"
FIELDS = ("title", "language", "keywords", "body")
LIMITS: dict[str, int] = {
    name: constraint.max_length for name, info in ReplyMacro.model_fields.items()
    for constraint in info.metadata if getattr(constraint, "max_length", None)
} | {"language": Macro.__table__.c.language.type.length}
"""The longest title, keywords and body (the contract's) and language tag (its column's), in characters."""
_LABELS = {"title": "The title", "language": "The language", "keywords": "The keywords", "body": "The text"}
_export_lock = threading.Lock()


class NotExported(DashboardError):
    """The change is stored, but the library file could not be written."""


def snapshot(macro: Macro) -> dict[str, Any]:
    """A macro as the audit log keeps it."""
    return {"macro_id": macro.id, **{name: getattr(macro, name) for name in FIELDS}}


def contract(macro: Macro) -> ReplyMacro:
    return ReplyMacro(**{name: getattr(macro, name) for name in FIELDS})


def _reason(error: dict[str, Any], values: dict[str, str]) -> str:
    name = str(error["loc"][0]) if error["loc"] else ""
    label, value = _LABELS.get(name, name), values.get(name, "")
    if error["type"] == "string_too_short" or (name == "language" and not value):
        return f"{label} is empty."
    if error["type"] == "string_too_long":
        return f"{label} is {len(value):,} characters long; at most {error['ctx']['max_length']:,} are allowed."
    if name == "language":
        shown = value if len(value) <= 40 else value[:40] + "…"
        return f"{label} {shown!r} is not a language tag: write one such as en, de or pt-BR."
    return f"{label}: {error['msg']}."


def check(title: str, language: str, keywords: str, body: str) -> ReplyMacro:
    """The macro as the contract takes it (spaces trimmed, line ends as \\n), or `Invalid` saying why not."""
    values = {"title": (title or "").strip(), "language": (language or "").strip(),
              "keywords": " ".join((keywords or "").split()),
              "body": (body or "").replace("\r\n", "\n").strip()}
    try:
        checked, errors = ReplyMacro(**values), []
    except ValidationError as error:
        checked, errors = None, error.errors()
    reasons = [_reason(e, values) for e in errors]
    if len(values["language"]) > LIMITS["language"] and not any(e["loc"] == ("language",) for e in errors):
        reasons.append(f"The language is {len(values['language']):,} characters long; "
                       f"at most {LIMITS['language']} are allowed.")  # its column's limit
    if reasons or checked is None:
        raise Invalid(" ".join(reasons))
    return checked


def list_macros(session: Session, language: str | None = None) -> list[Macro]:
    """The macros in library order, all or those of one language."""
    query = select(Macro).order_by(Macro.position, Macro.id)
    if language:
        query = query.where(Macro.language == language)
    return list(session.scalars(query))


def get_macro(session: Session, macro_id: int, for_update: bool = False) -> Macro:
    macro = session.get(Macro, macro_id, with_for_update=for_update)
    if macro is None:
        raise NotFound(f"No macro {macro_id}.")
    return macro


def languages(session: Session) -> dict[str, int]:
    """Macros per language, for the languages the library has."""
    query = select(Macro.language, func.count()).group_by(Macro.language).order_by(Macro.language)
    return dict(session.execute(query).tuples().all())


def library(session: Session) -> ReplyLibrary:
    """The whole library, in its order, as the pipeline reads it."""
    return ReplyLibrary(macros=[contract(macro) for macro in list_macros(session)])


def export_library(db: Database, path: str | None) -> ReplyLibrary | None:
    """Write the whole library to `path` (nothing when None); `NotExported` when it cannot.

    Read and written under a lock, after the caller's commit: whichever change finishes last,
    the file ends up holding the newest library.
    """
    if not path:
        return None
    with _export_lock:
        with db.read() as session:
            current = library(session)
        try:
            write_library(current, path)
        except OSError as error:
            log.error("could not write the reply library to %s: %s", path, error)
            raise NotExported(f"Saved, but the library file {path} could not be written ({error.strerror or error}); "
                              "the pipeline still reads the previous one. The next change writes it again.") from None
    return current


def create_macro(db: Database, actor: str, title: str, language: str, keywords: str, body: str,
                 export_to: str | None = None) -> Macro:
    """Add a macro at the end of the library."""
    checked = check(title, language, keywords, body)
    with db.writing() as session:
        if session.scalar(select(func.count()).select_from(Macro)) >= MAX_LIBRARY_MACROS:
            raise Invalid(f"The library is full ({MAX_LIBRARY_MACROS:,} macros): delete one first.")
        position = (session.scalar(select(func.max(Macro.position))) or 0) + 1
        macro = Macro(position=position, updated_at=utcnow(), updated_by=actor,
                      **{name: getattr(checked, name) for name in FIELDS})
        session.add(macro)
        session.flush()  # its id, for the audit row
        audit.record(session, actor, CREATED, after=snapshot(macro))
        session.commit()
    export_library(db, export_to)
    return macro


def update_macro(db: Database, macro_id: int, actor: str, title: str, language: str, keywords: str, body: str,
                 export_to: str | None = None) -> Macro:
    """Change a macro's words; saving it unchanged records nothing."""
    checked = check(title, language, keywords, body)
    with db.writing() as session:
        macro = get_macro(session, macro_id, for_update=True)
        before = snapshot(macro)
        for name in FIELDS:
            setattr(macro, name, getattr(checked, name))
        after = snapshot(macro)
        if after == before:
            return macro
        macro.updated_at = utcnow()
        macro.updated_by = actor
        audit.record(session, actor, UPDATED, before=before, after=after)
        session.commit()
    export_library(db, export_to)
    return macro


def delete_macro(db: Database, macro_id: int, actor: str, export_to: str | None = None) -> None:
    with db.writing() as session:
        macro = get_macro(session, macro_id, for_update=True)
        audit.record(session, actor, DELETED, before=snapshot(macro))
        session.delete(macro)
        session.commit()
    export_library(db, export_to)
