"""Full-text search over chats: SQLite FTS5 when there is one, LIKE on any database otherwise.

User input never reaches the query language as syntax: it is cut into words, and each
word becomes a quoted FTS5 prefix term or an escaped LIKE pattern; all words must match.
"""

from __future__ import annotations

import re

from sqlalchemy import ColumnElement, and_, text
from sqlalchemy.orm import Session

from app.models import Chat

MAX_SEARCH_TEXT = 64 * 1024
MAX_TERMS = 8
_WORD = re.compile(r"[\w@.:-]+", re.UNICODE)


def terms(query: str | None) -> list[str]:
    """Lower-cased words of a search box entry, at most MAX_TERMS of them."""
    return [word.lower() for word in _WORD.findall(query or "")][:MAX_TERMS]


def search_text(*parts: str | None) -> str:
    """What the LIKE fallback searches: every part, lower-cased, in one capped string."""
    return " ".join(part for part in parts if part).lower()[:MAX_SEARCH_TEXT]


def _fts_query(words: list[str]) -> str:
    return " ".join('"' + word.replace('"', '""') + '"*' for word in words)


def _like_pattern(word: str) -> str:
    escaped = word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def condition(query: str | None, fts: bool) -> ColumnElement[bool] | None:
    """A WHERE condition on Chat for the search box, or None for an empty search."""
    words = terms(query)
    if not words:
        return None
    if fts:
        return Chat.chat_id.in_(
            text("SELECT chat_id FROM chat_fts WHERE chat_fts MATCH :fts_query").bindparams(
                fts_query=_fts_query(words)
            ).columns(Chat.chat_id)
        )
    return and_(*(Chat.search_text.like(_like_pattern(word), escape="\\") for word in words))


def index_chat(session: Session, chat_id: str, body: str) -> None:
    """Replace the chat's FTS5 row (call only when the database has FTS5).

    The row's rowid is the chat row's (see Database._setup_fts): FTS5 finds a rowid at once,
    while a lookup by its UNINDEXED chat_id column reads the whole index (70 ms a chat at
    100,000 chats, which capped ingest at about 15 insights a second).
    """
    session.flush()  # the chat row, and so its rowid, must be in the database
    rowid = session.execute(text("SELECT rowid FROM chats WHERE chat_id = :chat_id"), {"chat_id": chat_id}).scalar_one()
    session.execute(text("DELETE FROM chat_fts WHERE rowid = :rowid"), {"rowid": rowid})
    session.execute(
        text("INSERT INTO chat_fts (rowid, chat_id, body) VALUES (:rowid, :chat_id, :body)"),
        {"rowid": rowid, "chat_id": chat_id, "body": body},
    )
