"""Engine and sessions for any SQLAlchemy URL, with the SQLite details that keep it honest.

SQLite allows one writer at a time. A transaction that reads first and writes later can
fail at once with "database is locked" when another writer got in between, so write
sessions start with `BEGIN IMMEDIATE` (they wait for the lock, up to the busy timeout)
while read sessions stay deferred and never block anyone (WAL journal).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from app.models import Base

log = logging.getLogger(__name__)

WRITE_OPTION = "chatlens_write"
SQLITE_BUSY_SECONDS = 30
MIGRATION_LOCK = 0x636C6D67  # PostgreSQL advisory lock held while the schema is migrated


def _switch_to_wal(cursor) -> None:
    """Turn on the WAL journal, waiting out other processes that open a new database at once.

    The switch needs the database to itself and SQLite reports "database is locked" at once,
    without its busy timeout, when another connection is switching or writing then.
    """
    deadline = time.monotonic() + SQLITE_BUSY_SECONDS
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _sqlite_engine(url: str) -> Engine:
    engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_SECONDS, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:  # pragma: no cover - trivial
        dbapi_connection.isolation_level = None  # we send BEGIN ourselves, below
        cursor = dbapi_connection.cursor()
        _switch_to_wal(cursor)
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn) -> None:
        immediate = conn.get_execution_options().get(WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        return _sqlite_engine(url)
    return create_engine(url, pool_pre_ping=True)


class Database:
    """One engine, a read-session and a write-session factory, and the schema migrations."""

    def __init__(self, url: str, search_backend: str = "auto", *, migrations: str | Path | None = None) -> None:
        self.url = url
        self.migrations = migrations  # the revisions' folder: app/migrations/versions unless a test's copy
        self.engine = make_engine(url)
        self.is_sqlite = self.engine.dialect.name == "sqlite"
        self._reader = sessionmaker(self.engine, expire_on_commit=False)
        self._writer = sessionmaker(
            self.engine.execution_options(**{WRITE_OPTION: True}), expire_on_commit=False
        )
        self.search_backend = search_backend
        self.fts = False

    def upgrade(self) -> None:
        """Migrate the schema to the newest revision (and set up FTS5 when wanted and available)."""
        self._migrate()
        self.fts = self._setup_fts() if self.search_backend in ("auto", "fts5") else False
        if self.search_backend == "fts5" and not self.fts:
            raise RuntimeError("search_backend is 'fts5' but this database has no FTS5")

    def _migrate(self) -> None:
        """Run Alembic in one locked transaction, so that processes starting together take turns.

        A database made before migrations (tables, no alembic_version) is first brought to the
        baseline by the baseline revision itself, which creates only the tables and indexes
        missing (IF NOT EXISTS) and touches no row, and stamped there; then it is upgraded like
        any other. Not from the current models: once a later revision exists they are no longer
        the baseline's schema, and that revision would add what they had already made.
        """
        from alembic import command

        from app.migrations import BASELINE, alembic_config

        with self.writing_connection() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
            tables = set(inspect(conn).get_table_names())
            config = alembic_config(connection=conn, versions=self.migrations)
            if "alembic_version" not in tables and tables & set(Base.metadata.tables):
                log.info("database made before migrations: completing it and stamping it at %s", BASELINE)
                command.upgrade(config, BASELINE)
            command.upgrade(config, "head")

    def _setup_fts(self) -> bool:
        if not self.is_sqlite:
            return False
        try:
            # It reads, then writes: deferred, a process starting beside it would get
            # "database is locked" at once (a stale WAL snapshot cannot wait its turn).
            with self.writing_connection() as conn:
                conn.exec_driver_sql(
                    "CREATE VIRTUAL TABLE IF NOT EXISTS chat_fts USING fts5("
                    "chat_id UNINDEXED, body, tokenize='unicode61 remove_diacritics 2')"
                )
                indexed = conn.exec_driver_sql("SELECT count(*) FROM chat_fts").scalar()
                chats = conn.exec_driver_sql("SELECT count(*) FROM chats").scalar()
                # Each chat's row has the chat row's rowid (search.index_chat finds it by that).
                # Rebuild when it is a new index, the database was used without FTS, or rowids
                # differ (an index from before rowids were kept, or a VACUUM renumbered chats).
                aligned = conn.exec_driver_sql(
                    "SELECT count(*) FROM chats c JOIN chat_fts f ON f.rowid = c.rowid AND f.chat_id = c.chat_id"
                ).scalar()
                if indexed != chats or aligned != chats:
                    conn.exec_driver_sql("DELETE FROM chat_fts")
                    conn.exec_driver_sql(
                        "INSERT INTO chat_fts (rowid, chat_id, body) SELECT rowid, chat_id, search_text FROM chats")
            return True
        except OperationalError as error:  # SQLite built without FTS5
            log.warning("no FTS5 (%s): search falls back to LIKE", error)
            return False

    def writing_connection(self):
        """A connection in a transaction that holds the write lock from its start (SQLite)."""
        return self.engine.execution_options(**{WRITE_OPTION: True}).begin()

    def read(self) -> Session:
        return self._reader()

    def write(self) -> Session:
        return self._writer()

    @contextmanager
    def writing(self) -> Iterator[Session]:
        """A write session that rolls back on error; the caller commits."""
        session = self.write()
        try:
            yield session
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def ping(self) -> bool:
        try:
            with self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
            return True
        except Exception as error:  # noqa: BLE001 - readiness reports, never raises
            log.warning("database not reachable: %s", error)
            return False

    def dispose(self) -> None:
        self.engine.dispose()
