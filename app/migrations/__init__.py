"""The dashboard schema's Alembic migrations, configured in code (no alembic.ini).

The script location is this package's folder, so migrations run the same from a checkout
and from an installed wheel. `python -m app.migrations` is Alembic's command line on it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic.config import Config

HERE = Path(__file__).resolve().parent
# The first revision: the schema as `Base.metadata.create_all` made it before migrations; it
# creates only what is missing, so it also completes a database that release made (app.db).
BASELINE = "0001_baseline"
# Tables of the database that are not in app.models: SQLite FTS5's virtual table and its shadows.
UNMANAGED_PREFIXES = ("chat_fts",)


def include_name(name: str | None, type_: str, _parent_names: dict[str, Any]) -> bool:
    """Leave the FTS5 tables (made by app.db, SQLite-only) out of autogenerate's comparison."""
    return not (type_ == "table" and name is not None and name.startswith(UNMANAGED_PREFIXES))


def render_item(type_: str, obj: Any, _autogen_context: Any) -> str | bool:
    """Write UTCDateTime as the plain DateTime it stores, so revisions never import app.models."""
    from app.models import UTCDateTime

    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime()"
    return False


def alembic_config(url: str | None = None, connection: Any = None, versions: str | Path | None = None,
                   **cmd_opts: Any) -> Config:
    """A Config on this folder: on `connection` (its transaction is the caller's) or on `url`.

    `versions` is the folder of revisions, this package's `versions/` by default: tests point it
    at a copy with one more revision, to upgrade databases as a next release would.
    """
    config = Config()
    config.set_main_option("script_location", str(HERE))
    config.set_main_option("version_locations", str(versions or HERE / "versions"))
    config.set_main_option("path_separator", "os")
    if url:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        config.attributes["connection"] = connection
    return config
