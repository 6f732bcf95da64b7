"""WindowAnalysis: what the model concluded about one chat window, as plain values.

Kept apart from the engine so that code which only moves results around (the pipeline's
post-processing, the remote handler) does not import JAX and Keras.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chatlens.contracts import ChatWindow


@dataclass(frozen=True)
class WindowAnalysis:
    """What the model says about one chat window (the pipeline turns it into a ChatInsight)."""

    scores: tuple[float, float, float]  # calibrated P(negative), P(neutral), P(positive)
    summary: str
    model_id: str
    prompt_version: str
    flags: tuple[str, ...] = ()
    reply_draft: str | None = None

    @property
    def sentiment(self) -> int:
        return max(range(3), key=self.scores.__getitem__) - 1

    @property
    def confidence(self) -> float:
        return float(max(self.scores))


def window_of(element: Any) -> ChatWindow:
    """The ChatWindow inside a model-stage example: a window, or a tuple holding one.

    Examples are a task's input, optionally tagged: `(tag, input)` carries a tag (the
    pipeline's message origin) through RunInference untouched.
    """
    if isinstance(element, ChatWindow):
        return element
    for part in element if isinstance(element, tuple) else ():
        try:
            return window_of(part)
        except TypeError:
            continue
    raise TypeError(f"no ChatWindow in {type(element).__name__}")


def reply_input(element: Any) -> tuple[ChatWindow, WindowAnalysis]:
    """The (ChatWindow, WindowAnalysis) pair of a 'reply' example, tagged or not."""
    if isinstance(element, tuple) and len(element) == 2:
        if isinstance(element[0], ChatWindow) and isinstance(element[1], WindowAnalysis):
            return element
        if isinstance(element[1], tuple):
            return reply_input(element[1])
    raise TypeError("task 'reply' takes (ChatWindow, WindowAnalysis) pairs, optionally as (tag, pair)")
