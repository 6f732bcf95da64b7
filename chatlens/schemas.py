"""Write or check the JSON Schema files generated from the message contracts.

The files in chatlens/json_schemas/ are what other teams (and other languages) read; a test
fails when they drift from chatlens/contracts.py. Regenerate with `chatlens schemas --write`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from chatlens.contracts import CONTRACTS

SCHEMA_DIR = Path(__file__).parent / "json_schemas"


def render_schemas() -> dict[str, str]:
    """File name -> JSON text, exactly as committed."""
    rendered = {}
    for name, model in CONTRACTS.items():
        schema = model.model_json_schema(mode="serialization")
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        schema["$id"] = f"https://chatlens.dev/schemas/{name}.schema.json"
        rendered[f"{name}.schema.json"] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return rendered


def stale_schemas(directory: Path = SCHEMA_DIR) -> list[str]:
    """Names of the schema files that are missing or differ from the contracts."""
    return [
        name
        for name, text in render_schemas().items()
        if not (directory / name).exists() or (directory / name).read_text() != text
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--write", action="store_true", help="rewrite the files instead of checking them")
    parser.add_argument("--dir", type=Path, default=SCHEMA_DIR, help="schema directory (default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    if args.write:
        args.dir.mkdir(parents=True, exist_ok=True)
        for name, text in render_schemas().items():
            (args.dir / name).write_text(text)
            print(f"wrote {args.dir / name}")
        return 0
    stale = stale_schemas(args.dir)
    for name in stale:
        print(f"out of date: {args.dir / name} (run `chatlens schemas --write`)")
    return 1 if stale else 0
