"""The corpus tools under data/tools/ (scripts, not a package), loaded as modules for the tests."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from pipeline.corpus import DATA_DIR


def tool(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"corpus_tool_{name}", DATA_DIR / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
