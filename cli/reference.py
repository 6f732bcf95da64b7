"""The configuration reference in README.md, generated from the code so it cannot drift.

Every flag of the `chatlens` commands comes from their argparse parsers, every
environment variable from the pydantic Settings classes. README.md holds the rendered
tables between `<!-- reference:NAME -->` and `<!-- /reference:NAME -->` markers;
`make docs` (python -m cli.reference --write) rewrites them and a test fails when
they are stale.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
COMMANDS = ("pipeline", "demo", "simulate", "analyze", "eval", "tune", "dashboard", "replay", "pubsub-emulator")
_DEFAULT_IN_HELP = re.compile(r"\s*\(default:? ([^()]*(?:\([^()]*\)[^()]*)*)\)\s*$")
"""A help text's closing "(default X)": X goes to the Default column, the rest to Meaning."""


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def command_table(name: str) -> str:
    """Markdown table of one command's flags: flag, default, meaning."""
    from cli.main import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    rows = ["| Flag | Default | Meaning |", "| --- | --- | --- |"]
    for action in sub._actions:
        if not action.option_strings or action.dest == "help":
            continue
        flags = ", ".join(f"`{flag}`" for flag in action.option_strings)
        if action.metavar and action.nargs != 0:
            flags += f" `{action.metavar}`"
        help_text = argparse.HelpFormatter(name)._expand_help(action) if action.help else ""
        stated = _DEFAULT_IN_HELP.search(help_text)
        if stated:
            default = stated.group(1)
            help_text = help_text[: stated.start()]
        elif action.default in (None, False, argparse.SUPPRESS) or action.nargs == 0:
            default = "—"
        else:
            default = f"`{action.default}`"
        rows.append(f"| {flags} | {_cell(default)} | {_cell(help_text)} |")
    return "\n".join(rows)


def environment_table() -> str:
    """Markdown table of every CHATLENS_* environment variable (shared and dashboard settings)."""
    from app.settings import DashboardSettings
    from chatlens.config import Settings
    from pipeline.model.environment import DEFAULT_XLA_FLAGS

    rows = ["| Variable | Default | Used by | Meaning |", "| --- | --- | --- | --- |"]
    seen = set()
    for owner, settings in (("all commands", Settings), ("dashboard", DashboardSettings)):
        prefix = settings.model_config.get("env_prefix", "")
        for name, field in settings.model_fields.items():
            variable = (field.validation_alias if isinstance(field.validation_alias, str) else
                        f"{prefix}{name}").upper()
            if variable in seen:
                continue
            seen.add(variable)
            default = field.get_default(call_default_factory=True)
            default = "—" if default is None else f"`{default}`"
            rows.append(f"| `{variable}` | {_cell(default).replace(str(Path.home()), '~')} | {owner} | "
                        f"{_cell(field.description or '')} |")
    rows.append("| `CHATLENS_REMOTE_API_KEY` | — | pipeline workers | API key for `--model-stage remote` "
                "(read on the workers, never stored in the job's options) |")
    rows.append("| `PUBSUB_EMULATOR_HOST` | — | every Pub/Sub client | `host:port` of a local Pub/Sub server "
                "(the Google clients read it) |")
    rows.append(f"| `XLA_FLAGS` | — | model processes | XLA's own flags; ChatLens adds {_cell(' '.join(f'`{flag}`' for flag in DEFAULT_XLA_FLAGS))} "
                "(less peak memory, the same outputs) unless they set it themselves |")
    return "\n".join(rows)


def sections() -> dict[str, str]:
    tables = {f"command:{name}": command_table(name) for name in COMMANDS}
    tables["environment"] = environment_table()
    return tables


def render(text: str) -> str:
    """`text` with every reference block replaced by its current table."""
    for name, table in sections().items():
        pattern = re.compile(rf"(<!-- reference:{re.escape(name)} -->\n)(?:.*?\n)?(<!-- /reference:{re.escape(name)} -->)",
                             re.DOTALL)
        if not pattern.search(text):
            raise ValueError(f"README.md has no <!-- reference:{name} --> block")
        text = pattern.sub(lambda m, table=table: m.group(1) + table + "\n" + m.group(2), text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite README.md (default: check only)")
    args = parser.parse_args(argv)
    current = README.read_text(encoding="utf-8")
    updated = render(current)
    if args.write:
        README.write_text(updated, encoding="utf-8")
        return 0
    if updated != current:
        print("README.md's configuration reference is stale: run `make docs`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
