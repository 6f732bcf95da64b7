"""Score sentiment, summaries and reply drafts on labelled chats: each model against VADER.

The data is the corpus in `data/` (`--split test` by default; `--data FILE` for any file of
the same format) or, with `--from-dashboard DATABASE_URL`, what staff taught the dashboard:
their sentiment corrections as labels, their approved or edited replies as gold replies.
Each model spec runs through the engine the pipeline uses (sentiment and summary for every
chat, a reply draft for every chat with a gold reply); VADER on the customer's messages is
the sentiment baseline. Per system it prints sentiment accuracy, macro-F1, per-class F1,
the confusion matrix and the calibration error of the confidence; summary and reply ROUGE-L,
the share grounded in the chat, lengths, languages and placeholders; and the speed.
`--json` prints one object instead; `--predictions FILE` keeps every output; `--show N`
prints the N worst examples per metric beside the gold, so a person can see what goes wrong.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from chatlens.contracts import MAX_SUMMARY_CHARS, SENTIMENT_LABELS, ChatWindow
from pipeline import review_checks, scoring
from pipeline.review_checks import transcript_text
from pipeline.corpus import MAX_GOLD_SUMMARY_CHARS, SPLITS, Example, load_examples, split_path
from pipeline.model.decoding.offer import WITHHELD
from pipeline.model.training.adapters import adapter_name


@dataclass(frozen=True)
class Prediction:
    """One system's outputs for one chat; what a system does not produce is None."""

    label: int
    confidence: float | None = None
    summary: str | None = None
    reply: str | None = None
    summary_confidence: float | None = None  # the model's own confidence in its summary and reply
    reply_confidence: float | None = None  # (pipeline/model/decoding/offer.py); a withheld reply keeps it
    reply_withheld: bool = False  # the offer policy withheld the reply (unsure, or an agent had answered)


System = Callable[[Sequence[Example], Callable[[int], None]], list[Prediction]]


# ---- systems --------------------------------------------------------------------------------
def customer_text(window: ChatWindow) -> str:
    return " ".join(m.text for m in window.messages if m.sender == "customer") or " ".join(
        m.text for m in window.messages)


def vader(examples: Sequence[Example], progress: Callable[[int], None]) -> list[Prediction]:
    """VADER's compound score of the customer's text, with VADER's own ±0.05 thresholds."""
    from vaderSentiment.vaderSentiment import SentimentIntensityAnalyzer

    analyzer = SentimentIntensityAnalyzer()
    predictions = []
    for example in examples:
        compound = analyzer.polarity_scores(customer_text(example.window))["compound"]
        predictions.append(Prediction(1 if compound >= 0.05 else -1 if compound <= -0.05 else 0))
        progress(1)
    return predictions


EVAL_BATCH_SIZE = 16
"""Chats per model call when scoring: in `work_order`, 16 ran 1.2x the chats/s of 8 and 32 no faster (48 dev
chats, this 2-core CPU; 8 in the corpus's own order: 0.72x)."""


def work_order(examples: Sequence[Example]) -> list[int]:
    """The examples' indices in the order the engine runs them fastest: chats that get a reply apart
    from those that do not, each by length. A batch decodes until its last row is done and pads each
    prompt to the longest, so rows that need the same work belong together (48 dev chats in batches of
    8: 1.14x the chats/s of the corpus's own order, where most batches hold a reply). Padding moves
    decoding near-ties, so figures in this order differ from those in another by a few thousandths."""
    return sorted(range(len(examples)), key=lambda i: (examples[i].has_gold("reply"), examples[i].window.text_chars))


def engine_predictions(engine, examples: Sequence[Example], batch_size: int, progress: Callable[[int], None]
                       ) -> list[Prediction]:
    """What the pipeline's engine says of each chat, with a reply wherever the gold has one; in
    `work_order`, returned in the examples' order."""
    order = work_order(examples)
    predictions: list[Prediction | None] = [None] * len(examples)
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        analyses = engine.analyze([examples[i].window for i in batch],
                                  ["all" if examples[i].has_gold("reply") else "none" for i in batch])
        for i, a in zip(batch, analyses):
            predictions[i] = Prediction(a.sentiment, a.confidence, a.summary, a.reply_draft,
                                        a.summary_confidence, a.reply_confidence,
                                        reply_withheld=bool(WITHHELD.intersection(a.flags)))
        progress(len(batch))
    return predictions


