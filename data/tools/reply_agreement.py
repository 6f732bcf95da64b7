"""How much word overlap (ROUGE-L F) the corpus's gold replies leave for anyone to reach.

A reply draft has many right answers, so ROUGE-L against the one gold reply is bounded well below 1
by how differently good writers word the same next message. This prints that bound, measured on
`dev` where a second writer drafted the next message for every chat with a gold reply without
seeing the gold (`second_replies.jsonl`, written to the gold's own brief in
`tools/AUTHORING.md`), beside three reference points from the corpus itself and, given
`chatlens eval --predictions`, the model's drafts:

- second writer: the second writer's reply against the gold;
- best train reply (oracle): for each chat the `train` gold reply in its language that scores
  highest against its gold, chosen with the gold in hand (what no retrieval could beat);
- any train reply: the mean over every `train` gold reply in the chat's language (the floor that
  the language and the genre alone give);
- re-tellings: the gold replies of two chats of one scenario in one language (the same writer,
  the same situation told twice), over every split.

Usage: .venv/bin/python data/tools/reply_agreement.py [--predictions FILE] [--json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipeline import scoring  # noqa: E402
from pipeline.corpus import DATA_DIR, SPLITS, load_split, read_jsonl, second_replies  # noqa: E402


def model_replies(path: Path, system: str | None = None) -> dict[str, str]:
    """chat_id -> the reply a system drafted, from `chatlens eval --predictions` (its first system
    unless one is named)."""
    records = read_jsonl(path)
    system = system or records[0]["system"]
    return {r["chat_id"]: r["reply"] for r in records if r["system"] == system and r["reply"]}


def _mean(values: list[float]) -> dict:
    return {"rouge_l": round(statistics.mean(values), 4), "n": len(values)}


def agreement(data_dir: Path = DATA_DIR, second: dict[str, str] | None = None,
              drafts: dict[str, str] | None = None) -> dict[str, dict]:
    """Mean ROUGE-L F against the dev gold reply of each reference point (see the module's doc)."""
    splits = {split: load_split(split, data_dir) for split in SPLITS}
    second = second_replies(data_dir) if second is None else second
    dev = [e for e in splits["dev"] if e.reply and e.window.chat_id in second]  # v2's dev reply chats
    train_by_language = defaultdict(list)
    for e in splits["train"]:
        if e.reply:
            train_by_language[e.window.language].append(e.reply)
    figures = {"second writer": _mean([scoring.rouge_l(second[e.window.chat_id], e.reply) for e in dev])}
    if drafts is not None:
        figures["model"] = _mean([scoring.rouge_l(drafts.get(e.window.chat_id, ""), e.reply) for e in dev])
        figures["model against the second writer"] = _mean(
            [scoring.rouge_l(drafts.get(e.window.chat_id, ""), second[e.window.chat_id]) for e in dev])
    train_scores = [[scoring.rouge_l(reply, e.reply) for reply in train_by_language[e.window.language]]
                    for e in dev]
    figures["best train reply (oracle)"] = _mean([max(scores) for scores in train_scores])
    figures["any train reply"] = _mean([statistics.mean(scores) for scores in train_scores])
    by_scenario = defaultdict(list)
    for e in itertools.chain.from_iterable(splits.values()):
        if e.reply and e.kind != "partial":  # a partial window is its chat's start, not a re-telling
            by_scenario[e.scenario, e.window.language].append(e.reply)
    figures["re-tellings (same writer)"] = _mean([scoring.rouge_l(a, b) for replies in by_scenario.values()
                                                  for a, b in itertools.combinations(replies, 2)])
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--predictions", type=Path, help="a `chatlens eval --predictions` file of dev chats")
    parser.add_argument("--system", help="which system of the predictions file (default: its first)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    drafts = model_replies(args.predictions, args.system) if args.predictions else None
    figures = agreement(drafts=drafts)
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        print("reply ROUGE-L F against the dev gold reply")
        for name, figure in figures.items():
            print(f"  {name:<34} {figure['rouge_l']:.3f}  (n={figure['n']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
