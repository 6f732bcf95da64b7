"""`--model-stage gemma` (the default): GemmaModelHandler, Gemma on the worker.

The only backend with per-tenant models (`--tenant-models quickbite=/models/a,...`, routed
by Beam's KeyedModelHandler over KeyModelMappings, see keyed.py) and with the preset
watch (`--model-watch`): both load Gemma presets.
"""

from __future__ import annotations

from pipeline.model.backends.base import Backend, Option
from pipeline.model.backends.gemma.watch import WATCH_INTERVAL_SECS
from pipeline.model.types import Task

OPTIONS: tuple[Option, ...] = (
    Option("--tenant-models", "per-tenant models: 'TENANT=MODEL[,TENANT=MODEL...]' (a chat's tenant field "
           "picks its model, through Beam's KeyedModelHandler with KeyModelMappings; other tenants use --model)",
           metavar="MAP"),
    Option("--max-models-per-worker", "with --tenant-models: most models kept loaded per worker, least "
           "recently used ones are released (Beam's max_models_per_worker_hint; default: no limit)", type=int,
           metavar="N", minimum=1),
    Option("--model-watch", "switch models without restarting: a file pattern matching a file inside each "
           "new preset directory, e.g. 'gs://bucket/presets/*/config.json'; the newest match added after the "
           "start wins (RunInference's watch_model_pattern; local runners watch in the handler)",
           metavar="PATTERN"),
    Option("--model-watch-interval-secs", "how often --model-watch looks for new presets", WATCH_INTERVAL_SECS,
           int, minimum=1),
)


class GemmaBackend(Backend):
    name = "gemma"
    listed = 0
    help = "Gemma on the worker"
    options = OPTIONS
    tasks = (Task.ANALYZE, Task.SENTIMENT)
    tenant_models = True
    model_watch = True

    def handler(self, settings, options, task=Task.ANALYZE):
        from pipeline.model.backends.gemma.handler import GemmaModelHandler

        watch = {}
        if settings.watch_pattern and settings.watch_in_handler:
            watch = {"watch_pattern": settings.watch_pattern, "watch_interval_secs": settings.watch_interval_secs}
        return GemmaModelHandler(options, task=self._task(task), large_model=settings.large_model, **watch)


BACKEND = GemmaBackend()