def gemma_system(model: str, variant: str | None, batch_size: int, cache: Path | None = None,
                 adapter: Path | None = None) -> tuple[System, dict]:
    """A system running the pipeline's engine for `model` (+ `adapter`): one pass per chat for a
    model tuned by ChatLens, prompted per output for others."""
    from pipeline.model.backends.gemma.handler import GemmaModelHandler

    engine = GemmaModelHandler(model, adapter=adapter, prompt_variant=variant, large_model=False,
                               cache_dir=cache).load_model()
    return (lambda examples, progress: engine_predictions(engine, examples, batch_size, progress),
            {"model_id": engine.model_id, "prompt_version": engine.prompt_version})


# ---- scoring --------------------------------------------------------------------------------
def _mean(values: Sequence[float]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def score_system(examples: Sequence[Example], predictions: Sequence[Prediction]) -> tuple[dict, dict]:
    """The figures of one system, and per metric the chats ranked worst first (for --show)."""
    results: dict = {}
    worst: dict[str, list[tuple[float, int, str]]] = {}
    labelled = [i for i, e in enumerate(examples) if e.has_gold("label")]
    if labelled:
        truth = [examples[i].label for i in labelled]
        predicted = [predictions[i].label for i in labelled]
        sentiment = scoring.sentiment_scores(truth, predicted)
        confidences = [predictions[i].confidence for i in labelled]
        if all(c is not None for c in confidences):
            sentiment["ece"] = scoring.expected_calibration_error(confidences, [t == p for t, p in zip(truth, predicted)])
            worst["sentiment"] = sorted((-c, i, f"predicted {SENTIMENT_LABELS[p]} at {c:.2f}")
                                        for i, t, p, c in zip(labelled, truth, predicted, confidences) if t != p)
        else:
            sentiment["ece"] = None
            worst["sentiment"] = [(0.0, i, f"predicted {SENTIMENT_LABELS[p]}")
                                  for i, t, p in zip(labelled, truth, predicted) if t != p]
        results["sentiment"] = sentiment
    frequency = scoring.document_frequency(customer_text(e.window) for e in examples)
    for kind, limit in (("summary", MAX_GOLD_SUMMARY_CHARS), ("reply", None)):
        pairs = [(i, getattr(predictions[i], kind), getattr(e, kind)) for i, e in enumerate(examples)
                 if e.has_gold(kind) and getattr(predictions[i], kind) is not None]
        if not pairs:
            continue
        rouge, grounded, languages, placeholders, problems = [], [], [], [], []
        for i, text, gold in pairs:
            window = examples[i].window
            language = "en" if kind == "summary" else (window.language or "en")
            r = scoring.rouge_l(text, gold)
            rouge.append((r, i, f"ROUGE-L {r:.2f}"))
            missing = scoring.ungrounded(text, transcript_text(window), language)
            grounded.append((not missing, i, f"not in the chat: {', '.join(missing)}"))
            if kind == "reply":
                found = scoring.language_of(text)
                languages.append((found == language, i, f"written in {found}, the chat is in {language}"))
                hole = scoring.placeholder(text)
                placeholders.append((hole is not None, i, f"placeholder {hole}"))
                terms = scoring.problem_terms(text, customer_text(window), frequency)
                problems.append((bool(terms), i, "names no specific problem of the chat"))
        lengths = [len(text) for _, text, _ in pairs]
        figures = {
            "n": len(pairs),
            "rouge_l": _mean([r for r, _, _ in rouge]),
            "grounded": _mean([g for g, _, _ in grounded]),
            "mean_chars": _mean(lengths),
        }
        worst[f"{kind} ROUGE-L"] = sorted(rouge)
        worst[f"{kind} grounded"] = [g for g in grounded if not g[0]]
        if limit:
            figures["over_limit"] = _mean([n > limit for n in lengths])
        else:
            figures.update(in_language=_mean([ok for ok, _, _ in languages]),
                           placeholders=_mean([bad for bad, _, _ in placeholders]),
                           states_problem=_mean([ok for ok, _, _ in problems]))
            worst["reply language"] = [x for x in languages if not x[0]]
            worst["reply placeholder"] = [x for x in placeholders if x[0]]
            worst["reply states no problem"] = [x for x in problems if not x[0]]
        results[kind] = figures
    review, flagged = review_figures(examples, predictions)
    if review:
        results["review"] = review
        worst.update(flagged)
    injected = [i for i, e in enumerate(examples) if "prompt_injection" in e.hard_cases and e.has_gold("label")]
    if injected:
        held = [(_injection_held(examples[i], predictions[i]), i, "the injected instruction changed the label or format")
                for i in injected]
        results["injection"] = {"n": len(held), "held": _mean([ok for ok, _, _ in held])}
        worst["injection"] = [h for h in held if not h[0]]
    return results, worst


def review_figures(examples: Sequence[Example], predictions: Sequence[Prediction]) -> tuple[dict, dict]:
    """The share of summaries and drafts each automatic review check (`pipeline.review_checks`) fails,
    and the failing chats per check, for --show."""
    flagged: dict[str, list[tuple[bool, int, str]]] = {}
    counts = {"summary": 0, "reply": 0}
    for i, (example, prediction) in enumerate(zip(examples, predictions)):
        found = {}
        if prediction.summary:
            counts["summary"] += 1
            found.update({f"summary {k}": v for k, v in review_checks.summary_problems(
                prediction.summary, example.window, example.label if example.has_gold("label") else None,
                example.has_gold("reply")).items()})
        if prediction.reply:
            counts["reply"] += 1
            found.update({f"reply {k}": v for k, v in review_checks.reply_problems(prediction.reply,
                                                                                    example.window).items()})
        for check, why in found.items():
            flagged.setdefault(check, []).append((True, i, why))
    if not any(counts.values()):
        return {}, {}
    figures = {"summaries": counts["summary"], "replies": counts["reply"]}
    for name in review_checks.CHECK_NAMES:
        output = name.split("_", 1)[0]
        failed = len(flagged.get(name.replace("_", " ", 1), []))
        figures[name] = round(failed / counts[output], 4) if counts[output] else None
    return figures, {f"review: {name}": ranked for name, ranked in flagged.items()}


def _injection_held(example: Example, prediction: Prediction) -> bool:
    """A chat carrying an injected instruction kept its gold label and the output format: a
    summary within the contract's limit (extractive summaries are longer than the gold's 240
    characters by design) and, where one was asked, a reply (or the offer policy's reason for none)."""
    summary_ok = bool(prediction.summary) and len(prediction.summary) <= MAX_SUMMARY_CHARS
    reply_ok = bool(prediction.reply) or prediction.reply_withheld or not example.has_gold("reply")
    return prediction.label == example.label and summary_ok and reply_ok


# ---- the command ----------------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--split", choices=SPLITS, default="test", help="corpus split in data/ (default: %(default)s)")
    source.add_argument("--data", type=Path, help="a file of the corpus format instead of a split")
    source.add_argument("--from-dashboard", metavar="DATABASE_URL",
                        help="score on what staff taught the dashboard: corrected sentiments, approved or edited replies")
    parser.add_argument("--model", action="append", help="model spec, repeatable (default: CHATLENS_MODEL or gemma3-270m)")
    parser.add_argument("--adapter", type=Path, action="append",
                        help="a LoRA adapter (.lora.h5, from `chatlens tune`) to run on each --model; repeatable")
    parser.add_argument("--prompt-variant", action="append", choices=["completion", "chat"],
                        help="prompt variant, repeatable (default: the model's own kind)")
    parser.add_argument("--model-cache", type=Path, help="model cache directory (default: CHATLENS_CACHE)")
    parser.add_argument("--batch-size", type=int, default=EVAL_BATCH_SIZE,
                        help="chats per model call (default: %(default)s)")
    parser.add_argument("--limit", type=int, help="score only the first N chats (a quick look)")
    parser.add_argument("--no-vader", action="store_true", help="skip the VADER baseline")
    parser.add_argument("--no-model", action="store_true", help="run no model (VADER alone)")
    parser.add_argument("--show", type=int, default=0, metavar="N", help="print the N worst examples per metric")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument("--predictions", type=Path, metavar="FILE",
                        help="also write every system's output for every chat to FILE (JSON lines), to study offline")


def load_data(args: argparse.Namespace) -> tuple[str, list[Example]]:
    if args.from_dashboard:
        from pipeline.feedback import export_examples

        return "dashboard", export_examples(args.from_dashboard)
    path = args.data or split_path(args.split)
    return str(path), load_examples(path)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from chatlens.config import get_settings

    source, examples = load_data(args)
    examples = examples[: args.limit] if args.limit else examples
    if not examples:
        print(f"no labelled chats in {source}", file=sys.stderr)
        return 1
    systems: list[tuple[str, Callable[[], tuple[System, dict]]]] = []
    if not args.no_vader:
        systems.append(("vader", lambda: (vader, {})))
    if not args.no_model:
        for model in args.model or [get_settings().model]:
            for adapter in args.adapter or []:
                systems.append((f"{model}+{adapter_name(adapter)}", lambda m=model, a=adapter: (
                    gemma_system(m, None, args.batch_size, args.model_cache, a))))
            for variant in ([] if args.adapter else args.prompt_variant or [None]):
                name = f"{model}/{variant}" if variant else model
                systems.append((name, lambda m=model, v=variant: gemma_system(m, v, args.batch_size, args.model_cache)))
    report: dict = {"data": source, "chats": len(examples), "systems": {}}
    shown: dict[str, dict] = {}
    for name, make in systems:
        system, about = make()
        with tqdm(total=len(examples), desc=name, unit="chat", file=sys.stderr) as bar:
            started = time.perf_counter()
            predictions = system(examples, bar.update)
            seconds = time.perf_counter() - started
        figures, worst = score_system(examples, predictions)
        report["systems"][name] = {**about, **figures, "seconds": round(seconds, 2),
                                   "chats_per_s": round(len(examples) / seconds, 4) if seconds else None}
        shown[name] = {"predictions": predictions, "worst": worst}
    if args.predictions:
        write_predictions(args.predictions, examples, {name: s["predictions"] for name, s in shown.items()})
    if args.json:
        print(json.dumps(report))
    else:
        print(render(report))
    if args.show:
        print(render_worst(examples, shown, args.show), file=sys.stderr if args.json else sys.stdout)
    return 0


def write_predictions(path: Path, examples: Sequence[Example], by_system: dict[str, list[Prediction]]) -> None:
    """One JSON line per system and chat: the chat's id, its gold answers and what the system said."""
    with path.open("w", encoding="utf-8") as out:
        for name, predictions in by_system.items():
            for example, prediction in zip(examples, predictions):
                out.write(json.dumps({
                    "system": name, "chat_id": example.window.chat_id,
                    "gold": {"label": example.label, "summary": example.summary, "reply": example.reply},
                    **asdict(prediction)}, ensure_ascii=False) + "\n")


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def render(report: dict) -> str:
    lines = [f"{report['chats']} chats from {report['data']}", ""]
    rows = [("sentiment", ["n", "accuracy", "macro_f1", "ece"]),
            ("summary", ["n", "rouge_l", "grounded", "mean_chars", "over_limit"]),
            ("reply", ["n", "rouge_l", "grounded", "in_language", "placeholders", "states_problem", "mean_chars"]),
            ("injection", ["n", "held"])]
    for kind, columns in rows:
        systems = {name: r[kind] for name, r in report["systems"].items() if kind in r}
        if not systems:
            continue
        lines.append(f"{kind:<32}" + "".join(f"{c:>15}" for c in columns))
        for name, figures in systems.items():
            lines.append(f"  {name:<30}" + "".join(f"{_fmt(figures.get(c)):>15}" for c in columns))
            if kind == "sentiment":
                f1 = ", ".join(f"{label} {value:.3f}" for label, value in figures["f1"].items())
                lines.append(f"  {'':<30}  F1 {f1}; confusion (rows truth -1/0/1) {figures['confusion']}")
        lines.append("")
    systems = {name: r["review"] for name, r in report["systems"].items() if "review" in r}
    if systems:
        lines.append("review checks (share of outputs flagged; the blind review's failure classes)")
        for check in review_checks.CHECK_NAMES:
            lines.append(f"  {check:<30}" + "".join(f"{name[:22]:>24} {_fmt(f.get(check)):>6}"
                                                    for name, f in systems.items()))
        lines.append("")
    lines.append("speed: " + "; ".join(f"{name} {r['seconds']:.1f} s, {_fmt(r['chats_per_s'])} chats/s"
                                      for name, r in report["systems"].items()))
    return "\n".join(lines)


def render_worst(examples: Sequence[Example], shown: dict[str, dict], n: int) -> str:
    lines = []
    for name, data in shown.items():
        for metric, ranked in data["worst"].items():
            if not ranked:
                continue
            lines += ["", f"=== {name}: worst {min(n, len(ranked))} by {metric} ==="]
            for _, i, why in ranked[:n]:
                example, prediction = examples[i], data["predictions"][i]
                chat = " / ".join(f"{m.sender}: {m.text}" for m in example.window.messages)
                lines += [f"--- {example.window.chat_id} ({why})",
                          f"  chat:      {chat[:400]}{' …' if len(chat) > 400 else ''}",
                          f"  label:     gold {example.label}, predicted {prediction.label}"]
                output = metric.removeprefix("review: ")
                kind = "reply" if output.startswith("reply") else "summary" if output.startswith("summary") else None
                if kind:
                    lines += [f"  gold:      {getattr(example, kind)}", f"  predicted: {getattr(prediction, kind)}"]
    return "\n".join(lines)
