"""`python -m app.migrations [--database-url URL] COMMAND ...`: Alembic's command line, on
this package's migrations and the dashboard's database (CHATLENS_DATABASE_URL by default).

    python -m app.migrations --database-url sqlite:///scratch.db upgrade head
    python -m app.migrations --database-url sqlite:///scratch.db revision --autogenerate -m "add chats.priority"
"""

from __future__ import annotations

import logging
import sys

from alembic.config import CommandLine

from app.migrations import alembic_config


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    url = None
    if argv[:1] == ["--database-url"] and len(argv) > 1:
        url, argv = argv[1], argv[2:]
    elif argv and argv[0].startswith("--database-url="):
        url, argv = argv[0].split("=", 1)[1], argv[1:]
    if url is None:
        from app.settings import DashboardSettings

        url = DashboardSettings().database_url
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # Alembic reports each step it runs
    cli = CommandLine(prog="python -m app.migrations")
    options = cli.parser.parse_args(argv)
    if not hasattr(options, "cmd"):
        cli.parser.error("too few arguments")
    config = alembic_config(url)
    config.cmd_opts = options
    cli.run_cmd(config, options)
    return 0


if __name__ == "__main__":
    sys.exit(main())
