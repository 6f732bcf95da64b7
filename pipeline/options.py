"""The options of `chatlens pipeline`: one table, wired into argparse and into Beam.

Every ChatLens option is declared once in `OPTIONS`. The `chatlens pipeline` command
adds them to its argparse parser (`add_pipeline_arguments`), and `ChatLensOptions`
registers the same table with Beam, so the values travel inside the job's
PipelineOptions (visible in the Dataflow UI) and `options.view_as(ChatLensOptions)`
reads them back. Arguments the command does not know are Beam options
(`--region`, `--temp_location`, `--flink_master`, ...) and go to PipelineOptions as
they are. The model rows come from the model backends (`pipeline.model.backends`: the rows
they all read, `--model-stage`, and each backend's own); every default is written once, in
its row, and read from there. Nothing heavy is imported at module level, so
`chatlens --help` stays fast.
"""

from __future__ import annotations

import argparse
import inspect
from dataclasses import dataclass, fields
from typing import Any

from chatlens.config import LAYOUT
from pipeline.model.backends import BACKENDS, SHARED_OPTIONS, backend_options, own_options
from pipeline.model.backends.base import ModelOptions, Option

LOCAL_RUNNERS = ("BundleBasedDirectRunner", "DirectRunner", "SwitchingDirectRunner")
DEFAULT_RUNNER = "BundleBasedDirectRunner"
MODEL_STAGES = tuple(BACKENDS)
"""--model-stage: the model backends (pipeline/model/backends/), by name."""
MODEL_SHARING = ("auto", "process", "machine")
MODEL_TAG = "chatlens-gemma"
"""RunInference `model_identifier` of the model stage: one model per machine, shared by its processes."""
_MODEL_BEFORE_STAGE = 3  # --model, --adapter, --model-cache come before --model-stage


OPTIONS: tuple[Option, ...] = (
    Option("--runner", "Beam runner; DataflowRunner, FlinkRunner, ... take their own Beam options, passed "
           "through as they are", DEFAULT_RUNNER),
    Option("--project", "Google Cloud project id, at least 6 characters (default: CHATLENS_PROJECT, "
           "else chatlens-local)"),
    Option("--mode", "input: 'windows' (each message is a ChatWindow) or 'messages' (each message is a "
           "ChatMessage, sessionised per chat)", "windows", choices=("windows", "messages")),
    Option("--subscription", "input subscription id or path (default: "
           f"{LAYOUT.windows_subscription} in windows mode, {LAYOUT.messages_subscription} in messages mode)"),
    Option("--results-topic", "topic id or path for ChatInsights",
           LAYOUT.insights_topic),
    Option("--deadletter-topic", "topic id or path for DeadLetters",
           LAYOUT.deadletter_topic),
    Option("--timestamp-attribute", "message attribute holding the event time (RFC 3339 or epoch millis); "
           "default: the Pub/Sub publish time", metavar="NAME"),
    *SHARED_OPTIONS[:_MODEL_BEFORE_STAGE],
    *backend_options(),
    Option("--model-sharing", "how workers share the model: 'machine' (one copy per machine for all worker "
           "processes, Beam's multi_process_shared), 'process' (one copy per worker process, shared by both "
           "stages), 'auto' (default: process on local runners, which run in one process; machine elsewhere)",
           "auto", choices=MODEL_SHARING),
    *SHARED_OPTIONS[_MODEL_BEFORE_STAGE:],
    Option("--session-gap-secs", "messages mode: a chat's session ends after this much silence",
           600, int, minimum=1),
    Option("--early-fire-count", "messages mode: analyse a growing chat again after this many new messages",
           4, int, minimum=1),
    Option("--early-fire-secs", "messages mode: ... or this many seconds after a new message",
           30, int, minimum=1),
    Option("--allowed-lateness-secs", "messages mode: how late a message may arrive and still update its "
           "session; older ones are dead-lettered", 86_400, int, minimum=0),
    Option("--dedup-ttl-secs", "forget a (chat_id, window_id) this long after first seeing it; redeliveries "
           "within it are dropped", 3_600, int, minimum=1),
    Option("--accelerator", "resource hint for the model stage, e.g. "
           "'type:nvidia-l4;count:1;install-nvidia-driver' (default none)"),
    Option("--min-ram", "resource hint for the model stage, e.g. '16GB' (default none)"),
    Option("--max-outstanding", "local runners: most input messages held unacknowledged at once",
           200, int, minimum=1),
    Option("--lease-secs", "local runners: ack deadline (10-600 s) of an input message read but not yet "
           "settled, renewed every quarter of it; what a killed pipeline held comes back this long after",
           60, int),
)

