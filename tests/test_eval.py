"""`chatlens eval`: the metrics, and Gemma against the VADER baseline on the labelled set."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chatlens.cli import main
from model_fixtures import model_cache  # noqa: F401
from pipeline.evaluate import load_labelled, scores

DATA = Path(__file__).parent / "data" / "eval_chats.jsonl"


def test_metrics_on_a_known_confusion():
    result = scores([-1, -1, 0, 0, 1, 1], [-1, 0, 0, 0, 1, -1])
    assert result["confusion"] == [[1, 1, 0], [0, 2, 0], [1, 0, 1]]
    assert result["accuracy"] == pytest.approx(4 / 6, abs=1e-4)
    # F1: negative 0.5, neutral 0.8, positive 0.6667
    assert result["macro_f1"] == pytest.approx((0.5 + 0.8 + 2 / 3) / 3, abs=1e-4)


def test_labelled_set_is_balanced_and_valid():
    chats = load_labelled(DATA)
    assert len(chats) >= 80
    assert {label: sum(c.label == label for c in chats) for label in (-1, 0, 1)} == {-1: 32, 0: 32, 1: 32}


@pytest.mark.slow
def test_gemma_beats_vader_on_macro_f1(model_cache, capsys):  # noqa: F811
    assert main(["eval", "--data", str(DATA), "--model-cache", str(model_cache), "--json"]) == 0
    results = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    gemma = results["gemma3-270m/completion"]
    print({name: (r["accuracy"], r["macro_f1"]) for name, r in results.items()})
    assert set(gemma) >= {"accuracy", "macro_f1", "confusion"}
    assert gemma["macro_f1"] > results["vader"]["macro_f1"]
