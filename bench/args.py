"""Command-line pieces the benchmarks share."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping, Sequence


def apply_quick(args: argparse.Namespace, argv: Sequence[str] | None, quick: Mapping[str, object]) -> None:
    """With --quick, take the smoke-run sizes in `quick`, except those given on the command line."""
    if not args.quick:
        return
    given = {a.split("=")[0].lstrip("-").replace("-", "_") for a in (argv or sys.argv[1:]) if a.startswith("--")}
    for key, value in quick.items():
        if key not in given:
            setattr(args, key, value)


def comma_choices(parser: argparse.ArgumentParser, flag: str, value: str, choices: Sequence[str]) -> list[str]:
    """A comma-separated list of at least one of `choices`, or the parser's usage error."""
    picked = [item.strip() for item in value.split(",") if item.strip()]
    if not picked or any(item not in choices for item in picked):
        parser.error(f"{flag}: choose from {', '.join(choices)}")
    return picked
