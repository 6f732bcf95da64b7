"""Alembic's environment: `app.models.Base.metadata` is the target; batch mode on SQLite.

Run by every Alembic command. `app.db.Database.upgrade` hands it an open connection (whose
transaction it holds, with a lock); the command line gives it a URL instead.
"""

from __future__ import annotations

from alembic import context

from app.migrations import include_name, render_item
from app.models import Base

config = context.config


def _configure(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=connection.dialect.name == "sqlite",  # SQLite alters a table by copying it
        include_name=include_name,
        render_item=render_item,
        compare_type=True,
        compare_server_default=True,
    )


def run_migrations_offline() -> None:
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=Base.metadata,
                      literal_binds=True, include_name=include_name,
                      render_as_batch=config.get_main_option("sqlalchemy.url", "").startswith("sqlite"))
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    from app.db import make_engine  # the same SQLite pragmas as the dashboard

    engine = make_engine(config.get_main_option("sqlalchemy.url"))
    try:
        with engine.connect() as connection:
            _configure(connection)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
