"""The chosen model backend, resolved from the options, as the keyed handler RunInference gets.

`ModelBackend` holds the model options of one run; `handler()` asks the chosen backend
(see the registry in `__init__.py`) for its unkeyed handler and keys it by route. With
per-tenant models (`--tenant-models quickbite=/models/a,telnova=/models/b`, gemma only)
a Beam `KeyedModelHandler` over `KeyModelMapping`s routes each chat by its tenant; other
tenants use `--model`; `--max-models-per-worker` caps how many stay loaded (Beam's
`max_models_per_worker_hint`, least recently used ones are released).

RunInference examples are keyed by route (the tenant, or `DEFAULT_ROUTE`), and carry the
pipeline's message origin along: `Routed(route, TaggedWindow(origin, chat))`
(pipeline/transforms/records.py).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from apache_beam.ml.inference.base import KeyedModelHandler, KeyModelMapping

from chatlens.contracts import ChatWindow
from pipeline.model.backends import BACKENDS, DEFAULT_BACKEND, Backend, backend
from pipeline.model.backends.base import ModelOptions
from pipeline.model.backends.gemma.watch import WATCH_INTERVAL_SECS
from pipeline.model.types import Task

DEFAULT_ROUTE = "*"
"""The route of every chat whose tenant has no model of its own."""


def parse_tenant_models(text: str | None) -> tuple[tuple[str, str], ...]:
    """'tenantA=SPEC,tenantB=SPEC' -> ((tenantA, SPEC), (tenantB, SPEC)), with clear errors."""
    pairs: list[tuple[str, str]] = []
    for item in (text or "").split(","):
        if not item.strip():
            continue
        tenant, sep, spec = item.partition("=")
        if not sep or not tenant.strip() or not spec.strip():
            raise ValueError(f"--tenant-models: {item.strip()!r} is not TENANT=MODEL")
        if tenant.strip() in dict(pairs):
            raise ValueError(f"--tenant-models: tenant {tenant.strip()!r} appears twice")
        pairs.append((tenant.strip(), spec.strip()))
    return tuple(pairs)


def _able(capability: str) -> str:
    return " or ".join(f"--model-stage {name}" for name, b in BACKENDS.items() if getattr(b, capability))


@dataclass(frozen=True)
class ModelBackend:
    """The resolved model stage of one run (see PipelineConfig.model_backend): the chosen
    backend, the run's ModelOptions (handed whole to the backend's handler), and the stage's
    routing and sharing."""

    kind: str = DEFAULT_BACKEND
    model_options: ModelOptions = ModelOptions()
    large_model: bool = True
    tenant_models: tuple[tuple[str, str], ...] = ()
    max_models_per_worker: int | None = None
    watch_pattern: str | None = None
    watch_interval_secs: int = WATCH_INTERVAL_SECS
    watch_in_handler: bool = False  # local runners: the handler watches (backends/gemma/watch.py)
    options: dict[str, Any] = field(default_factory=dict, hash=False)
    """The chosen backend's own options by dest, e.g. {"remote_url": ..., "remote_model": ...}."""

    @classmethod
    def from_options(cls, values: Mapping[str, Any], *, large_model: bool, watch_in_handler: bool) -> ModelBackend:
        """The ModelBackend that the model options `values` describe (by dest: the shared rows,
        `model_stage` and every backend's own rows, as PipelineConfig holds them).

        Here, not in PipelineConfig, because this class implements what those options mean;
        the chosen backend gets its own rows as `options`, whatever they are.
        """
        chosen = backend(values["model_stage"])
        return cls(
            kind=chosen.name, model_options=ModelOptions.from_values(values), large_model=large_model,
            tenant_models=parse_tenant_models(values["tenant_models"]),
            max_models_per_worker=values["max_models_per_worker"], watch_pattern=values["model_watch"],
            watch_interval_secs=values["model_watch_interval_secs"], watch_in_handler=watch_in_handler,
            options={row.dest: values[row.dest] for row in chosen.options},
        )

    def __post_init__(self):
        chosen = self.backend
        chosen.check(self)
        if self.tenant_models and not chosen.tenant_models:
            raise ValueError(f"--tenant-models needs {_able('tenant_models')}")
        if self.tenant_models and self.watch_pattern:
            raise ValueError("--model-watch and --tenant-models cannot be combined (Beam updates one model "
                             "per RunInference from a file pattern)")
        if self.watch_pattern and not chosen.model_watch:
            raise ValueError(f"--model-watch needs {_able('model_watch')}")

    @property
    def backend(self) -> Backend:
        return backend(self.kind)

    @cached_property
    def _routed_tenants(self) -> frozenset[str]:
        return frozenset(tenant for tenant, _ in self.tenant_models)

    def route(self, window: ChatWindow) -> str:
        """The RunInference key of a chat: its tenant when that tenant has a model of its own."""
        return window.tenant if window.tenant in self._routed_tenants else DEFAULT_ROUTE

    def run_inference_kwargs(self) -> dict[str, Any]:
        """Extra RunInference arguments: Beam's model-update side input, where the runner has it."""
        if self.watch_pattern and not self.watch_in_handler:
            return {"watch_model_pattern": self.watch_pattern, "interval": self.watch_interval_secs}
        return {}

    def handler(self, task: Task = Task.ANALYZE):
        """The keyed model handler of the model stage."""
        if not self.tenant_models:
            return BackendModelHandler(self._unkeyed(self.model_options, task), self.prebatched)
        tenants_by_model: dict[str, list[str]] = defaultdict(list)
        for tenant, spec in self.tenant_models:
            tenants_by_model[spec].append(tenant)
        mappings = [KeyModelMapping([DEFAULT_ROUTE], self._unkeyed(self.model_options, task))]
        mappings += [KeyModelMapping(tenants, self._unkeyed(replace(self.model_options, model=spec, adapter=None), task))
                     for spec, tenants in tenants_by_model.items()]
        return TenantModelHandler(mappings, self.max_models_per_worker, self.prebatched)

    @property
    def prebatched(self) -> bool:
        """Batches by deadline are made before RunInference
        (`pipeline.transforms.batching.BatchChats`): Beam's own
        (`BatchElements(max_batch_duration_secs=...)`) keeps its state under untyped keys,
        whose coder is not deterministic."""
        return bool(self.model_options.max_batch_duration_secs)

    def _unkeyed(self, options: ModelOptions, task: Task):
        return self.backend.handler(self, options, task)


class BackendModelHandler(KeyedModelHandler):
    """Beam's KeyedModelHandler, which takes the batches made upstream where the stage batches
    by deadline (`prebatched`: streaming, see `pipeline.transforms.batching.BatchChats`)."""

    def __init__(self, unkeyed, prebatched: bool = False, **kwargs):
        super().__init__(unkeyed, **kwargs)
        self._prebatched = prebatched

    def should_skip_batching(self) -> bool:
        return self._prebatched


class TenantModelHandler(BackendModelHandler):
    """The stage's handler over KeyModelMappings (one model per group of tenants), keeping
    the batching of the first mapping's handler, which Beam's multi-model KeyedModelHandler
    would otherwise drop (the handlers of one stage all batch alike)."""

    def __init__(self, mappings: list[KeyModelMapping], max_models_per_worker: int | None = None,
                 prebatched: bool = False):
        super().__init__(mappings, prebatched, max_models_per_worker_hint=max_models_per_worker)
        self._batching = mappings[0].mh.batch_elements_kwargs()

    def batch_elements_kwargs(self) -> dict[str, Any]:
        return self._batching
