"""Extractive summaries beside the model's, for one blind review (`review.py prepare`).

The review found the tuned model's free-form summaries untrustworthy (who said what swapped,
invented agent actions); `pipeline/model/decoding/extractive.py` writes summaries that only
quote the chat. To measure one against the other on the same chats, this reads a predictions
file (`chatlens eval --predictions`) and the corpus it was made on, and writes every row as it
was plus a copy under `<system>+extractive`: the same label and reply, the summary extractive,
guided by the model's own summary. The copy has no `summary_confidence` (the model's
confidence was in its own words). `--summary-only` leaves the copy's reply out, so that a review
does not judge each draft twice.

    .venv/bin/python data/tools/extractive_dev.py --predictions dev.preds.jsonl --split dev --out dev.both.jsonl
    .venv/bin/python data/tools/review.py prepare --predictions dev.both.jsonl --split dev --out review/
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipeline.corpus import SPLITS, load_examples, load_split  # noqa: E402
from pipeline.model.decoding.extractive import extractive_summary  # noqa: E402

SUFFIX = "+extractive"


def extractive_rows(rows: list[dict], examples: dict, summary_only: bool = False) -> list[dict]:
    """A copy of each row under `<system>+extractive`, its summary quoted from the chat."""
    missing = sorted({row["chat_id"] for row in rows} - set(examples))
    if missing:
        raise SystemExit(f"{len(missing)} chats of the predictions are not in the corpus given, e.g. {missing[0]}: "
                         "pass the split or file the predictions were made on")
    return [{**row, "system": row["system"] + SUFFIX, "summary_confidence": None,
             "summary": extractive_summary(examples[row["chat_id"]].window, row["label"], row.get("summary")),
             **({"reply": None, "reply_confidence": None} if summary_only else {})}
            for row in rows if not row["system"].endswith(SUFFIX)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--predictions", type=Path, required=True, help="the file `chatlens eval --predictions` wrote")
    corpus = parser.add_mutually_exclusive_group(required=True)
    corpus.add_argument("--split", choices=SPLITS, help="the corpus split the predictions are of")
    corpus.add_argument("--data", type=Path, help="or a file of the corpus format")
    parser.add_argument("--summary-only", action="store_true", help="the extractive rows carry no reply")
    parser.add_argument("--out", type=Path, required=True, help="the predictions file to write: both systems")
    args = parser.parse_args(argv)
    examples = {e.window.chat_id: e for e in (load_split(args.split) if args.split else load_examples(args.data))}
    rows = [json.loads(line) for line in args.predictions.read_text(encoding="utf-8").splitlines() if line.strip()]
    added = extractive_rows(rows, examples, args.summary_only)
    changed = sum(row.get("gold", {}).get("summary") not in (None, examples[row["chat_id"]].summary) for row in rows)
    if changed:  # the same chat ids in another corpus version: its chats may differ too (corpus v2 and v3)
        print(f"warning: {changed} rows' gold differs from the corpus given: were the predictions made on another "
              "version of it?", file=sys.stderr)
    args.out.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows + added), encoding="utf-8")
    print(f"{len(rows)} rows and {len(added)} extractive ones ({', '.join(sorted({r['system'] for r in added}))}) "
          f"in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
