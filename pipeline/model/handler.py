"""GemmaModelHandler: the Beam ModelHandler that runs Gemma on the worker.

One model per machine: `large_model=True` by default, so RunInference loads the engine once
in a separate process (Beam's `multi_process_shared`) and every worker process and thread
calls it through a proxy; `model_copies` loads more copies where memory allows (several
GPUs). Two RunInference stages that pass the same `model_identifier` share the loaded
engine: the reply stage reuses the model the analysis stage loaded.

Keras and XLA settings are applied in `load_model`, because that is the process that
imports JAX, not the process that builds the pipeline.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from apache_beam.ml.inference.base import ModelHandler, PredictionResult

from chatlens.contracts import ChatWindow

log = logging.getLogger(__name__)

TASKS = ("analyze", "reply", "sentiment")
LENGTH_BUCKET_BOUNDARIES = [256, 1024, 4096, 16384]  # characters of chat text

DEFAULT_ENV = {
    "KERAS_BACKEND": "jax",
    # JAX on GPU would otherwise take 75% of the device memory at start-up.
    "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
    "TF_CPP_MIN_LOG_LEVEL": "2",
}


def window_of(element: Any) -> ChatWindow:
    """The ChatWindow inside a RunInference element: a window, or tuples holding one
    ((key, window), (window, analysis), (key, (window, analysis)))."""
    if isinstance(element, ChatWindow):
        return element
    for part in element if isinstance(element, tuple) else ():
        try:
            return window_of(part)
        except TypeError:
            continue
    raise TypeError(f"no ChatWindow in {type(element).__name__}")


def chat_length(element: Any) -> int:
    """Characters of chat text: Beam batches elements of similar length together."""
    return sum(len(m.text) for m in window_of(element).messages)


class GemmaModelHandler(ModelHandler[Any, Any, Any]):
    """Analyses ChatWindows (task 'analyze') or drafts replies to them (task 'reply').

    - analyze: ChatWindow -> WindowAnalysis (calibrated sentiment scores and a summary).
    - reply:   (ChatWindow, WindowAnalysis) -> WindowAnalysis with `reply_draft` set.
    - sentiment: ChatWindow -> calibrated (P(negative), P(neutral), P(positive)); for evaluation.

    Each batch is one call into the engine, which batches on the model itself.
    """

    def __init__(
        self,
        model: str = "gemma3-270m",
        *,
        task: str = "analyze",
        cache_dir: str | Path | None = None,
        prompt_variant: str | None = None,
        engine_config: Any = None,
        min_batch_size: int = 1,
        max_batch_size: int = 8,
        max_batch_duration_secs: int | None = None,
        large_model: bool = True,
        model_copies: int | None = None,
        env_vars: dict[str, str] | None = None,
    ):
        if task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, not {task!r}")
        length_kwargs = {}
        if max_batch_duration_secs:  # Beam's length-aware batching needs a batch deadline.
            length_kwargs = {"batch_length_fn": chat_length, "batch_bucket_boundaries": LENGTH_BUCKET_BOUNDARIES}
        super().__init__(
            min_batch_size=min_batch_size,
            max_batch_size=max_batch_size,
            max_batch_duration_secs=max_batch_duration_secs,
            large_model=large_model,
            model_copies=model_copies,
            env_vars={**DEFAULT_ENV, **(env_vars or {})},
            **length_kwargs,
        )
        self._model = model
        self._task = task
        self._cache_dir = str(cache_dir) if cache_dir else None
        self._prompt_variant = prompt_variant
        self._engine_config = engine_config

    def __repr__(self) -> str:
        return f"GemmaModelHandler(model={self._model!r}, task={self._task!r})"

    def load_model(self):
        self.set_environment_vars()
        from pipeline.model.engine import GemmaEngine  # imports JAX: only in the loading process

        log.info("loading %s for RunInference (pid %d)", self._model, os.getpid())
        return GemmaEngine.load(
            self._model, cache_dir=self._cache_dir, prompt_variant=self._prompt_variant, config=self._engine_config
        )

    def run_inference(self, batch: Sequence[Any], model: Any, inference_args: dict | None = None
                      ) -> Iterable[PredictionResult]:
        if self._task == "sentiment":
            return [PredictionResult(example, scores) for example, scores in zip(batch, model.classify(list(batch)))]
        if self._task == "analyze":
            analyses = model.analyze(list(batch))
        else:
            drafts = model.draft_replies([window for window, _ in batch])
            analyses = [
                replace(analysis, reply_draft=draft, flags=analysis.flags + flags)
                for (_, analysis), (draft, flags) in zip(batch, drafts)
            ]
        return [PredictionResult(example, analysis, analysis.model_id) for example, analysis in zip(batch, analyses)]

    def get_num_bytes(self, batch: Sequence[Any]) -> int:
        return sum(len(m.text.encode("utf-8")) for element in batch for m in window_of(element).messages)

    def get_metrics_namespace(self) -> str:
        return f"chatlens_{self._task}"

    def update_model_path(self, model_path: str | None = None):
        """Called by RunInference's model-update side input: the next load uses the new preset."""
        if model_path:
            log.info("switching %s to %s", self, model_path)
            self._model = model_path
