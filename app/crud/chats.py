"""Reading the queue: filters, urgency order, counts per sentiment, one chat with its window."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from app.crud import search
from app.errors import NotFound
from app.models import Chat, Insight
from app import sentiments
from app.schemas import ChatDetail

STATUSES = ("new", "approved", "rejected", "handled")
STATUS_FILTERS = ("open", *STATUSES, "all")
SENTIMENTS = sentiments.NAMES  # negative, neutral, positive
UNASSIGNED = "none"
ME = "me"


@dataclass(frozen=True)
class QueueFilter:
    """What the agent asked to see. `assignee` is a username or UNASSIGNED; `me` is resolved
    by the caller (`resolve_assignee`), who knows who "me" is."""

    status: str = "open"
    sentiment: str | None = None
    assignee: str | None = None
    tenant: str | None = None
    q: str | None = None
    limit: int = 200
    offset: int = 0


def resolve_assignee(value: str | None, username: str) -> str | None:
    """An assignee as people write it, for `username`: ME is them, empty is nobody."""
    return username if value == ME else value or None


@dataclass
class QueuePage:
    items: list[Chat]
    total: int
    counts: dict[str, int] = field(default_factory=dict)


def _conditions(f: QueueFilter, fts: bool, with_sentiment: bool = True) -> list[ColumnElement[bool]]:
    where: list[ColumnElement[bool]] = []
    if f.status == "open":
        where.append(Chat.status != "handled")
    elif f.status in STATUSES:
        where.append(Chat.status == f.status)
    if with_sentiment and f.sentiment in SENTIMENTS:
        where.append(Chat.effective_sentiment == sentiments.value(f.sentiment))
    if f.assignee == UNASSIGNED:
        where.append(Chat.assignee.is_(None))
    elif f.assignee:
        where.append(Chat.assignee == f.assignee)
    if f.tenant:
        where.append(Chat.tenant == f.tenant)
    found = search.condition(f.q, fts)
    if found is not None:
        where.append(found)
    return where


def list_chats(session: Session, f: QueueFilter, fts: bool = False) -> QueuePage:
    """Most urgent first: negative before neutral before positive, then longest waiting."""
    where = _conditions(f, fts)
    items = session.scalars(
        select(Chat).where(*where)
        .order_by(Chat.effective_sentiment, Chat.waiting_since, Chat.chat_id)
        .limit(f.limit).offset(f.offset)
    )
    counts = sentiment_counts(session, f, fts)  # the total is theirs: no second count of the same rows
    total = counts[f.sentiment] if f.sentiment in SENTIMENTS else sum(counts.values())
    return QueuePage(items=list(items), total=total, counts=counts)


def sentiment_counts(session: Session, f: QueueFilter, fts: bool = False) -> dict[str, int]:
    """Chats per sentiment under every filter but the sentiment one (for the filter chips)."""
    rows = session.execute(
        select(Chat.effective_sentiment, func.count()).where(*_conditions(f, fts, with_sentiment=False))
        .group_by(Chat.effective_sentiment)
    )
    counts = dict.fromkeys(SENTIMENTS, 0)
    for value, count in rows:
        counts[sentiments.name(value)] = count
    return counts


def open_counts(session: Session) -> dict[str, int]:
    """Open chats per sentiment: the queue-size gauge."""
    return sentiment_counts(session, QueueFilter())


def get_chat(session: Session, chat_id: str) -> Chat | None:
    return session.get(Chat, chat_id)


def current_insight(session: Session, chat: Chat) -> Insight | None:
    return session.scalar(
        select(Insight).where(Insight.chat_id == chat.chat_id, Insight.window_id == chat.window_id)
    )


def chat_detail(session: Session, chat_id: str) -> ChatDetail:
    """A chat with its current window, as the API and the review pane show it."""
    chat = get_chat(session, chat_id)
    if chat is None:
        raise NotFound(f"No chat {chat_id!r}.")
    return ChatDetail.of_chat(chat, current_insight(session, chat))


def tenants(session: Session) -> list[str]:
    return list(session.scalars(
        select(Chat.tenant).where(Chat.tenant.is_not(None)).distinct().order_by(Chat.tenant)
    ))


def insight_count(session: Session) -> int:
    return session.scalar(select(func.count()).select_from(Insight)) or 0



@dataclass
class Overview:
    """The queue at a glance, for the page shown before a chat is picked."""

    by_status: dict[str, int]
    mine: int
    oldest_new: datetime | None
    next_up: Chat | None


def overview(session: Session, username: str) -> Overview:
    open_chat = Chat.status != "handled"
    by_status = dict.fromkeys(("new", "approved", "rejected"), 0)
    by_status.update(session.execute(
        select(Chat.status, func.count()).where(open_chat).group_by(Chat.status)).tuples().all())
    mine = session.scalar(select(func.count()).select_from(Chat).where(open_chat, Chat.assignee == username))
    next_up = session.scalars(
        select(Chat).where(Chat.status == "new")
        .order_by(Chat.effective_sentiment, Chat.waiting_since, Chat.chat_id).limit(1)
    ).first()
    oldest = session.scalar(select(func.min(Chat.waiting_since)).where(Chat.status == "new"))
    return Overview(by_status=by_status, mine=mine or 0, oldest_new=oldest, next_up=next_up)
