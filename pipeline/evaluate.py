"""Measure sentiment quality on labelled chats: each model and prompt variant against VADER.

The data file holds one ChatWindow per line plus a `label` field (-1, 0 or 1). Gemma runs
through the same GemmaModelHandler as the streaming pipeline (task 'sentiment': one scoring
pass per batch); the VADER lexicon (`vadersentiment`) on the customer's messages is the
classic baseline to beat. Prints accuracy, macro-F1 and the confusion matrix per system, or
one JSON object with `--json`.
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
    """A predictor running GemmaModelHandler's sentiment task, batch by batch."""
    from pipeline.model.handler import GemmaModelHandler

    handler = GemmaModelHandler(model, task="sentiment", prompt_variant=variant, large_model=False, cache_dir=cache)
    engine = handler.load_model()

    def predict(windows: Sequence[ChatWindow]) -> list[int]:
        labels = []
        for start in range(0, len(windows), batch_size):
            batch = windows[start : start + batch_size]
            for result in handler.run_inference(batch, engine):
                probabilities = result.inference
                labels.append(max(range(3), key=probabilities.__getitem__) - 1)
            progress(len(batch))
        return labels

    predict.prompt_version = engine.prompts.version  # type: ignore[attr-defined]
    predict.model_id = engine.model_id  # type: ignore[attr-defined]
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
                predicted = predict(windows)
            name = f"{model}/{predict.prompt_version.rsplit('/', 1)[-1]}"
            results[name] = {**scores(truth, predicted), "model_id": predict.model_id,
                             "prompt_version": predict.prompt_version}
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
