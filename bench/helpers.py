"""What the benchmarks share: command-line pieces, figures and output."""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path


# The instruction sets XLA's and llama.cpp's CPU kernels choose between: a figure is only
# comparable with one from a machine that has the same
CPU_FEATURES = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8",
                "asimd", "sve")


def machine(cpuinfo: Path = Path("/proc/cpuinfo"), meminfo: Path = Path("/proc/meminfo")) -> dict:
    """What a speed or memory figure was measured on: the CPU's model, cores, the instruction sets of
    CPU_FEATURES it has, and memory (what /proc shows; the platform's own words elsewhere)."""
    fields: dict[str, str] = {}
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())  # the first processor's
    flags = set((fields.get("flags") or fields.get("Features") or "").split())
    memory = None
    if meminfo.exists():
        lines = meminfo.read_text().splitlines()
        total = next((line.split()[1] for line in lines if line.startswith("MemTotal:")), None)
        memory = round(int(total) / 2**20, 1) if total else None
    return {"cpu": fields.get("model name") or platform.processor() or platform.machine(),
            "cores": os.cpu_count(), "features": [f for f in CPU_FEATURES if f in flags], "memory_gib": memory}


def describe(host: Mapping[str, object]) -> str:
    """One line for a report's head, from `machine()`: 'AMD EPYC 9R14, 2 cores, avx2 fma avx512f, 23.4 GiB'."""
    features = " ".join(host["features"]) or "no listed vector extensions"
    memory = f", {host['memory_gib']} GiB" if host.get("memory_gib") else ""
    return f"{host['cpu']}, {host['cores']} cores, {features}{memory}"


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
