"""What the benchmarks share: command-line pieces, figures and output."""

from __future__ import annotations

import argparse
import math
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


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))]


def say(text: str) -> None:
    """A progress line on stderr (the figures go to stdout)."""
    print(text, file=sys.stderr, flush=True)


def fmt(value, digits: int = 2) -> str:
    """A figure for a table: '-' for none."""
    return "-" if value is None else f"{value:.{digits}f}"
