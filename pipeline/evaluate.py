"""Measure sentiment quality on labelled chats: each model and prompt variant against VADER.

The data file holds one ChatWindow per line plus a `label` field (-1, 0 or 1). Gemma runs
through the same GemmaModelHandler as the streaming pipeline (task 'sentiment': one scoring
pass per batch); the VADER lexicon (`vadersentiment`) on the customer's messages is the
classic baseline to beat. Prints accuracy, macro-F1 and the confusion matrix per system, or
one JSON object with `--json`. `--cross-validate` adds, per Gemma system, the figures on
held-out chats with the calibration strength chosen on the other folds: the honest number
when the strength was tuned on the same set.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from chatlens.contracts import ChatWindow, ContractError, parse_window

LABELS = (-1, 0, 1)
NAMES = {-1: "negative", 0: "neutral", 1: "positive"}
CV_STRENGTHS = (0.0, 0.25, 0.5, 0.75, 1.0)  # calibration strengths tried by --cross-validate


@dataclass(frozen=True)
class LabelledChat:
    window: ChatWindow
    label: int


def load_labelled(path: Path) -> list[LabelledChat]:
    """Labelled chats from JSON Lines; a bad line stops the run with its line number."""
    chats = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        record = json.loads(line)
        label = record.pop("label", None)
        if label not in LABELS:
            raise ContractError(f"{path}:{number}: label must be -1, 0 or 1, not {label!r}")
        try:
            chats.append(LabelledChat(parse_window(json.dumps(record)), label))
        except ContractError as error:
            raise ContractError(f"{path}:{number}: {error}") from None
    return chats


def scores(truth: Sequence[int], predicted: Sequence[int]) -> dict:
    """Accuracy, macro-F1 and the confusion matrix (rows: truth, columns: prediction)."""
    confusion = [[0, 0, 0] for _ in LABELS]
    for t, p in zip(truth, predicted, strict=True):
        confusion[t + 1][p + 1] += 1
    f1s = []
    for k in range(3):
        true_positive = confusion[k][k]
        predicted_k = sum(row[k] for row in confusion)
        actual_k = sum(confusion[k])
        precision = true_positive / predicted_k if predicted_k else 0.0
        recall = true_positive / actual_k if actual_k else 0.0
        f1s.append(2 * precision * recall / (precision + recall) if precision + recall else 0.0)
    total = sum(map(sum, confusion))
    return {
        "n": total,
        "accuracy": round(sum(confusion[k][k] for k in range(3)) / total, 4) if total else 0.0,
        "macro_f1": round(sum(f1s) / 3, 4),
        "f1": {NAMES[label]: round(f, 4) for label, f in zip(LABELS, f1s)},
        "confusion": confusion,
    }


def recalibrated(probabilities: Sequence[Sequence[float]], bias: Sequence[float], used: float, strength: float
                 ) -> list[int]:
    """Labels at another calibration strength: p ~ raw / bias**used, so raw / bias**s ~ p * bias**(used - s)."""
    labels = []
    for row in probabilities:
        weighted = [p * b ** (used - strength) for p, b in zip(row, bias)]
        labels.append(max(range(3), key=weighted.__getitem__) - 1)
    return labels


def cross_validate_strength(probabilities: Sequence[Sequence[float]], truth: Sequence[int], bias: Sequence[float],
                            used: float, strengths: Sequence[float] = CV_STRENGTHS, folds: int = 2) -> dict:
    """Held-out scores: each fold's labels use the strength with the best macro-F1 on the other folds.

    Folds are stratified (the i-th chat of each label goes to fold i mod `folds`), so every
    fold keeps the label balance.
    """
    seen: dict[int, int] = {}
    fold_of = []
    for label in truth:
        fold_of.append(seen.get(label, 0) % folds)
        seen[label] = seen.get(label, 0) + 1
    predicted = [0] * len(truth)
    chosen = []
    for fold in range(folds):
        train = [i for i, f in enumerate(fold_of) if f != fold]
        test = [i for i, f in enumerate(fold_of) if f == fold]

        def train_f1(strength: float) -> float:
            labels = recalibrated([probabilities[i] for i in train], bias, used, strength)
            return scores([truth[i] for i in train], labels)["macro_f1"]

        best = max(strengths, key=train_f1)
        chosen.append(best)
        for i, label in zip(test, recalibrated([probabilities[i] for i in test], bias, used, best)):
            predicted[i] = label
    return {**scores(truth, predicted), "strengths": chosen}


def vader_predict(windows: Sequence[ChatWindow]) -> list[int]:
    """VADER's compound score of the customer's text, with VADER's own ±0.05 thresholds."""
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    analyzer = SentimentIntensityAnalyzer()
    predictions = []
    for window in windows:
        text = " ".join(m.text for m in window.messages if m.sender == "customer") or " ".join(
            m.text for m in window.messages)
        compound = analyzer.polarity_scores(text)["compound"]
        predictions.append(1 if compound >= 0.05 else -1 if compound <= -0.05 else 0)
    return predictions


