"""The model's outputs served in other styles, beside its own, for one blind review (`review.py prepare`).

The review found the tuned model's free-form summaries and drafts untrustworthy (who said what
swapped, invented agent actions, refunds nobody offered). The serving styles that cannot invent
(`pipeline/model/training/adapters.py`) are built from the model's decoded outputs: an
extractive summary quotes the chat where the decoded summary points (`extractive.py`), a macro
reply is the team's macro the decoded reply picks (`macros.py`, optionally opened by the decoded
reply's first sentence). So they can be measured against the model's own outputs on the same
chats without running it again: this reads a predictions file (`chatlens eval --predictions`)
and the corpus it was made on, and writes every row as it was plus, per style, a copy under
`<system>+<style>` that carries only what the style changes (the other output left out, so that
a review does not judge it twice) and no confidence (the model's was in its own words).

    .venv/bin/python data/tools/styles_dev.py --predictions dev.preds.jsonl --split dev \
        --style extractive --style macro --style macro+opening --out dev.styles.jsonl
    .venv/bin/python data/tools/review.py prepare --predictions dev.styles.jsonl --split dev --out review/
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from chatlens.replies import DEFAULT_LIBRARY, read_library  # noqa: E402
from pipeline.corpus import SPLITS, load_examples, load_split  # noqa: E402
from pipeline.model.decoding.extractive import extractive_summary  # noqa: E402
from pipeline.model.decoding.macros import macro_reply  # noqa: E402
from pipeline.model.training.adapters import REPLY_STYLES, SUMMARY_STYLES  # noqa: E402

STYLES = tuple(style for style in (*SUMMARY_STYLES, *REPLY_STYLES) if style != "model")


def restyled(row: dict, window, style: str, library) -> dict:
    """`row` served in `style`: a summary style's copy has no reply, a reply style's no summary."""
    if style in SUMMARY_STYLES:
        return {**row, "system": f"{row['system']}+{style}", "summary_confidence": None,
                "summary": extractive_summary(window, row["label"], row.get("summary")),
                "reply": None, "reply_confidence": None}
    reply = row.get("reply") and macro_reply(window, library, row["reply"], own_opening=style == "macro+opening")
    return {**row, "system": f"{row['system']}+{style}", "summary": None, "summary_confidence": None,
            "reply": reply, "reply_confidence": None}


def styled_rows(rows: list[dict], examples: dict, styles: list[str], library) -> list[dict]:
    """A copy of each of the model's rows per style (rows already restyled are not copied again)."""
    missing = sorted({row["chat_id"] for row in rows} - set(examples))
    if missing:
        raise SystemExit(f"{len(missing)} chats of the predictions are not in the corpus given, e.g. {missing[0]}: "
                         "pass the split or file the predictions were made on")
    own = [row for row in rows if not any(row["system"].endswith(f"+{style}") for style in STYLES)]
    return [restyled(row, examples[row["chat_id"]].window, style, library) for style in styles for row in own]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--predictions", type=Path, required=True, help="the file `chatlens eval --predictions` wrote")
    corpus = parser.add_mutually_exclusive_group(required=True)
    corpus.add_argument("--split", choices=SPLITS, help="the corpus split the predictions are of")
    corpus.add_argument("--data", type=Path, help="or a file of the corpus format")
    parser.add_argument("--style", action="append", choices=STYLES, required=True,
                        help="a serving style to add (repeat for several)")
    parser.add_argument("--library", type=Path, default=DEFAULT_LIBRARY,
                        help="the reply library of the macro styles (default: the shipped one)")
    parser.add_argument("--out", type=Path, required=True, help="the predictions file to write: every system")
    args = parser.parse_args(argv)
    examples = {e.window.chat_id: e for e in (load_split(args.split) if args.split else load_examples(args.data))}
    rows = [json.loads(line) for line in args.predictions.read_text(encoding="utf-8").splitlines() if line.strip()]
    added = styled_rows(rows, examples, args.style, read_library(args.library))
    changed = sum(row.get("gold", {}).get("summary") not in (None, examples[row["chat_id"]].summary) for row in rows)
    if changed:  # the same chat ids in another corpus version: its chats may differ too (corpus v2 and v3)
        print(f"warning: {changed} rows' gold differs from the corpus given: were the predictions made on another "
              "version of it?", file=sys.stderr)
    args.out.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows + added), encoding="utf-8")
    print(f"{len(rows)} rows and {len(added)} restyled ones ({', '.join(sorted({r['system'] for r in added}))}) "
          f"in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
