"""GemmaModelHandler: the Beam ModelHandler that runs Gemma on the worker.

One model per machine, two ways:
- `large_model=True` (Dataflow and other runners that start several SDK processes per
  VM): RunInference loads the engine once per machine through Beam's
  `multi_process_shared` and every worker process and thread calls it through a proxy;
  `model_copies` loads more copies where memory allows (several GPUs). Two RunInference
  stages that pass the same `model_identifier` share the loaded engine.
- `large_model=False` (local runners, which run the whole job in one process): one engine
  per model spec per process, shared by every stage and thread through a process-wide
  Beam `shared.Shared` (RunInference's own in-process cache is per DoFn, so two stages or
  two pipelines in one process would each load a copy). No manager server, no proxies.

Keras and XLA settings are applied in `load_model`, because that is the process that
imports JAX, not the process that builds the pipeline.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from apache_beam.ml.inference.base import ModelHandler, PredictionResult
from apache_beam.utils import shared

from pipeline.model.backends.base import DEFAULT_MODEL, ModelOptions
from pipeline.model.backends.gemma.watch import WATCH_INTERVAL_SECS, PresetWatch, preset_of
from pipeline.model.environment import DEFAULT_ENV
from pipeline.model.types import Task, chat_of, text_bytes

log = logging.getLogger(__name__)

TASKS = (Task.ANALYZE, Task.SENTIMENT)
"""What GemmaModelHandler runs (the gemma and noop backends)."""

_ENGINES = shared.Shared()
"""Engines loaded in this process, by model spec: what `large_model=False` stages share."""


class GemmaModelHandler(ModelHandler[Any, Any, Any]):
    """Analyses ChatWindows: sentiment, summary and, where `reply_for` selects it, a reply draft.

    - analyze: ChatWindow -> WindowAnalysis (sentiment scores, summary, `reply_draft` for the
      chats `reply_for` selects: 'negative', 'all' or 'none'). A model tuned by ChatLens does
      all of it in one pass per chat; an untuned one is prompted per output.
    - sentiment: ChatWindow -> (P(negative), P(neutral), P(positive)); for evaluation.

    Examples are ChatWindows, or records holding one as `chat` (the pipeline's TaggedWindow,
    see `chat_of`): the rest rides along in the PredictionResult's example. Each batch is
    one call into the engine, which batches on the model itself.
    With `watch_pattern` (local runners; see pipeline/model/backends/gemma/watch.py) the handler switches
    to the newest preset matching the pattern, checked every `watch_interval_secs`.
    """

    def __init__(
        self,
        model: str | ModelOptions = DEFAULT_MODEL,
        *,
        task: Task | str = Task.ANALYZE,
        large_model: bool = True,
        engine_config: Any = None,
        env_vars: dict[str, str] | None = None,
        watch_pattern: str | None = None,
        watch_interval_secs: float = WATCH_INTERVAL_SECS,
        **options: Any,
    ):
        """`model`: the run's ModelOptions, whole; or a model spec, and `options` any other
        ModelOptions fields by name (`cache_dir`: `model_cache`'s older name), for a handler made
        by hand (`chatlens eval`, the benchmarks, tests). Batches by deadline
        (`max_batch_duration_secs`) are made before RunInference (backends/keyed.py), so Beam
        gets batch sizes only."""
        if task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, not {task!r}")
        if "cache_dir" in options:
            options["model_cache"] = options.pop("cache_dir")
        if isinstance(model, ModelOptions):
            if options:
                raise TypeError(f"ModelOptions given whole, and some of its fields again: {sorted(options)}")
            self._options = model
        else:
            self._options = ModelOptions.from_values({k: str(v) if k in ("adapter", "model_cache") and v else v
                                                      for k, v in options.items()}, model=model)
        copies = self._options.model_copies
        super().__init__(
            min_batch_size=self._options.min_batch_size,
            max_batch_size=self._options.max_batch_size,
            large_model=large_model,
            model_copies=copies if copies > 1 else None,
            env_vars={**DEFAULT_ENV, **(env_vars or {})},
        )
        self._model = self._options.model  # the preset watch or Beam's model update may change it
        self._task = Task(task)
        self._engine_config = engine_config
        self._watch_pattern = watch_pattern
        self._watch_interval_secs = watch_interval_secs
        self._watch_since = time.time()  # built when the job is: the job's start, as Beam's watch uses
        self._watch: PresetWatch | None = None
        self._watched: tuple[str, Any] | None = None  # (preset, engine) found by the watch

    def __repr__(self) -> str:
        return f"GemmaModelHandler(model={self._model!r}, task={str(self._task)!r})"

    def load_model(self):
        if self.share_model_across_processes():
            return self._load_engine(self._model)  # Beam shares it across processes
        return self._process_engine(self._model)

    def _process_engine(self, spec: str):
        """The engine for `spec` shared by every stage and thread of this process, loaded once."""
        o = self._options
        tag = "|".join(map(str, (spec, o.adapter, o.model_cache, o.prompt_variant, self._engine_config)))
        return _ENGINES.acquire(lambda: self._load_engine(spec), tag=tag)

    def _load_engine(self, spec: str):
        self.set_environment_vars()  # DEFAULT_ENV (pipeline/model/environment.py) before JAX is imported
        from pipeline.model.backends.gemma.engine import load_engine  # imports JAX: only in the loading process

        log.info("loading %s for RunInference (pid %d)", spec, os.getpid())
        return load_engine(replace(self._options, model=spec), config=self._engine_config)

    def _current(self, model: Any) -> Any:
        """The engine to use: `model`, unless the preset watch found a newer preset."""
        if not self._watch_pattern:
            return model
        if self._watch is None:
            self._watch = PresetWatch(self._watch_pattern, self._watch_interval_secs, since=self._watch_since)
        preset = self._watch.latest()
        if preset and (self._watched is None or self._watched[0] != preset):
            log.info("%s: new preset %s found by the watch on %s", self, preset, self._watch_pattern)
            self._watched = (preset, self._process_engine(preset))
            self._model = preset
        return self._watched[1] if self._watched else model

    def run_inference(self, batch: Sequence[Any], model: Any, inference_args: dict | None = None
                      ) -> Iterable[PredictionResult]:
        model = self._current(model)
        if self._task is Task.SENTIMENT:
            scores = model.classify([chat_of(example) for example in batch])
            return [PredictionResult(example, score) for example, score in zip(batch, scores)]
        analyses = model.analyze([chat_of(example) for example in batch], self._options.reply_for)
        return [PredictionResult(example, analysis, analysis.model_id) for example, analysis in zip(batch, analyses)]

    def get_num_bytes(self, batch: Sequence[Any]) -> int:
        return text_bytes(batch)

    def get_metrics_namespace(self) -> str:
        return f"chatlens_{self._task}"

    def update_model_path(self, model_path: str | None = None):
        """Called by RunInference's model-update side input (`watch_model_pattern`) before it
        loads again: a path matched inside a preset directory means that directory."""
        if model_path:
            log.info("switching %s to %s", self, preset_of(model_path))
            self._model = preset_of(model_path)