def gemma_predictor(model: str, variant: str | None, batch_size: int, progress, cache: Path | None = None
                    ) -> Callable:
    """A predictor running GemmaModelHandler's sentiment task, batch by batch.

    It carries the engine's calibration (label bias, strength used) for --cross-validate.
    """
    from pipeline.model.handler import GemmaModelHandler

    handler = GemmaModelHandler(model, task="sentiment", prompt_variant=variant, large_model=False, cache_dir=cache)
    engine = handler.load_model()

    def predict(windows: Sequence[ChatWindow]) -> list[tuple[float, float, float]]:
        """Calibrated probabilities (negative, neutral, positive) per window."""
        probabilities = []
        for start in range(0, len(windows), batch_size):
            batch = windows[start : start + batch_size]
            probabilities += [result.inference for result in handler.run_inference(batch, engine)]
            progress(len(batch))
        return probabilities

    predict.prompt_version = engine.prompts.version  # type: ignore[attr-defined]
    predict.model_id = engine.model_id  # type: ignore[attr-defined]
    predict.calibration = (engine._calibration.tolist(), engine.config.calibration_strength)  # type: ignore[attr-defined]
    return predict


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", type=Path, default=Path("tests/data/eval_chats.jsonl"),
                        help="labelled ChatWindows, JSON Lines with a 'label' field (default: %(default)s)")
    parser.add_argument("--model", action="append", help="model spec, repeatable (default: CHATLENS_MODEL or gemma3-270m)")
    parser.add_argument("--prompt-variant", action="append", choices=["completion", "chat"],
                        help="prompt variant, repeatable (default: the model's own kind)")
    parser.add_argument("--model-cache", type=Path, help="model cache directory (default: CHATLENS_CACHE)")
    parser.add_argument("--batch-size", type=int, default=8, help="chats per model call (default: %(default)s)")
    parser.add_argument("--no-vader", action="store_true", help="skip the VADER baseline")
    parser.add_argument("--cross-validate", action="store_true",
                        help="also report each Gemma system on held-out chats, the calibration strength "
                             f"(one of {', '.join(map(str, CV_STRENGTHS))}) chosen on the other half")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from chatlens.config import get_settings

    chats = load_labelled(args.data)
    windows = [c.window for c in chats]
    truth = [c.label for c in chats]
    results: dict[str, dict] = {}
    if not args.no_vader:
        results["vader"] = scores(truth, vader_predict(windows))
    for model in args.model or [get_settings().model]:
        for variant in args.prompt_variant or [None]:
            with tqdm(total=len(windows), desc=f"{model} {variant or ''}".strip(), file=sys.stderr,
                      disable=args.json and not sys.stderr.isatty()) as bar:
                predict = gemma_predictor(model, variant, args.batch_size, bar.update, args.model_cache)
                probabilities = predict(windows)
            name = f"{model}/{predict.prompt_version.rsplit('/', 1)[-1]}"
            bias, used = predict.calibration
            results[name] = {**scores(truth, recalibrated(probabilities, bias, used, used)),
                             "model_id": predict.model_id, "prompt_version": predict.prompt_version}
            if args.cross_validate:
                results[f"{name} (held out)"] = cross_validate_strength(probabilities, truth, bias, used)
    if args.json:
        print(json.dumps(results))
    else:
        print(render_table(results))
    return 0


def render_table(results: dict[str, dict]) -> str:
    lines = [f"{'system':<40} {'n':>4} {'accuracy':>9} {'macro-F1':>9}   confusion (rows truth -1/0/1)"]
    for name, r in results.items():
        lines.append(f"{name:<40} {r['n']:>4} {r['accuracy']:>9.3f} {r['macro_f1']:>9.3f}   {r['confusion']}")
    return "\n".join(lines)
