"""A tuned model's label calibration: a per-label bias and a temperature, fitted on dev.

The tuned Gemma reads its label from the three label tokens' logits at the answer start.
Trained with plain cross-entropy on a corpus where neutral is the safe guess, it leans to
neutral: the raw argmax misses most unhappy customers. The calibration is

    P(label) = softmax((logits + bias) / temperature)

The bias moves the decision (chosen for dev macro-F1); the temperature, which cannot
change the argmax, makes the confidence honest (chosen for dev log-loss). Both are fitted
by `chatlens tune` on dev only, stored in the adapter's manifest and applied by the engine.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# numpy is imported where used: this module is read when the CLI starts (pipeline.model.loading.sources).
BIAS_GRID = tuple(round(-4.0 + 0.1 * i, 2) for i in range(81))  # neutral's stays 0: only differences count
TEMPERATURE_GRID = tuple(round(0.25 * math.exp(math.log(32.0) * i / 60), 4) for i in range(61))  # 0.25 .. 8
NEAR_BEST = 0.005  # macro-F1 within this of the best counts as a tie; the smallest bias wins it


@dataclass(frozen=True)
class LabelCalibration:
    """Bias per label (negative, neutral, positive) and one temperature."""

    bias: tuple[float, float, float] = (0.0, 0.0, 0.0)
    temperature: float = 1.0

    def probabilities(self, logits):
        """Calibrated label probabilities (numpy), rows of `logits` (n, 3) in label order."""
        import numpy as np

        z = (np.asarray(logits, np.float64) + np.asarray(self.bias)) / self.temperature
        z -= z.max(axis=-1, keepdims=True)
        e = np.exp(z)
        return e / e.sum(axis=-1, keepdims=True)

    def to_json(self) -> dict:
        return {"bias": list(self.bias), "temperature": self.temperature}

    @classmethod
    def from_json(cls, data: Mapping | None) -> LabelCalibration:
        if not data:
            return cls()
        return cls(tuple(float(b) for b in data["bias"]), float(data["temperature"]))  # type: ignore[arg-type]


def fit(logits, gold: Sequence[int]) -> LabelCalibration:
    """The calibration that maximises macro-F1 on these chats (ties: the smallest bias), then
    minimises their log-loss with that decision rule. `gold` holds -1/0/1 labels."""
    import numpy as np

    logits = np.asarray(logits, np.float64)
    truth = np.asarray(gold) + 1
    best: list[tuple[float, float, tuple[float, float, float]]] = []
    for negative, positive in itertools.product(BIAS_GRID, BIAS_GRID):
        bias = (float(negative), 0.0, float(positive))
        score = macro_f1(truth, np.argmax(logits + bias, axis=-1))
        best.append((score, -abs(negative) - abs(positive), bias))
    top = max(score for score, _, _ in best)
    _, _, bias = max(b for b in best if b[0] >= top - NEAR_BEST)
    losses = [_log_loss(LabelCalibration(bias, float(t)).probabilities(logits), truth) for t in TEMPERATURE_GRID]
    return LabelCalibration(bias, TEMPERATURE_GRID[int(np.argmin(losses))])


def macro_f1(truth, predicted, classes: int = 3) -> float:
    import numpy as np

    scores = []
    for c in range(classes):
        tp = np.sum((predicted == c) & (truth == c))
        denominator = np.sum(predicted == c) + np.sum(truth == c)
        scores.append(2 * tp / denominator if denominator else 0.0)
    return float(np.mean(scores))


def _log_loss(probabilities, truth) -> float:
    import numpy as np

    return float(-np.mean(np.log(np.clip(probabilities[np.arange(len(truth)), truth], 1e-12, None))))
