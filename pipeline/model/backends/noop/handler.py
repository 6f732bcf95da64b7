"""NoopModelHandler: the `--model-stage noop` benchmarking baseline. Not a test double.

`bench/e2e.py` runs the whole streaming pipeline twice: once with Gemma, once with this
handler in the model stages, to show how much of the end-to-end time is the pipeline's
own (Pub/Sub, validation, dedup, reshuffle, RunInference batching, the shared-model
proxy, insight building, publishing) and how much is the model.

It is GemmaModelHandler with the engine swapped for `NoopModel`: the same batching
(min/max batch size, batch deadline, length buckets), the same `large_model` sharing
(one model server process, every call through its proxy), the same `run_inference`
and metrics namespace; only the model call itself does nothing. Every window gets the
same neutral analysis (so no reply is drafted under `--reply-for negative`), with
model_id `noop-baseline` and the flag `noop_model_stage`, so its insights can never pass
for real ones. Never the default; never use it for real traffic.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import replace

from chatlens.contracts import ChatWindow
from pipeline.model.backends.gemma.handler import GemmaModelHandler
from pipeline.model.types import WindowAnalysis, reply_policies, wants_reply

log = logging.getLogger(__name__)

NOOP_MODEL_ID = "noop-baseline"
NOOP_PROMPT_VERSION = "noop"
NOOP_FLAG = "noop_model_stage"
NEUTRAL_SCORES = (0.0, 1.0, 0.0)
NOOP_ANALYSIS = WindowAnalysis(
    scores=NEUTRAL_SCORES,
    summary="(not analysed: --model-stage noop, a benchmarking baseline without a model)",
    model_id=NOOP_MODEL_ID,
    prompt_version=NOOP_PROMPT_VERSION,
    flags=(NOOP_FLAG,),
)
NOOP_REPLY = "(no reply drafted: --model-stage noop benchmarking baseline)"


class NoopModel:
    """The engine's interface (analyze, classify), answering at once."""

    model_id = NOOP_MODEL_ID

    def analyze(self, windows: Sequence[ChatWindow], reply_for: str | Sequence[str] = "none") -> list[WindowAnalysis]:
        replied = replace(NOOP_ANALYSIS, reply_draft=NOOP_REPLY)
        return [replied if wants_reply(policy, NOOP_ANALYSIS.sentiment) else NOOP_ANALYSIS
                for policy in reply_policies(reply_for, len(windows))]

    def classify(self, windows: Sequence[ChatWindow]) -> list[tuple[float, float, float]]:
        return [NEUTRAL_SCORES] * len(windows)

    def get_stats(self) -> dict:
        return {"compiles": [], "batches": 0}


class NoopModelHandler(GemmaModelHandler):
    """GemmaModelHandler's plumbing around a model call that does nothing (see the module doc).

    Takes GemmaModelHandler's arguments; `model`, `cache_dir`, `prompt_variant` and
    `engine_config` are accepted and ignored.
    """

    def __repr__(self) -> str:
        return f"NoopModelHandler(task={str(self._task)!r})"

    def load_model(self) -> NoopModel:
        log.warning("model stage 'noop' (pid %d): a benchmarking baseline, the insights are not analyses",
                    os.getpid())
        return NoopModel()

    def update_model_path(self, model_path: str | None = None):
        return None


