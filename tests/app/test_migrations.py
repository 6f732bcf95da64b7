"""The dashboard schema's Alembic migrations: a database made before them (by `create_all`)
is completed to the baseline and upgraded with every row kept, and the migrations make exactly
`app.models`, also once a later revision exists (a copy of the revisions with one more)."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading
from datetime import timedelta
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from tests.support.app import (
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
from sqlalchemy import MetaData, inspect, select, text

from app.db import Database
from app.migrations import BASELINE, HERE, alembic_config, include_name
from app.models import Base


@pytest.fixture(params=DATABASE_PARAMS)
def database_url(request, tmp_path):
    return database_url_for(request.param, tmp_path)


def write_rows_with_the_app(url: str) -> None:
    """A row in every table, written by the app's own code (on a database at the newest revision)."""
    from app.crud import review, secrets, sessions, throttle, users
    from app.crud.ingest import ingest_dead_letter, ingest_insight

    db = Database(url)
    try:
        db.upgrade()
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


def reflect(conn) -> MetaData:
    """The tables the database has (alembic_version and the FTS5 ones aside), as it has them."""
    metadata = MetaData()
    metadata.reflect(conn, only=lambda name, _: name != "alembic_version" and include_name(name, "table", {}))
    return metadata


def make_premigration_database(url: str) -> None:
    """A database as the release before migrations left it, frozen whatever the models become:
    the baseline revision's tables and indexes (what that release's `create_all` made, see
    test_the_baseline_matches_what_create_all_makes), FTS5 on SQLite, no alembic_version.

    Its rows are the app's own (write_rows_with_the_app, in a scratch SQLite database at the
    newest revision), copied column by column for the columns the baseline has, so a later
    revision's columns never reach it; a row in every table.
    """
    db = Database(url)
    try:
        with db.engine.begin() as conn:
            command.upgrade(alembic_config(connection=conn), BASELINE)
            conn.execute(text("DROP TABLE alembic_version"))
        with tempfile.TemporaryDirectory() as scratch_dir:
            scratch = Database(sqlite_url(Path(scratch_dir), "scratch.db"))
            try:
                write_rows_with_the_app(scratch.url)
                with scratch.engine.connect() as source, db.engine.begin() as target:
                    found, baseline = reflect(source), reflect(target)
                    for table in baseline.sorted_tables:
                        columns = [found.tables[table.name].c[column.name] for column in table.columns]
                        rows = [dict(row._mapping) for row in source.execute(select(*columns))]
                        if rows:
                            target.execute(table.insert(), rows)
                        if target.dialect.name == "postgresql":  # ids were given: move their sequences on
                            for column in table.primary_key:
                                sequence = target.execute(text("SELECT pg_get_serial_sequence(:t, :c)"),
                                                          {"t": table.name, "c": column.name}).scalar()
                                if sequence:
                                    target.execute(text(f"SELECT setval(:s, (SELECT max({column.name}) FROM {table.name}))"),
                                                   {"s": sequence})
            finally:
                scratch.dispose()
        db.fts = db._setup_fts()  # indexes the chats, as that release's ingest did
    finally:
        db.dispose()


def snapshot(url: str) -> dict[str, tuple[tuple[str, ...], list[tuple]]]:
    """Every table's column names and rows, in primary-key order, read by reflection: an older
    database need not have the models' columns."""
    db = Database(url)
    try:
        with db.engine.connect() as conn:
            return {table.name: (tuple(table.columns.keys()),
                                 [tuple(row) for row in conn.execute(select(table).order_by(*table.primary_key))])
                    for table in reflect(conn).sorted_tables}
    finally:
        db.dispose()


