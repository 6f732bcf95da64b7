"""Session fixtures for the real Gemma 3 270M: converted once per cache, loaded once per process.

Import them into a conftest or test module as `from model_fixtures import ...`. The
loaders are memoized at module level, so a fixture that ends up registered in two
places (conftest and a test module) still converts and loads only once.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

from pipeline.model.sources import GGUF_SPEC, ModelSource, resolve_model


@lru_cache(maxsize=None)
def _source(cache_dir: Path) -> ModelSource:
    return resolve_model(GGUF_SPEC, cache_dir)


@lru_cache(maxsize=None)
def _causal_lm(source: ModelSource) -> Any:
    return source.load()


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`$CHATLENS_CACHE` when set (conversion reused across runs), else a per-session temp dir."""
    configured = os.environ.get("CHATLENS_CACHE")
    return Path(configured) if configured else tmp_path_factory.mktemp("chatlens-cache")


@pytest.fixture(scope="session")
def gemma_source(model_cache: Path) -> ModelSource:
    return _source(model_cache)


@pytest.fixture(scope="session")
def gemma_preset(gemma_source: ModelSource) -> Path:
    """Directory of the converted keras-hub preset."""
    return Path(gemma_source.preset)


@pytest.fixture(scope="session")
def gemma_lm(gemma_source: ModelSource) -> Any:
    """The loaded float32 `Gemma3CausalLM`; shared, so do not recompile or mutate it in tests."""
    return _causal_lm(gemma_source)


def copy_preset(source: Path, target: Path, model_id: str) -> Path:
    """A second preset of the same weights under another model_id (hard links: no extra disk).

    Written beside `target` and renamed into place, the way a new preset should arrive.
    """
    import json
    import shutil

    staging = target.with_name(f".{target.name}.staging")
    shutil.copytree(source, staging, copy_function=os.link)
    marker = staging / "chatlens.json"
    fields = json.loads(marker.read_text(encoding="utf-8"))
    marker.unlink()  # a hard link: never write through it into the source preset
    marker.write_text(json.dumps({**fields, "model_id": model_id}), encoding="utf-8")
    os.rename(staging, target)
    return target


@pytest.fixture(scope="session")
def second_preset(gemma_preset: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The converted Gemma again, as a local preset directory with model_id `gemma3-270m-second`."""
    return copy_preset(gemma_preset, tmp_path_factory.mktemp("presets") / "second", "gemma3-270m-second")
