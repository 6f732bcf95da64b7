"""The model package's vocabulary: the tasks, what a model concludes about a chat, and the
interface every engine implements. Plain values only (no JAX, Keras or Beam), so code that
only moves results around (the pipeline's post-processing, the remote handler, the CLI's
help) imports it cheaply.

`Task` is a `StrEnum`, so a Task compares, hashes, formats and pickles as its plain string
("analyze" == Task.ANALYZE): prompt files, metrics namespaces and stored results keep
their names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from chatlens.contracts import ChatWindow


class Task(StrEnum):
    ANALYZE = "analyze"  # ChatWindow -> WindowAnalysis: sentiment, summary, reply draft where selected
    SENTIMENT = "sentiment"  # ChatWindow -> (P(negative), P(neutral), P(positive))
    SUMMARY = "summary"
    REPLY = "reply"


PROMPT_TASKS = (Task.SENTIMENT, Task.SUMMARY, Task.REPLY)
"""The tasks with a prompt template of their own (prompts/<variant>/<task>.txt)."""


class ModelSpecError(ValueError):
    """The model spec (or its adapter) names nothing that can be loaded."""


REPLY_FOR = ("negative", "all", "none")
"""Which chats get a reply draft: negative ones, all, or none (`--reply-for`)."""
WEIGHTS = ("int8", "bfloat16")
"""How a model tuned by ChatLens holds its weights while serving (`--weights`, `pipeline/model/loading/quantize.py`)."""


def wants_reply(reply_for: str, sentiment: int) -> bool:
    return reply_for == "all" or (reply_for == "negative" and sentiment < 0)


def reply_policies(reply_for: str | Sequence[str], count: int) -> list[str]:
    """One `reply_for` per window: the same policy for all, or one given per window."""
    policies = [reply_for] * count if isinstance(reply_for, str) else list(reply_for)
    if len(policies) != count or not set(policies) <= set(REPLY_FOR):
        raise ValueError(f"reply_for needs {count} values from {REPLY_FOR}, not {reply_for!r}")
    return policies


@dataclass(frozen=True)
class WindowAnalysis:
    """What the model says about one chat window (the pipeline turns it into a ChatInsight)."""

    scores: tuple[float, float, float]  # calibrated P(negative), P(neutral), P(positive)
    summary: str
    model_id: str
    prompt_version: str
    flags: tuple[str, ...] = ()
    reply_draft: str | None = None
    # The model's confidence in its summary and reply, 0-1 (decoding/one_pass.token_confidence); None where the
    # engine measures none. A reply withheld by the offer policy (decoding/offer.py) keeps its confidence.
    summary_confidence: float | None = None
    reply_confidence: float | None = None

    @property
    def sentiment(self) -> int:
        return sentiment_of(self.scores)

    @property
    def confidence(self) -> float:
        return float(max(self.scores))


def sentiment_of(scores: Sequence[float]) -> int:
    """The label (-1, 0, 1) of P(negative), P(neutral), P(positive): the most probable, ties to the more negative."""
    return max(range(3), key=scores.__getitem__) - 1


def chat_of(example: Any) -> ChatWindow:
    """The ChatWindow of a model-stage example: a ChatWindow, or a record with one as `chat`
    (the pipeline's `TaggedWindow`, whose origin rides through RunInference untouched)."""
    return example if isinstance(example, ChatWindow) else example.chat


def text_bytes(batch: Sequence[Any]) -> int:
    """The chat text in a model-stage batch, in UTF-8 bytes: what its handlers report to Beam."""
    return sum(len(m.text.encode("utf-8")) for example in batch for m in chat_of(example).messages)


@runtime_checkable
class Engine(Protocol):
    """What a model handler calls on a loaded model: the prompted engine
    (`decoding/prompted.py`), the one-pass engine (`decoding/one_pass.py`) and the noop
    baseline (`backends/noop/handler.py`) all implement it."""

    model_id: str

    def analyze(self, windows: Sequence[ChatWindow], reply_for: str | Sequence[str] = "none"
                ) -> list[WindowAnalysis]:
        """Sentiment, summary and, where `reply_for` (one policy or one per window) selects it,
        a reply draft per window."""
        ...

    def classify(self, windows: Sequence[ChatWindow]) -> list[tuple[float, float, float]]:
        """Calibrated P(negative), P(neutral), P(positive) per window, nothing generated."""
        ...

    def get_stats(self) -> dict:
        """Counters (compiled programs, batches) for the benchmark and the metrics."""
        ...
