"""The `chatlens` command: one entry point, one subcommand per job.

Each subcommand lives in its own module, which defines `add_arguments(parser)` and
`run(args) -> int` and keeps heavy imports (JAX, Beam, FastAPI) inside `run`, so that
`chatlens --help` stays fast. The module docstring's first line is the command's help.
`python -m cli` runs it too (cli/__main__.py).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from chatlens.quiet import install_log_filters
from pipeline.model.environment import use_default_env

# Subcommand name -> module. Add a line here to add a command.
COMMANDS: dict[str, str] = {
    "schemas": "chatlens.schemas",
    "dashboard": "app.commands.dashboard",
    "users": "app.commands.users",
    "replay": "app.commands.replay",
    "pubsub-emulator": "localpubsub.emulator",
    "pubsub-init": "localpubsub.admin",
    "demo": "cli.demo",
    "simulate": "chatlens.simulate",
    "eval": "pipeline.evaluate",
    "tune": "pipeline.tune",
    "pipeline": "pipeline.streaming",
    "analyze": "pipeline.batch",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chatlens",
        description="ChatLens: streaming chat analysis with Gemma on Apache Beam.",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        doc = (module.__doc__ or name).strip()
        summary = doc.splitlines()[0]
        command = sub.add_parser(
            name, help=summary, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        module.add_arguments(command)
        command.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    use_default_env()  # KERAS_BACKEND and XLA settings, before any command imports keras or JAX
    args = build_parser().parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    install_log_filters()
    return int(args._run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
