"""Where the project's top-level data folders are, installed or not."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def shipped(folder: str) -> Path:
    """A top-level folder of the project that the code reads (`prompts`, `data`).

    An installed wheel has it as package data under `pipeline/assets/` (pyproject.toml maps the
    repository root to the `pipeline.assets` package); a source checkout, which an editable
    install runs from, has it beside this package.
    """
    installed = _PACKAGE / "assets" / folder
    return installed if installed.is_dir() else _PACKAGE.parent / folder
