"""The team's reply library on disk: the default that ships, and reading and writing its file.

The dashboard keeps the library (supervisors edit it there) and writes it, whole, to the file
`CHATLENS_REPLY_LIBRARY` names; the pipeline reads that file (`--reply-library`) and looks again
when it changes. Both sides read and write it through this module, one format: `ReplyLibrary`.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from chatlens.contracts import ReplyLibrary

DEFAULT_LIBRARY = Path(__file__).parent / "data" / "reply-library.json"
"""The macros ChatLens ships: a start for every corpus language, for supervisors to make their own."""


def read_library(path: str | os.PathLike = DEFAULT_LIBRARY) -> ReplyLibrary:
    """The library in a local file; a clear ValueError (the file named) when it is not one."""
    try:
        return ReplyLibrary.model_validate_json(Path(path).read_bytes())
    except ValueError as error:
        raise ValueError(f"{path} is not a reply library: {error}") from error


def write_library(library: ReplyLibrary, path: str | os.PathLike) -> None:
    """Replace the file at `path` whole (a temporary file moved in): a reader never sees half a library."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("wb", dir=target.parent, prefix=f".{target.name}.", delete=False) as out:
        out.write(library.model_dump_json(indent=1).encode("utf-8"))
    os.replace(out.name, target)