def assert_every_row_kept(before: dict, after: dict) -> None:
    """Every table, column and row of `before` is still in `after`, unchanged (columns added aside)."""
    assert set(before) <= set(after), set(before) - set(after)
    for name, (columns, rows) in before.items():
        after_columns, after_rows = after[name]
        assert set(columns) <= set(after_columns), (name, set(columns) - set(after_columns))
        kept = [tuple(dict(zip(after_columns, row))[column] for column in columns) for row in after_rows]
        assert kept == rows, name


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
    assert all(rows for _, rows in before.values()), {name: len(rows) for name, (_, rows) in before.items()}

    db = Database(database_url)
    try:
        assert "alembic_version" not in inspect(db.engine).get_table_names()
        db.upgrade()
        assert revision(db) == HEAD
        assert schema_diffs(db) == []
        if db.is_sqlite:  # the search index is kept and still in step with the chats
            assert db.fts
            with db.engine.connect() as conn:
                assert conn.exec_driver_sql("SELECT count(*) FROM chat_fts").scalar() == len(before["chats"][1])
        db.upgrade()  # again: nothing to do
    finally:
        db.dispose()
    assert_every_row_kept(before, snapshot(database_url))


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
    logged = "".join(output)
    assert "Traceback" not in logged, logged
    assert f"stamping it at {BASELINE}" in logged, logged
    db = Database(url)
    try:
        assert revision(db) == HEAD
    finally:
        db.dispose()
    assert_every_row_kept(before, snapshot(url))


# ---- a later release: one more revision, in a copy of the revisions -----------------------
LATER = "9999_later_output"
LATER_REVISION = '''"""A later release's revision, as autogenerate writes one for a new nullable model output.

Revision ID: {revision}
Revises: {down_revision}
"""
import sqlalchemy as sa
from alembic import op

revision = {revision!r}
down_revision = {down_revision!r}
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("insights", schema=None) as batch_op:
        batch_op.add_column(sa.Column("later_output", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("insights", schema=None) as batch_op:
        batch_op.drop_column("later_output")
'''


@pytest.fixture
def later_release(tmp_path) -> Path:
    """The revisions' folder of a release after this one: a copy of app/migrations/versions with
    one more revision on the head (a nullable column on insights); the real folder is untouched."""
    versions = tmp_path / "later-versions"
    shutil.copytree(HERE / "versions", versions, ignore=shutil.ignore_patterns("__pycache__"))
    (versions / f"{LATER}.py").write_text(LATER_REVISION.format(revision=LATER, down_revision=HEAD), encoding="utf-8")
    return versions


@pytest.mark.parametrize("made_by", ["premigration", "premigration without insights and an index", "this release"])
def test_a_later_revision_upgrades_older_databases_with_every_row_kept(database_url, later_release, made_by):
    """The first revision after the baseline finds databases made before migrations and databases
    this release migrated (at its head: the baseline until a later one exists); both reach it with
    every row kept. A table a pre-migration database lacks is made as the baseline made it, never
    from the models: made with the later revision's column, the revision could not add it again."""
    make_premigration_database(database_url)
    db = Database(database_url)
    try:
        if made_by == "this release":
            db.upgrade()
            assert revision(db) == HEAD
        elif made_by != "premigration":  # lacking what the baseline then adds, the table the revision alters too
            with db.engine.begin() as conn:
                conn.execute(text("DROP INDEX ix_chats_order"))
                conn.execute(text("DROP TABLE insights"))
    finally:
        db.dispose()
    before = snapshot(database_url)
    assert all(rows for _, rows in before.values())

    db = Database(database_url, migrations=later_release)
    try:
        db.upgrade()
        assert revision(db) == LATER
        # exactly the models plus the later revision's column
        assert [(diff[0], diff[2], diff[3].name) for diff in schema_diffs(db)] == [
            ("remove_column", "insights", "later_output")]
        column = {c["name"]: c for c in inspect(db.engine).get_columns("insights")}["later_output"]
        assert column["nullable"]
        assert "ix_insights_chat_id" in {index["name"] for index in inspect(db.engine).get_indexes("insights")}
        assert "ix_chats_order" in {index["name"] for index in inspect(db.engine).get_indexes("chats")}
        if db.is_sqlite:
            assert db.fts
        db.upgrade()  # again: nothing to do
        assert revision(db) == LATER
    finally:
        db.dispose()
    after = snapshot(database_url)
    assert_every_row_kept(before, after)
    columns, rows = after["insights"]
    assert {row[columns.index("later_output")] for row in rows} <= {None}
