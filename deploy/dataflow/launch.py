"""Flex Template entry point: runs `chatlens pipeline` with the template's parameters.

Dataflow starts this file (FLEX_TEMPLATE_PYTHON_PY_FILE in flex.Dockerfile) on a launcher VM
with every template parameter and pipeline option as `--name=value`. The template's
parameters (metadata.json) are named the way Beam spells options, `results_topic`; the
`chatlens pipeline` command spells its own `--results-topic`, so those are renamed here,
from the command's real argparse parser. Everything else (Dataflow's --project, --region,
--temp_location, --sdk_container_image, --dataflow_service_options, ...) goes on to Beam
unchanged. Without a --runner, the job goes to Dataflow, never the local default.

`chatlens pipeline` submits the job and returns (it waits only on local runners), as a Flex
Template launcher must.
"""

from __future__ import annotations

import argparse
import sys

DEFAULT_RUNNER = "DataflowRunner"


def pipeline_flags() -> dict[str, str]:
    """`chatlens pipeline`'s options: argparse dest -> the flag the command accepts."""
    from cli.main import build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    command = subparsers.choices["pipeline"]
    return {action.dest: max(action.option_strings, key=len)
            for action in command._actions if action.option_strings and action.dest != "help"}


def to_chatlens_argv(argv: list[str]) -> list[str]:
    """The `chatlens` command line for the launcher's arguments."""
    flags = pipeline_flags()
    out: list[str] = []
    for arg in argv:
        if arg.startswith("--"):
            name, equals, value = arg[2:].partition("=")
            dest = name.replace("-", "_")
            if dest in flags:
                if equals and value == "":
                    continue  # an optional parameter left empty: the command's default applies
                arg = flags[dest] + equals + value
        out.append(arg)
    if not any(arg == "--runner" or arg.startswith("--runner=") for arg in out):
        out.insert(0, f"--runner={DEFAULT_RUNNER}")
    return ["-v", "pipeline", *out]


def main(argv: list[str] | None = None) -> int:
    from cli.main import main as chatlens_main

    return chatlens_main(to_chatlens_argv(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
