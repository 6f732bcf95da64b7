"""What every model backend shares: the option row type, the rows all backends read, and `Backend`.

Light on purpose (no Beam, no JAX): `pipeline.options` collects the backends' rows at
import time, and `chatlens --help` must stay fast.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from chatlens.config import Settings
from pipeline.model.types import REPLY_FOR, WEIGHTS
from pipeline.model.types import Task

DEFAULT_BACKEND = "gemma"
"""What `--model-stage` runs unless told otherwise."""
DEFAULT_MODEL: str = Settings.model_fields["model"].default
"""The model spec when neither --model nor CHATLENS_MODEL says one (the Settings default)."""


@dataclass(frozen=True)
class Option:
    """One row of the options table: an argparse argument and a Beam pipeline option.

    `minimum` is checked where the options are resolved (PipelineConfig), for every row
    alike, so a backend's own numeric option is checked without code of its own there.
    """

    flag: str
    help: str
    default: Any = None
    type: Any = str
    choices: tuple[str, ...] | None = None
    metavar: str | None = None
    minimum: int | None = None

    def __post_init__(self):
        # The default is written once, in `default`; the help says it from there.
        if self.default is not None and "(default" not in self.help:
            object.__setattr__(self, "help", f"{self.help.rstrip()} (default {self.default})")

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    def problem(self, value: Any) -> str | None:
        """What is wrong with `value` for this row (below its minimum), or None; unset values pass."""
        if self.minimum is None or value is None or value >= self.minimum:
            return None
        return f"{self.flag} must " + ("not be negative" if self.minimum == 0 else f"be at least {self.minimum}")


SHARED_OPTIONS: tuple[Option, ...] = (
    Option("--model", "model spec: 'gemma3-270m' (the embedded Gemma 3 270M tuned by ChatLens), "
           "'gemma3-270m-base' (untuned), a keras-hub preset directory or handle "
           f"(default: CHATLENS_MODEL, else {DEFAULT_MODEL})"),
    Option("--adapter", "a LoRA adapter (.lora.h5, from `chatlens tune`) tuned for --model, merged into it "
           "once at load (default: none; gemma3-270m already carries ChatLens's own)", metavar="FILE"),
    Option("--model-cache", "where converted models are cached (default: CHATLENS_CACHE)", metavar="DIR"),
    Option("--prompt-variant", "prompt set: 'completion' or 'chat' (default: follows the model kind)"),
    Option("--min-batch-size", "smallest model batch", 1, int),
    Option("--max-batch-size", "largest model batch: chats a model call takes (a tuned model decodes 8 side by side, "
           "the rest joining as others finish)", 8, int),
    Option("--max-batch-duration-secs", "longest a batch waits to fill up; 0 batches within a bundle only",
           1, int, minimum=0),
    Option("--model-copies", "copies of the model per machine, e.g. one per GPU", 1, int, minimum=1),
    Option("--reply-for", "which chats get a reply draft", "negative", choices=REPLY_FOR),
    Option("--weights", "how a model tuned by ChatLens holds its weights: 'int8' (keras's int8 quantization, "
           "half the bytes a decoding step reads) or 'bfloat16'; other models load in float32", "int8",
           choices=WEIGHTS),
    Option("--reply-library", "the team's reply macros: the JSON file the dashboard writes (a local path or any "
           "Beam filesystem), read again when it changes; a model served with macros drafts from it (default: "
           "CHATLENS_REPLY_LIBRARY, else the library ChatLens ships)", metavar="FILE"),
)
"""The model rows every backend reads (model, batching, reply policy)."""


def _model_options_class() -> type:
    """`ModelOptions`: one field per row of SHARED_OPTIONS, named, typed and defaulted by it."""

    def post_init(self) -> None:
        problems = [problem for row in SHARED_OPTIONS if (problem := row.problem(getattr(self, row.dest)))]
        problems += [f"{row.flag} must be one of {', '.join(row.choices)}, not {getattr(self, row.dest)!r}"
                     for row in SHARED_OPTIONS if row.choices and getattr(self, row.dest) not in row.choices]
        if self.min_batch_size < 1 or self.max_batch_size < self.min_batch_size:
            problems.append("batch sizes: need 1 <= --min-batch-size <= --max-batch-size")
        if problems:
            raise ValueError("; ".join(problems))

    def from_values(cls, values: Mapping[str, Any] | Any, **changes: Any):
        """The options in `values` (a mapping by dest, or an object with them as attributes, such
        as argparse's Namespace or PipelineConfig); None means the row's default."""
        get = values.get if isinstance(values, Mapping) else lambda name: getattr(values, name, None)
        found = {f.name: value for f in dataclasses.fields(cls) if (value := get(f.name)) is not None}
        return cls(**{**found, **changes})

    rows = [(row.dest, row.type if row.default is not None else (row.type | None),
             dataclasses.field(default=MODEL_OPTION_DEFAULTS.get(row.dest, row.default))) for row in SHARED_OPTIONS]
    cls = dataclasses.make_dataclass(
        "ModelOptions", rows, frozen=True,
        namespace={"__post_init__": post_init, "from_values": classmethod(from_values),
                   "__doc__": "The model options of one run, typed: one field per shared model option row, built "
                              "once (`ModelOptions.from_values`) where the command line is read and handed whole "
                              "to the backend's handler and on to the engine."})
    cls.__module__ = __name__  # pickled with the handlers Beam ships to its workers
    return cls


MODEL_OPTION_DEFAULTS = {"model": DEFAULT_MODEL}
"""Where a field's default is not its row's: --model's row leaves it unset, so that CHATLENS_MODEL
(Settings) can fill it in where the command line is read; an options object always names a model."""
ModelOptions = _model_options_class()


class Backend:
    """One kind of model backend (`--model-stage NAME`): its own options and its handler.

    Subclasses set `name`, `help` (one clause for --model-stage's help), `options` (the
    rows only this backend reads: each becomes a PipelineConfig field and reaches `check`
    and `handler` as `settings.options[dest]`), `tasks` (what its handler can do) and say
    whether the generic model stage may route tenants to models of their own
    (`tenant_models`) or watch for new presets (`model_watch`) with it. `listed` orders
    the backends in --model-stage's help and the options reference (lower first).
    """

    name: ClassVar[str]
    help: ClassVar[str]
    listed: ClassVar[int] = 50
    options: ClassVar[tuple[Option, ...]] = ()
    tasks: ClassVar[tuple[Task, ...]] = (Task.ANALYZE,)
    tenant_models: ClassVar[bool] = False
    model_watch: ClassVar[bool] = False

    def check(self, settings) -> None:
        """Raise ValueError when `settings` (a ModelBackend) lack what this backend needs."""

    def handler(self, settings, options: ModelOptions, task: Task = Task.ANALYZE):
        """The unkeyed Beam ModelHandler running `task` with `options` (the run's ModelOptions, or a
        tenant's: its model, no adapter); `settings` is the ModelBackend (sharing, watch, own options)."""
        raise NotImplementedError

    def _task(self, task: Task | str) -> Task:
        if task not in self.tasks:
            raise ValueError(f"model backend {self.name!r} runs {', '.join(self.tasks)}, not {task!r}")
        return Task(task)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
