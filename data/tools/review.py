"""Blind usability review (`quality-rubric.md`): batches for reviewers, then the tally.

`prepare` turns `chatlens eval --predictions FILE` output into review batches: one item per
summary or reply draft, each shown beside its chat alone, in a random order, under an opaque id,
never saying which system wrote it. `--with-gold` mixes the corpus's gold answers (as they are
now, not as the predictions file recorded them) in as one more system,
so a reviewer's strictness can be read off the gold's pass rate. The key (item -> system, chat,
output) goes to a separate file that reviewers are not given.

`tally` joins the reviewers' verdicts with the key and prints, per system and output, how many
items were judged, how many and what share were `ok`, the problems by kind and, where two
reviewers judged the same item, how often they agreed.

`offer` reads the model's confidence in each judged output (`chatlens eval --predictions` keeps
it) beside the verdicts: for each threshold, what share of the outputs would be offered and what
share of those offered the review passed, and the lowest threshold at which the offered ones pass
at the target rate (pipeline/model/decoding/offer.py: below it a draft is withheld, a summary flagged).

    .venv/bin/python data/tools/review.py prepare --predictions dev.preds.jsonl --split dev --with-gold --out review/
    # give review/batch-*.md to reviewers; each writes review/verdicts-<name>.jsonl
    .venv/bin/python data/tools/review.py tally review/
    .venv/bin/python data/tools/review.py offer review/ --predictions dev.preds.jsonl --system gemma3-270m
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipeline.corpus import SPLITS, load_examples, load_split, read_jsonl  # noqa: E402

SUMMARY_PROBLEMS = ("invented fact", "wrong fact", "who said what swapped", "misses the main problem", "garbled",
                    "wrong status")
REPLY_PROBLEMS = ("invented fact or commitment", "wrong problem", "third person", "wrong language", "tone",
                  "garbled")
INSTRUCTIONS = f"""# Review batch {{batch}}

You are a support team lead. For each item below you see a customer conversation and ONE text
written about it: a **summary** (for an agent who glances at it) or a **reply draft** (the next
message the agent would send). You do not know who wrote it. Judge each item on its own.

Summary: `ok` only if an agent could rely on it: every fact it states is in the conversation (no
invented events, numbers, causes or agent actions; who said what is right), it names the
customer's main problem or request, and any status it gives is right. Awkward wording is fine;
anything misleading is not. Problems: {" · ".join(SUMMARY_PROBLEMS)}.

Reply draft: `ok` only if a careful agent would send it as is or after light edits: it answers
the customer's actual problem in the customer's language, speaking to them ("you"), not about
them; it promises or claims nothing the conversation does not support (no invented deadlines,
refunds, amounts, or actions already taken); it offers a next step the agent can really take now,
or asks for the one missing detail; it reads naturally. Problems: {" · ".join(REPLY_PROBLEMS)}.

Write one JSON line per item to your verdicts file:
{{{{"item": "<id>", "verdict": "ok" or "not ok", "problems": [...], "note": "<one short sentence>"}}}}
"""


def load_predictions(path: Path, system: str | None) -> list[dict]:
    return [r for r in read_jsonl(path) if system is None or r["system"] == system]


def items_of(rows: list[dict], examples: dict, with_gold: bool) -> list[dict]:
    """One item per output to judge: (system, chat, kind, text). The gold is the corpus's as it is now."""
    items, gold_done = [], set()
    for row in rows:
        example = examples.get(row["chat_id"])
        if example is None:
            continue
        for kind in ("summary", "reply"):
            if row.get(kind):
                items.append({"system": row["system"], "chat_id": row["chat_id"], "kind": kind, "text": row[kind]})
            gold = getattr(example, kind)
            if with_gold and gold and (row["chat_id"], kind) not in gold_done:
                gold_done.add((row["chat_id"], kind))
                items.append({"system": "gold", "chat_id": row["chat_id"], "kind": kind, "text": gold})
    return items


def render_item(item_id: str, item: dict, window) -> str:
    lines = [f"## {item_id}", "", f"Conversation (language: {window.language or '?'}):", ""]
    lines += [f"> **{m.sender}:** {m.text}" for m in window.messages]
    title = "Summary" if item["kind"] == "summary" else "Reply draft"
    return "\n".join(lines + ["", f"**{title} to judge:**", "", f"    {item['text']}", ""])


