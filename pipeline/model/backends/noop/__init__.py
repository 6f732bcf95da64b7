"""`--model-stage noop`: the benchmarking baseline of bench/e2e.py (handler.py here).

GemmaModelHandler's batching and model sharing around a model call that does nothing, so
the pipeline's own overhead can be measured. Never for real traffic.
"""

from __future__ import annotations

from pipeline.model.backends.base import Backend
from pipeline.model.types import Task


class NoopBackend(Backend):
    name = "noop"
    listed = 90
    help = ("a benchmarking baseline for bench/e2e.py that keeps the RunInference stages but answers every "
            "window at once with a fixed neutral analysis (model_id noop-baseline), to measure the pipeline's "
            "own overhead; never for real traffic")
    tasks = (Task.ANALYZE, Task.SENTIMENT)

    def handler(self, settings, options, task=Task.ANALYZE):
        from pipeline.model.backends.noop.handler import NoopModelHandler

        return NoopModelHandler(options, task=self._task(task), large_model=settings.large_model)


BACKEND = NoopBackend()
