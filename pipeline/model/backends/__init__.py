"""The model backends: what the pipeline's model stage runs (`--model-stage NAME`).

One package per backend (`gemma/`, `remote/`, `noop/`): its `__init__.py` declares its options
and its `BACKEND` (light: no Beam, no JAX), its `handler.py` the Beam ModelHandler it builds per
task. `BACKENDS` below lists them, explicitly. Adding a backend is one package here, one line
in `BACKENDS`, and its tests. `keyed.py` turns the chosen backend into the keyed handler
RunInference gets (routing, per-tenant models, model watch).

Options flow one way: `pipeline.options` collects the rows from here (each backend's own
rows become PipelineConfig fields and reach the backend as `ModelBackend.options`, with
no code there naming them); nothing here imports `pipeline.options`.
"""

from __future__ import annotations

from typing import Any

from pipeline.model.backends import gemma, noop, remote
from pipeline.model.backends.base import DEFAULT_BACKEND, SHARED_OPTIONS, Backend, Option

BACKENDS: dict[str, Backend] = {b.name: b for b in sorted((gemma.BACKEND, remote.BACKEND, noop.BACKEND),
                                                          key=lambda b: (b.listed, b.name))}
"""Every backend by name, in `listed` order (then name): --model-stage's choices and help."""
assert DEFAULT_BACKEND in BACKENDS


def backend(name: str) -> Backend:
    """The backend `--model-stage name` picks; ValueError naming the choices otherwise."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"--model-stage must be one of {', '.join(BACKENDS)}, not {name!r}") from None


def _clause(b: Backend) -> str:
    return f"'{b.name}'" + (" (default)" if b.name == DEFAULT_BACKEND else "") + f", {b.help}"


def model_stage_option() -> Option:
    """`--model-stage`: its choices and help come from the registry (the flag keeps its old name)."""
    clauses = [_clause(b) for b in BACKENDS.values()]
    listed = "; ".join(clauses[:-1]) + "; or " + clauses[-1] if len(clauses) > 1 else clauses[0]
    return Option("--model-stage", f"the model backend the model stage runs: {listed}", DEFAULT_BACKEND,
                  choices=tuple(BACKENDS))


def own_options() -> tuple[Option, ...]:
    """Every backend's own rows, in registry order: what PipelineConfig adds as fields of their own."""
    return tuple(row for b in BACKENDS.values() for row in b.options)


def backend_options() -> tuple[Option, ...]:
    """`--model-stage`, then every backend's own rows, in registry order."""
    return (model_stage_option(), *own_options())


def default(dest: str) -> Any:
    """The default of a model option (shared or a backend's own), written once in its row."""
    return next(row.default for row in (*SHARED_OPTIONS, *backend_options()) if row.dest == dest)


__all__ = ["BACKENDS", "DEFAULT_BACKEND", "SHARED_OPTIONS", "Backend", "Option", "backend", "backend_options",
           "default", "own_options"]
