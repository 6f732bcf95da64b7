"""Session fixtures for the real Gemma 3 270M: converted once per cache, loaded once per process.

Import them into a conftest or test module as `from tests.support.models import ...`. The
loaders are memoized at module level, so a fixture that ends up registered in two
places (conftest and a test module) still converts and loads only once.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

from pipeline.model.loading.sources import BASE_SPEC, GGUF_SPEC, ModelSource, resolve_model, use_compilation_cache


@lru_cache(maxsize=None)
def _source(cache_dir: Path, spec: str) -> ModelSource:
    return resolve_model(spec, cache_dir)


@lru_cache(maxsize=None)
def _causal_lm(source: ModelSource) -> Any:
    return source.load()


@pytest.fixture(scope="session")
def model_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`$CHATLENS_CACHE` when set (conversion reused across runs), else a temp dir of this run's,
    one for all of its xdist workers: the first to need a model converts it, under the cache's
    lock (`sources._exclusive`), and the others load it, compiled programs included."""
    configured = os.environ.get("CHATLENS_CACHE")
    if configured:
        return Path(configured)
    if os.environ.get("PYTEST_XDIST_WORKER"):  # each worker's basetemp is a folder of the run's own
        shared = tmp_path_factory.getbasetemp().parent / "chatlens-cache"
        shared.mkdir(exist_ok=True)
        return shared
    return tmp_path_factory.mktemp("chatlens-cache")


@pytest.fixture(scope="session", autouse=True)
def model_runtime(model_cache: Path) -> None:
    """keras-hub with TensorFlow, and XLA's compiled programs in the run's model cache, for the whole
    of this test process, whatever test comes first on it (xdist hands each worker its modules in
    no fixed order). A first test that loaded a model as serving does, without TensorFlow
    (`keras_import.import_keras_hub`), would leave every later one that builds a Gemma 3
    preprocessor or converts the GGUF failing; and the first to resolve a model sets where compiled
    programs go for good (`sources.use_compilation_cache`): into a test's own `tmp_path`, removed
    once it passed, every later write would fail and every later program be compiled afresh.
    Serving without TensorFlow is tested in a process of its own (test_gguf_convert)."""
    from pipeline.model.loading.keras_import import import_keras_hub

    import_keras_hub()
    use_compilation_cache(model_cache)  # before any test: it sets the place once, for the process


@pytest.fixture(scope="session")
def gemma_source(model_cache: Path) -> ModelSource:
    """The default model, `gemma3-270m`: the embedded Gemma with ChatLens's adapter merged in."""
    return _source(model_cache, GGUF_SPEC)


@pytest.fixture(scope="session")
def base_source(model_cache: Path) -> ModelSource:
    """`gemma3-270m-base`: the embedded Gemma as converted from the GGUF, untuned."""
    return _source(model_cache, BASE_SPEC)


@pytest.fixture(scope="session")
def gemma_preset(gemma_source: ModelSource) -> Path:
    """Directory of the default model's keras-hub preset."""
    return Path(gemma_source.preset)


@pytest.fixture(scope="session")
def gemma_lm(base_source: ModelSource) -> Any:
    """The loaded float32 untuned `Gemma3CausalLM`; shared, so do not recompile or mutate it in tests."""
    return _causal_lm(base_source)


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


@lru_cache(maxsize=None)
def gguf_metadata(cache_dir: Path) -> dict[str, Any]:
    """The bundled GGUF's key/value fields (`read_metadata`), read once per process; shared, so do not
    mutate it.

    The reader parses the file through a plain ndarray view of its memory map: the same bytes, but
    the million small slices its 262,144-token vocabulary takes skip `np.memmap`'s per-slice
    bookkeeping (about 2.5 s instead of 8 on a CPU).
    """
    import gguf
    import numpy as np

    from pipeline.model.loading.gguf_convert import read_metadata
    from pipeline.model.loading.sources import bundled_gguf

    class PlainViewReader(gguf.GGUFReader):
        @property
        def data(self) -> np.ndarray:
            return self._plain

        @data.setter
        def data(self, mapped: np.memmap) -> None:
            self._plain = mapped.view(np.ndarray)  # keeps the map alive; reads nothing more

    return read_metadata(PlainViewReader(bundled_gguf(cache_dir)))


@lru_cache(maxsize=None)
def gemma_tokenizer(cache_dir: Path) -> Any:
    """The real Gemma 3 tokenizer, rebuilt from the GGUF's metadata (no weights are read)."""
    from pipeline.model.loading.gguf_convert import tokenizer_proto
    from pipeline.model.loading.keras_import import import_keras_hub

    keras_hub = import_keras_hub()  # on the JAX backend, whichever test module comes first
    return keras_hub.models.Gemma3Tokenizer(proto=tokenizer_proto(gguf_metadata(cache_dir)), has_vision_tokens=False)


def tiny_gemma_lm(cache_dir: Path, seed: int = 0, dtype: str = "float32", num_layers: int = 2,
                  hidden_dim: int = 32, intermediate_dim: int = 64, head_dim: int = 16) -> Any:
    """A Gemma3CausalLM with random weights, 2 layers of width 32 (unless told) and the real tokenizer.

    The same seed gives the same weights: what a test needs to reload an adapter onto them.
    """
    tokenizer = gemma_tokenizer(cache_dir)  # first: it imports keras on the JAX backend
    import keras
    import keras_hub

    keras.utils.set_random_seed(seed)
    backbone = keras_hub.models.Gemma3Backbone(
        vocabulary_size=tokenizer.vocabulary_size(), image_size=None, num_layers=num_layers, num_query_heads=2,
        num_key_value_heads=1, hidden_dim=hidden_dim, intermediate_dim=intermediate_dim, head_dim=head_dim,
        query_head_dim_normalize=True,
        use_query_key_norm=True, use_post_ffw_norm=True, use_post_attention_norm=True,
        attention_logit_soft_cap=None, final_logit_soft_cap=None, use_sliding_window_attention=True,
        sliding_window_size=512, dtype=dtype)
    preprocessor = keras_hub.models.Gemma3CausalLMPreprocessor(tokenizer=tokenizer, image_converter=None)
    return keras_hub.models.Gemma3CausalLM(backbone=backbone, preprocessor=preprocessor)


@pytest.fixture
def tiny_lm(model_cache: Path) -> Any:
    return tiny_gemma_lm(model_cache)