def prepare(args: argparse.Namespace) -> int:
    examples = {e.window.chat_id: e for e in (load_split(args.split) if args.split else load_examples(args.data))}
    items = items_of(load_predictions(args.predictions, args.system), examples, args.with_gold)
    rng = random.Random(args.seed)
    rng.shuffle(items)
    if args.limit:
        items = items[: args.limit]
    args.out.mkdir(parents=True, exist_ok=True)
    key = {}
    for start in range(0, len(items), args.batch_size):
        number = start // args.batch_size + 1
        parts = [INSTRUCTIONS.format(batch=number)]
        for offset, item in enumerate(items[start : start + args.batch_size]):
            item_id = f"b{number:02d}-{offset + 1:03d}"
            key[item_id] = {k: item[k] for k in ("system", "chat_id", "kind")}
            parts.append(render_item(item_id, item, examples[item["chat_id"]].window))
        (args.out / f"batch-{number:02d}.md").write_text("\n".join(parts), encoding="utf-8")
    (args.out / "key.json").write_text(json.dumps(key, indent=1), encoding="utf-8")
    print(f"{len(items)} items in {(len(items) + args.batch_size - 1) // args.batch_size} batches under {args.out} "
          f"(key.json is for the tally, not for reviewers)")
    return 0


def tally_verdicts(key: dict, verdicts: dict[str, list[dict]]) -> dict:
    """Per (system, kind): judged, ok, share ok, problems by kind; and reviewer agreement."""
    table: dict = defaultdict(lambda: {"judged": 0, "ok": 0, "problems": Counter()})
    by_item: dict[str, list[bool]] = defaultdict(list)
    for reviewer, rows in verdicts.items():
        for row in rows:
            if row["item"] not in key:
                raise SystemExit(f"{reviewer}: unknown item {row['item']}")
            about = key[row["item"]]
            cell = table[(about["system"], about["kind"])]
            ok = row["verdict"].strip().lower() == "ok"
            cell["judged"] += 1
            cell["ok"] += ok
            cell["problems"].update(p.strip().lower() for p in row.get("problems") or [] if not ok)
            by_item[row["item"]].append(ok)
    twice = [v for v in by_item.values() if len(v) >= 2]
    return {"cells": {f"{system} {kind}": {**cell, "share_ok": round(cell["ok"] / cell["judged"], 3),
                                            "problems": dict(cell["problems"].most_common())}
                      for (system, kind), cell in sorted(table.items())},
            "agreement": {"items": len(twice),
                          "share": round(sum(len(set(v)) == 1 for v in twice) / len(twice), 3) if twice else None}}


def load_review(folder: Path) -> tuple[dict, dict[str, list[dict]]]:
    """The key `prepare` wrote and each reviewer's verdicts (verdicts-<name>.jsonl), by name."""
    key = json.loads((folder / "key.json").read_text(encoding="utf-8"))
    verdicts = {path.stem: read_jsonl(path) for path in sorted(folder.glob("verdicts-*.jsonl"))}
    return key, verdicts


def tally(args: argparse.Namespace) -> int:
    key, verdicts = load_review(args.dir)
    report = tally_verdicts(key, verdicts)
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    for name, cell in report["cells"].items():
        problems = ", ".join(f"{p} {n}" for p, n in cell["problems"].items()) or "-"
        print(f"{name:<40} {cell['ok']:>4} of {cell['judged']:<4} ok ({cell['share_ok']:.0%}); problems: {problems}")
    agreement = report["agreement"]
    if agreement["items"]:
        print(f"reviewers agreed on {agreement['share']:.0%} of {agreement['items']} items judged twice")
    return 0


def judged(key: dict, verdicts: dict[str, list[dict]]) -> dict[str, bool]:
    """item -> ok, where every reviewer who judged it said ok."""
    by_item: dict[str, list[bool]] = defaultdict(list)
    for rows in verdicts.values():
        for row in rows:
            by_item[row["item"]].append(row["verdict"].strip().lower() == "ok")
    return {item: all(oks) for item, oks in by_item.items() if item in key}


