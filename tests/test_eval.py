"""`chatlens eval`: the metrics, and Gemma against the VADER baseline on the labelled set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chatlens.cli import main
from model_fixtures import model_cache  # noqa: F401
from pipeline.evaluate import cross_validate_strength, load_labelled, recalibrated, scores

DATA = Path(__file__).parent / "data" / "eval_chats.jsonl"


def test_metrics_on_a_known_confusion():
    result = scores([-1, -1, 0, 0, 1, 1], [-1, 0, 0, 0, 1, -1])
    assert result["confusion"] == [[1, 1, 0], [0, 2, 0], [1, 0, 1]]
    assert result["accuracy"] == pytest.approx(4 / 6, abs=1e-4)
    # F1: negative 0.5, neutral 0.8, positive 0.6667
    assert result["macro_f1"] == pytest.approx((0.5 + 0.8 + 2 / 3) / 3, abs=1e-4)


def test_recalibration_moves_labels_away_from_the_biased_one():
    bias = [0.2, 0.2, 0.6]  # the prompt leans positive
    raw = [[0.3, 0.25, 0.45]]
    assert recalibrated(raw, bias, used=0.0, strength=0.0) == [1]
    assert recalibrated(raw, bias, used=0.0, strength=1.0) == [-1]  # 1.5 vs 1.25 vs 0.75
    # Recalibrating from strength 1 back to 0 recovers the raw argmax.
    calibrated = [[p / b for p, b in zip(raw[0], bias)]]
    assert recalibrated(calibrated, bias, used=1.0, strength=0.0) == [1]


def test_cross_validation_picks_the_strength_on_the_other_fold():
    bias = [0.2, 0.2, 0.6]
    # Raw probabilities that are right only once the positive lean is removed (strength 1).
    raw = {-1: [0.3, 0.1, 0.6], 0: [0.1, 0.3, 0.6], 1: [0.05, 0.05, 0.9]}
    truth = [-1, 0, 1] * 4
    result = cross_validate_strength([raw[t] for t in truth], truth, bias, used=0.0)
    assert len(result["strengths"]) == 2 and min(result["strengths"]) > 0 and result["accuracy"] == 1.0
    uncalibrated = scores(truth, recalibrated([raw[t] for t in truth], bias, used=0.0, strength=0.0))
    assert uncalibrated["accuracy"] < 1.0


def test_labelled_set_is_balanced_and_valid():
    chats = load_labelled(DATA)
    assert len(chats) >= 80
    assert {label: sum(c.label == label for c in chats) for label in (-1, 0, 1)} == {-1: 32, 0: 32, 1: 32}


@pytest.mark.slow
def test_gemma_beats_vader_on_macro_f1(model_cache, capsys):  # noqa: F811
    assert main(["eval", "--data", str(DATA), "--model-cache", str(model_cache), "--json", "--cross-validate"]) == 0
    results = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    gemma = results["gemma3-270m/completion"]
    print({name: (r["accuracy"], r["macro_f1"], r.get("strengths")) for name, r in results.items()})
    assert set(gemma) >= {"accuracy", "macro_f1", "confusion"}
    assert gemma["macro_f1"] > results["vader"]["macro_f1"]
    held_out = results["gemma3-270m/completion (held out)"]
    assert held_out["n"] == gemma["n"] and len(held_out["strengths"]) == 2