DEFAULTS: dict[str, Any] = {option.dest: option.default for option in OPTIONS}
"""Every option's default, from its row: what PipelineConfig, batch.py and the handlers use."""


def add_option_rows(parser, rows: tuple[Option, ...] = OPTIONS) -> None:
    """Add option rows to an argparse parser (or group): `chatlens pipeline` adds them all,
    `chatlens analyze` the model rows it reads."""
    for option in rows:
        parser.add_argument(
            option.flag, dest=option.dest, default=option.default, type=option.type, choices=option.choices,
            metavar=option.metavar, help=option.help,
        )


def add_pipeline_arguments(parser: argparse.ArgumentParser) -> None:
    """Add every ChatLens pipeline option to an argparse parser (the CLI)."""
    add_option_rows(parser.add_argument_group("pipeline options"))


def _register(parser) -> None:
    """The same table for Beam's parser (`_BeamArgumentParser`)."""
    for option in OPTIONS:
        if option.dest in ("runner", "project"):
            continue  # Beam's own StandardOptions / GoogleCloudOptions carry these
        flag = "--" + option.dest  # Beam spells options with underscores
        parser.add_argument(flag, dest=option.dest, default=option.default, type=option.type,
                            choices=option.choices, help=option.help)


def chatlens_options_class():
    """`ChatLensOptions`, defined on first use so that importing this module stays cheap."""
    global _OPTIONS_CLASS
    if _OPTIONS_CLASS is None:
        from apache_beam.options.pipeline_options import PipelineOptions

        class ChatLensOptions(PipelineOptions):
            """ChatLens's options inside Beam's PipelineOptions (`options.view_as(ChatLensOptions)`)."""

            @classmethod
            def _add_argparse_args(cls, parser):
                _register(parser)

        _OPTIONS_CLASS = ChatLensOptions
    return _OPTIONS_CLASS


_OPTIONS_CLASS = None


def _with_model_options(cls):
    """Give `cls` (before @dataclass) a field for each model option: the shared rows (as
    ModelOptions defaults them) and each backend's own rows, each defaulting to its row.

    So a model option reaches the config, Beam's options (`beam_options`) and the backend
    (`model_backend`) with nothing here naming it: the model fields are written once, in their
    rows; adding a backend is its package in pipeline/model/backends/ and its tests.
    """
    annotations = dict(inspect.get_annotations(cls))
    shared = {f.name: f for f in fields(ModelOptions)}
    for row in (*SHARED_OPTIONS, *own_options()):
        if row.dest in annotations:
            raise TypeError(f"model option {row.flag} clashes with the PipelineConfig field {row.dest!r}")
        default = shared[row.dest].default if row.dest in shared else row.default
        kind = getattr(row.type, "__name__", "Any")
        annotations[row.dest] = kind if default is not None else f"{kind} | None"
        setattr(cls, row.dest, default)
    cls.__annotations__ = annotations
    return cls


