"""The model stage (AnalyzeWindows) and the whole graph between reading and publishing (AnalyzeChats)."""

from __future__ import annotations

from typing import Any

import apache_beam as beam

from pipeline.model.backends import DEFAULT_BACKEND
from pipeline.model.backends.keyed import ModelBackend
from pipeline.transforms.batching import BatchChats
from pipeline.transforms.dead_letters import failed_batch_dead_letters
from pipeline.transforms.dedup import DeduplicateWindows
from pipeline.transforms.insights import BuildInsightFn
from pipeline.transforms.records import DEAD_LETTER, SETTLED, Analysed, Routed
from pipeline.transforms.sessions import Sessionize
from pipeline.transforms.validate import ValidateMessages, ValidateWindows


def analysed(result) -> Analysed:
    """RunInference's (route, PredictionResult of a TaggedWindow) -> Analysed."""
    _route, prediction = result
    origin, chat = prediction.example
    return Analysed(origin, chat, prediction.inference)


class AnalyzeWindows(beam.PTransform):
    """TaggedWindows -> ChatInsight Outputs, plus dead letters of the model stage.

    Reshuffle (spread the model work), then one RunInference through the shared model
    (`model_tag`): sentiment, summary and, for the chats the backend's `reply_for` selects, a
    reply draft (a tuned model does all three in one pass per chat), then the insight.
    Elements enter RunInference as `Routed` (keyed by their model route, pipeline/model/backends/keyed.py)
    with the origin riding along in the example. Failed batches become dead letters of stage
    "inference", failed insights of stage "postprocess".
    """

    def __init__(self, backend: ModelBackend, model_tag: str | None = None,
                 resource_hints: dict[str, str] | None = None):
        super().__init__()
        self._backend = backend
        self._model_tag = model_tag
        self._hints = dict(resource_hints or {})
        if backend.kind != DEFAULT_BACKEND and model_tag:
            self._model_tag = f"{model_tag}-{backend.kind}"  # never attach to a loaded Gemma

    def _run_inference(self):
        from apache_beam.ml.inference.base import RunInference

        transform = RunInference(self._backend.handler(), model_identifier=self._model_tag,
                                 **self._backend.run_inference_kwargs())
        if self._hints:
            transform = transform.with_resource_hints(**self._hints)
        return transform.with_exception_handling()

    def expand(self, windows):
        backend = self._backend

        def routed(tagged):
            return Routed(backend.route(tagged.chat), tagged)

        routed_windows = windows | "Reshuffle" >> beam.Reshuffle() | "Route" >> beam.Map(routed)
        if backend.prebatched:
            batching = backend.model_options
            routed_windows = routed_windows | "Batch" >> BatchChats(batching.max_batch_size,
                                                                     batching.max_batch_duration_secs)
        results, failures = routed_windows | "Analyze" >> self._run_inference()
        built = (results | "Unpack" >> beam.Map(analysed)
                 | "BuildInsight" >> beam.ParDo(BuildInsightFn()).with_outputs(DEAD_LETTER, main="insights"))
        dead = [failures.failed_inferences | "AnalyzeFailed" >> beam.FlatMap(failed_batch_dead_letters, "inference"),
                built[DEAD_LETTER]]
        return {"insights": built.insights, DEAD_LETTER: dead | "ModelDeadLetters" >> beam.Flatten()}


class AnalyzeChats(beam.PTransform):
    """The ChatLens graph: Envelopes in; insights, dead letters and settled duplicates out.

    Returns a dict: "insights" and "dead_letter" (PCollections of Output), "settled"
    (tuples of source ids that need no output: duplicates).
    """

    def __init__(self, config: Any):
        super().__init__()
        self._config = config

    def expand(self, envelopes):
        config = self._config
        if config.mode == "windows":
            validated = envelopes | "ValidateWindows" >> ValidateWindows()
            windows, invalid = validated.windows, [validated[DEAD_LETTER]]
        elif config.mode == "messages":
            events = envelopes | "ValidateMessages" >> ValidateMessages(
                config.early_fire_count, config.session_gap_secs, config.allowed_lateness_secs)
            sessions = events.events | "Sessionize" >> Sessionize(
                config.session_gap_secs, config.early_fire_count, config.early_fire_secs,
                config.allowed_lateness_secs)
            windows, invalid = sessions["windows"], [events[DEAD_LETTER], sessions[DEAD_LETTER]]
        else:
            raise ValueError(f"mode must be windows or messages, not {config.mode!r}")
        fresh = windows | "Deduplicate" >> DeduplicateWindows(config.dedup_ttl_secs)
        analysed_windows = fresh.windows | "AnalyzeWindows" >> AnalyzeWindows(
            config.model_backend(), config.model_tag, config.model_resource_hints())
        dead = [*invalid, analysed_windows[DEAD_LETTER]] | "DeadLetters" >> beam.Flatten()
        return {"insights": analysed_windows["insights"], DEAD_LETTER: dead, SETTLED: fresh[SETTLED]}
