"""WindowAnalysis: what the model concluded about one chat window, as plain values.

Kept apart from the engine so that code which only moves results around (the pipeline's
post-processing, the remote handler) does not import JAX and Keras.
"""

from __future__ import annotations

from dataclasses import dataclass


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