def offer_curve(key: dict, verdicts: dict[str, list[dict]], predictions: list[dict], system: str, kind: str,
                target: float, least: int = 10) -> dict:
    """For `system`'s `kind` outputs: each judged one's confidence and verdict, the share offered and the
    share of offered passing at each threshold, how well confidence ranks passes above failures
    (`auc`: the chance a passed output is more confident than a failed one; 0.5 is no better than
    chance), the lowest threshold whose offered outputs (at least `least`) pass at `target`, and
    `none_pass_below`: the highest threshold below which (at least `least` judged) the review passed
    none, where flagging costs nothing the review would have kept."""
    confidence = {row["chat_id"]: row.get(f"{kind}_confidence") for row in predictions
                  if row["system"] == system and row.get(kind)}
    points = sorted(((confidence[about["chat_id"]], ok) for item, ok in judged(key, verdicts).items()
                     if (about := key[item])["system"] == system and about["kind"] == kind
                     and confidence.get(about["chat_id"]) is not None), reverse=True)
    everyone = sorted((c for c in confidence.values() if c is not None), reverse=True)
    passed = [c for c, ok in points if ok]
    failed = [c for c, ok in points if not ok]
    auc = (sum((p > f) + 0.5 * (p == f) for p in passed for f in failed) / (len(passed) * len(failed))
           if passed and failed else None)
    rows, chosen, none_pass_below = [], None, None
    for n in range(1, len(points) + 1):
        cut = points[n - 1][0]
        if n < len(points) and points[n][0] == cut:
            continue  # a threshold offers every output as confident as it
        share = sum(ok for _, ok in points[:n]) / n
        rows.append({"threshold": round(cut, 4), "offered_judged": n, "passed": round(share, 3),
                     "offered_all": round(sum(c >= cut for c in everyone) / len(everyone), 3)})
        if n >= least and share >= target:
            chosen = cut  # the lowest so far whose offered outputs pass at the target
        below = points[n:]
        if none_pass_below is None and len(below) >= least and not any(ok for _, ok in below):
            none_pass_below = cut  # the highest: the scan runs from the most confident down
    return {"system": system, "kind": kind, "judged": len(points), "passed": len(passed), "auc": auc and round(auc, 3),
            "target": target, "threshold": chosen, "none_pass_below": none_pass_below, "curve": rows}


def offer(args: argparse.Namespace) -> int:
    key, verdicts = load_review(args.dir)
    predictions = load_predictions(args.predictions, args.system)
    reports = [offer_curve(key, verdicts, predictions, args.system, kind, target)
               for kind, target in (("summary", args.summary_target), ("reply", args.reply_target))]
    if args.json:
        print(json.dumps(reports, indent=1))
        return 0
    for r in reports:
        auc = "-" if r["auc"] is None else f"{r['auc']:.2f}"
        print(f"{r['system']} {r['kind']}: {r['passed']} of {r['judged']} judged passed; confidence ranks them AUC {auc}")
        step = max(1, len(r["curve"]) // 10)
        for row in r["curve"][step - 1 :: step]:
            print(f"  threshold {row['threshold']:.3f}: offered {row['offered_all']:.0%} of all, "
                  f"{row['offered_judged']} judged, {row['passed']:.0%} of those passed")
        print(f"  lowest threshold passing {r['target']:.0%}: "
              + ("none (no threshold's offered outputs pass at the target)" if r["threshold"] is None
                 else f"{r['threshold']:.4f}"))
        if r["none_pass_below"] is not None:
            below = sum(row["offered_all"] for row in r["curve"] if row["threshold"] == round(r["none_pass_below"], 4))
            print(f"  highest threshold below which the review passed none: {r['none_pass_below']:.6f} "
                  f"({1 - below:.0%} of all below it)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("prepare", help="review batches from `chatlens eval --predictions`")
    make.add_argument("--predictions", type=Path, required=True, help="the file `chatlens eval --predictions` wrote")
    make.add_argument("--split", choices=SPLITS, help="the corpus split the predictions are of")
    make.add_argument("--data", type=Path, help="or a file of the corpus format")
    make.add_argument("--system", help="only this system's outputs (default: every system in the file)")
    make.add_argument("--with-gold", action="store_true", help="mix the gold answers in, as the system 'gold'")
    make.add_argument("--batch-size", type=int, default=40, help="items per batch (default: %(default)s)")
    make.add_argument("--limit", type=int, help="only the first N items after shuffling")
    make.add_argument("--seed", type=int, default=0, help="shuffle seed (default: %(default)s)")
    make.add_argument("--out", type=Path, required=True, help="folder for batch-*.md and key.json")
    count = commands.add_parser("tally", help="join verdicts-*.jsonl with key.json and print the shares")
    count.add_argument("dir", type=Path, help="the folder prepare wrote, now holding verdicts-*.jsonl")
    count.add_argument("--json", action="store_true", help="print one JSON object")
    cut = commands.add_parser("offer", help="the review's verdicts against the model's confidence: a threshold")
    cut.add_argument("dir", type=Path, help="the folder prepare wrote, holding key.json and verdicts-*.jsonl")
    cut.add_argument("--predictions", type=Path, required=True,
                     help="`chatlens eval --predictions` of the judged outputs, with their confidences")
    cut.add_argument("--system", required=True, help="the model whose outputs were judged")
    cut.add_argument("--summary-target", type=float, default=0.7, help="share of shown summaries that must pass "
                     "(default: %(default)s)")
    cut.add_argument("--reply-target", type=float, default=0.6, help="share of offered drafts that must pass "
                     "(default: %(default)s)")
    cut.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    if args.command == "prepare" and not (args.split or args.data):
        parser.error("prepare needs --split or --data")
    return {"prepare": prepare, "tally": tally, "offer": offer}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