@dataclass(frozen=True)
@_with_model_options
class PipelineConfig:
    """The resolved options of one pipeline run (defaults filled in from Settings and LAYOUT).

    The fields below are the options the pipeline itself reads; the model options (the shared
    rows: `model_options()`, and each backend's own: remote's endpoint, gemma's per-tenant
    models, ...) are added as fields from their rows.
    """

    project: str
    runner: str = DEFAULTS["runner"]
    mode: str = DEFAULTS["mode"]
    subscription: str = LAYOUT.windows_subscription
    results_topic: str = DEFAULTS["results_topic"]
    deadletter_topic: str = DEFAULTS["deadletter_topic"]
    timestamp_attribute: str | None = None
    model_stage: str = DEFAULTS["model_stage"]
    session_gap_secs: int = DEFAULTS["session_gap_secs"]
    early_fire_count: int = DEFAULTS["early_fire_count"]
    early_fire_secs: int = DEFAULTS["early_fire_secs"]
    allowed_lateness_secs: int = DEFAULTS["allowed_lateness_secs"]
    dedup_ttl_secs: int = DEFAULTS["dedup_ttl_secs"]
    accelerator: str | None = None
    min_ram: str | None = None
    max_outstanding: int = DEFAULTS["max_outstanding"]
    lease_secs: int = DEFAULTS["lease_secs"]
    model_sharing: str = DEFAULTS["model_sharing"]
    model_tag: str = MODEL_TAG

    def __post_init__(self):
        problems = []
        if len(self.project) < 6:
            problems.append(f"--project {self.project!r}: Beam needs a project id of at least 6 characters")
        problems += [problem for row in OPTIONS if row not in SHARED_OPTIONS  # ModelOptions checks those
                     if (problem := row.problem(getattr(self, row.dest)))]
        if not 10 <= self.lease_secs <= 600:
            problems.append("--lease-secs must be between 10 and 600 (Pub/Sub's ack deadlines)")
        if self.model_sharing not in MODEL_SHARING:
            problems.append(f"--model-sharing must be one of {', '.join(MODEL_SHARING)}, not {self.model_sharing!r}")
        if self.model_stage not in MODEL_STAGES:
            problems.append(f"--model-stage must be one of {', '.join(MODEL_STAGES)}, not {self.model_stage!r}")
        else:
            try:
                self.model_backend()  # ModelOptions checks the shared rows, the backend its own
            except ValueError as error:
                problems.append(str(error))
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def local(self) -> bool:
        """The runner runs the pipeline in this process (the command waits for it)."""
        return self.runner.split(".")[-1] in LOCAL_RUNNERS

    @property
    def large_model(self) -> bool:
        """Share one model per machine across worker processes (Beam's `large_model`)?

        Not on local runners by default: they run the job in one process, where Beam's
        cross-process sharing only adds a manager server and proxies.
        """
        if self.model_sharing == "auto":
            return not self.local
        return self.model_sharing == "machine"

    def model_options(self) -> ModelOptions:
        """The run's model options, typed, from the shared rows' fields."""
        return ModelOptions.from_values(self)

    def model_backend(self):
        """The ModelBackend (pipeline/model/backends/keyed.py) these options describe.

        It gets every model option by name (shared rows, --model-stage, each backend's own)
        and picks what it reads there, so no backend option is named here.
        """
        from pipeline.model.backends.keyed import ModelBackend

        values = {row.dest: getattr(self, row.dest) for row in (*SHARED_OPTIONS, *backend_options())}
        return ModelBackend.from_options(values, large_model=self.large_model, watch_in_handler=self.local)

    @property
    def acks_after_publish(self) -> bool:
        """Use the leasing Pub/Sub read (acknowledge once the outcome is published).

        Only on the BundleBasedDirectRunner, whose read evaluator it extends; the
        DirectRunner may hand the graph to Prism, which needs the plain ReadFromPubSub.
        """
        return self.runner.split(".")[-1] == DEFAULT_RUNNER

    @property
    def subscription_path(self) -> str:
        from chatlens.config import subscription_path

        return _path(self.subscription, self.project, subscription_path)

    @property
    def results_topic_path(self) -> str:
        from chatlens.config import topic_path

        return _path(self.results_topic, self.project, topic_path)

    @property
    def deadletter_topic_path(self) -> str:
        from chatlens.config import topic_path

        return _path(self.deadletter_topic, self.project, topic_path)

    def model_resource_hints(self) -> dict[str, str]:
        hints = {}
        if self.accelerator:
            hints["accelerator"] = self.accelerator
        if self.min_ram:
            hints["min_ram"] = self.min_ram
        return hints

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> PipelineConfig:
        from chatlens.config import get_settings

        settings = get_settings()
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in vars(args).items() if k in known and v is not None}
        values["project"] = args.project or settings.project
        values["model"] = args.model or settings.model
        values.setdefault("model_cache", str(settings.cache))
        if settings.reply_library:
            values.setdefault("reply_library", settings.reply_library)
        if not args.subscription:
            values["subscription"] = (
                LAYOUT.messages_subscription if values.get("mode") == "messages" else LAYOUT.windows_subscription
            )
        return cls(**values)


def _path(name: str, project: str, make) -> str:
    """A full resource path: `name` as given, or made from the project and a short name."""
    return name if name.startswith("projects/") else make(project, name)


def beam_options(config: PipelineConfig, beam_args: list[str] | None = None, *, streaming: bool = True):
    """Beam PipelineOptions for `config`, plus Beam's own arguments passed through."""
    from apache_beam.options.pipeline_options import (
        GoogleCloudOptions,
        PipelineOptions,
        SetupOptions,
        StandardOptions,
    )

    chatlens_options_class()  # registers ChatLens's options with Beam's parser
    flags = list(beam_args or [])
    for field in fields(config):
        option = next((o for o in OPTIONS if o.dest == field.name), None)
        value = getattr(config, field.name)
        if option is None or field.name in ("runner", "project") or value is None:
            continue
        flags.append(f"--{field.name}={value}")
    options = PipelineOptions(flags)
    options.view_as(StandardOptions).runner = config.runner
    options.view_as(StandardOptions).streaming = streaming
    options.view_as(GoogleCloudOptions).project = config.project
    # Everything the workers run lives in installed modules (chatlens, pipeline), never
    # in __main__, so there is no main session to save. Workers need the package itself:
    # a custom container or --setup_file.
    options.view_as(SetupOptions).save_main_session = False
    return options
