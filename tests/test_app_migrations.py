"""The dashboard schema's Alembic migrations: a database made before them (by `create_all`)
is stamped and upgraded with every row kept, and the migrations make exactly `app.models`."""

from __future__ import annotations

import os
import signal
import sys
import threading
from datetime import timedelta

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from app_fixtures import (
    DATABASE_PARAMS,
    PASSWORD,
    T0,
    TEST_SECRET,
    dashboard_process,
    database_url_for,
    free_port,
    insight_bytes,
    make_insight,
    sqlite_url,
)
from sqlalchemy import inspect, select

from app.db import Database
from app.migrations import BASELINE, alembic_config, include_name
from app.models import Base


@pytest.fixture(params=DATABASE_PARAMS)
def database_url(request, tmp_path):
    return database_url_for(request.param, tmp_path)


def make_premigration_database(url: str) -> None:
    """A database as the release before migrations left it: `Base.metadata.create_all` (and
    FTS5 on SQLite), no alembic_version, and rows in every table, written by the app's own code."""
    from app.crud import review, secrets, sessions, throttle, users
    from app.crud.ingest import ingest_dead_letter, ingest_insight

    db = Database(url)
    try:
        Base.metadata.create_all(db.engine)
        db.fts = db._setup_fts()
        for i, sentiment in enumerate((-1, 0, 1)):
            ingest_insight(db, insight_bytes(make_insight(f"c-{i}", sentiment=sentiment, start=T0 + timedelta(minutes=i))))
        ingest_insight(db, insight_bytes(make_insight("c-0", "w2", sentiment=0, start=T0 + timedelta(hours=1))))
        user = users.create_user(db, "sam", PASSWORD, "supervisor")
        sessions.create(db, TEST_SECRET, user, 12, "127.0.0.1")
        review.correct_sentiment(db, "c-0", "sam", "positive")
        throttle.claim(db, "sam", "10.0.0.1", 5, 30.0, 900.0)
        ingest_dead_letter(db, b"not a dead letter", message_id="m-1")
        secrets.get_or_create(db, "session_secret")
    finally:
        db.dispose()


def snapshot(url: str) -> dict[str, list[tuple]]:
    """Every row of every table, in primary-key order."""
    db = Database(url)
    try:
        with db.engine.connect() as conn:
            return {table.name: [tuple(row) for row in conn.execute(select(table).order_by(*table.primary_key))]
                    for table in Base.metadata.sorted_tables}
    finally:
        db.dispose()


def schema_diffs(db: Database) -> list:
    with db.engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"include_name": include_name, "compare_type": True,
                                                         "compare_server_default": True})
        return compare_metadata(context, Base.metadata)


def revision(db: Database) -> str | None:
    with db.engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


HEAD = ScriptDirectory.from_config(alembic_config()).get_current_head()


def test_a_database_made_before_migrations_is_stamped_and_upgraded_with_every_row_kept(database_url):
    make_premigration_database(database_url)
    before = snapshot(database_url)
    assert all(before.values()), {name: len(rows) for name, rows in before.items()}  # a row in every table

    db = Database(database_url)
    try:
        assert "alembic_version" not in inspect(db.engine).get_table_names()
        db.upgrade()
        assert revision(db) == HEAD
        assert schema_diffs(db) == []
        if db.is_sqlite:  # the search index is kept and still in step with the chats
            assert db.fts
            with db.engine.connect() as conn:
                assert conn.exec_driver_sql("SELECT count(*) FROM chat_fts").scalar() == len(before["chats"])
        db.upgrade()  # again: nothing to do
    finally:
        db.dispose()
    after = snapshot(database_url)
    assert {name: len(rows) for name, rows in after.items()} == {name: len(rows) for name, rows in before.items()}
    assert after == before


def test_an_empty_database_upgrades_to_exactly_the_models(database_url):
    db = Database(database_url)
    try:
        db.upgrade()
        assert revision(db) == HEAD
        assert schema_diffs(db) == []
        tables = set(inspect(db.engine).get_table_names())
        assert set(Base.metadata.tables) <= tables
        assert "ix_chats_order" in {index["name"] for index in inspect(db.engine).get_indexes("chats")}
        with db.engine.begin() as conn:  # and back: the baseline's downgrade drops what it made
            command.downgrade(alembic_config(connection=conn), "base")
        assert not set(Base.metadata.tables) & set(inspect(db.engine).get_table_names())
        db.upgrade()
        assert revision(db) == HEAD and schema_diffs(db) == []
    finally:
        db.dispose()


def test_the_baseline_matches_what_create_all_makes(database_url):
    """Stamping a pre-migration database at the baseline is only right if the two schemas agree."""
    db = Database(database_url)
    try:
        with db.engine.begin() as conn:
            command.upgrade(alembic_config(connection=conn), BASELINE)
            context = MigrationContext.configure(conn, opts={"include_name": include_name, "compare_type": True})
            migrated = inspect(conn)
            by_baseline = {t: (migrated.get_columns(t), migrated.get_indexes(t), migrated.get_unique_constraints(t))
                           for t in Base.metadata.tables}
            command.downgrade(alembic_config(connection=conn), "base")
            Base.metadata.create_all(conn)
            created = inspect(conn)
            by_create_all = {t: (created.get_columns(t), created.get_indexes(t), created.get_unique_constraints(t))
                             for t in Base.metadata.tables}
            assert compare_metadata(context, Base.metadata) == []
        assert repr(by_baseline) == repr(by_create_all)
    finally:
        db.dispose()


def test_processes_starting_together_migrate_one_at_a_time(database_url):
    errors: list[BaseException] = []

    def start() -> None:
        db = Database(database_url)
        try:
            db.upgrade()
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)
        finally:
            db.dispose()

    threads = [threading.Thread(target=start) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    db = Database(database_url)
    try:
        assert revision(db) == HEAD and schema_diffs(db) == []
    finally:
        db.dispose()


def test_chatlens_dashboard_upgrades_a_premigration_database_on_start(tmp_path):
    url, port = sqlite_url(tmp_path), free_port()
    make_premigration_database(url)
    before = snapshot(url)
    command = [sys.executable, "-m", "cli", "-v", "dashboard", "--no-subscribe", "--port", str(port), "--database-url", url]
    # it serves /healthz once the upgrade is done
    with dashboard_process(command, port, cwd=tmp_path, env=dict(os.environ), ready_path="/healthz") as (process, output):
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    text = "".join(output)
    assert "Traceback" not in text, text
    assert f"stamping it at {BASELINE}" in text, text
    db = Database(url)
    try:
        assert revision(db) == HEAD
    finally:
        db.dispose()
    assert snapshot(url) == before
