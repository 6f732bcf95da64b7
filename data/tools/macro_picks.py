"""Which macro fits each chat: annotators' briefs, the model's decoded drafts, and the picker's score.

The review fails a library macro mostly for answering the wrong problem, so the picker
(`pipeline/model/decoding/macros.py`) is measured against the macro a support lead would send,
chosen by annotators who see only the chats and the library (`data/macro_picks/`). Three steps:

    # 1. a brief for the annotators: the library's English macros, numbered, and the chats
    .venv/bin/python data/tools/macro_picks.py brief --split dev --chats data/macro_picks/dev-A.jsonl --out brief.md
    # 2. the model's decoded drafts for the same chats (what the picker reads beside the customer's words)
    .venv/bin/python data/tools/macro_picks.py guides --split dev --chats data/macro_picks/dev-A.jsonl --out guides.jsonl
    # 3. how often the pick is one the annotators accept, by how well the library fits the chat
    .venv/bin/python data/tools/macro_picks.py score --split dev --annotations data/macro_picks/dev-A.jsonl \
        data/macro_picks/dev-B.jsonl --guides guides.jsonl

Annotations are one JSON line per chat: `{"chat_id", "best": n, "also_ok": [n, ...], "fits":
"well" | "roughly" | "none"}`, numbers being the macros' places in their language's list (the
library holds the same macros in the same order in every language).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from chatlens.replies import DEFAULT_LIBRARY, read_library  # noqa: E402
from pipeline.corpus import SPLITS, load_split, read_jsonl  # noqa: E402
from pipeline.model.decoding.macros import in_language, language_of, pick  # noqa: E402

BRIEF_HEAD = """# Which reply macro fits each chat

You are a support team lead. Each chat below is a customer conversation where no agent has answered yet.
The team has a library of {count} reply macros (listed first). For each chat pick the macro a careful agent would send
as the first reply (the macro's category must match the customer's actual main problem; a macro that asks for a number
the customer already gave is worse than its sibling that does not ask). `{{reference}}` is filled with the order/booking/ticket code
the customer gave; a macro with `{{reference}}` can only be used when the customer gave such a code.

Each annotator writes one JSON line per chat:
{{"chat_id": "...", "best": <macro number>, "also_ok": [<other macro numbers a lead would accept>], "fits": "well" | "roughly" | "none"}}
(`fits`: how well the best macro answers this chat.)

## Macros

"""


def chat_ids(path: Path) -> list[str]:
    return [row["chat_id"] for row in read_jsonl(path)]


def brief(library, windows) -> str:
    """The annotators' brief: the English macros numbered, then each chat's messages."""
    macros = in_language(library, "en")
    text = BRIEF_HEAD.format(count=len(macros))
    text += "".join(f"{i}. **{m.title}**: {m.body}\n" for i, m in enumerate(macros))
    text += "\n## Chats\n\nEach chat follows as `### chat_id` and its messages, quoted, sender in bold.\n"
    for window in windows:
        text += f"\n### {window.chat_id}\n\n"
        text += "".join(f"**{m.sender}**:\n> {m.text.replace(chr(10), chr(10) + '> ')}\n\n" for m in window.messages)
    return text


def place(library, macro) -> int:
    """The macro's number: its place in its own language's list."""
    return in_language(library, macro.language).index(macro)


def score(library, windows: dict, annotations: list[dict[str, dict]], guides: dict[str, str]) -> dict:
    """How many picks either annotator accepts (`right`) or names best (`best`), overall and by the
    annotators' `fits` (both 'well', or not), and the picks that were wrong."""
    counts: Counter = Counter()
    wrong = []
    for chat_id, window in windows.items():
        marks = [a[chat_id] for a in annotations]
        macro = pick(window, library, guides.get(chat_id))
        number = place(library, macro) if macro is not None else None
        accepted = {n for mark in marks for n in (mark["best"], *mark.get("also_ok", ()))}
        fit = "well" if all(mark["fits"] == "well" for mark in marks) else "not well"
        counts["chats"] += 1
        counts[f"chats ({fit})"] += 1
        if number in accepted:
            counts["right"] += 1
            counts[f"right ({fit})"] += 1
        else:
            wrong.append({"chat_id": chat_id, "language": language_of(window, library), "picked": number,
                          "accepted": sorted(accepted)})
        counts["best"] += number in {mark["best"] for mark in marks}
    return {"counts": dict(counts), "wrong": wrong}


def decoded_guides(windows: list, model: str) -> dict[str, str]:
    """The tuned model's own decoded draft per chat: the words the picker reads beside the customer's."""
    from pipeline.model.environment import use_default_env

    use_default_env()
    from pipeline.model.backends.base import ModelOptions
    from pipeline.model.backends.gemma.engine import load_engine

    decoder = load_engine(ModelOptions(model=model)).decoder
    guides = {}
    for start in range(0, len(windows), 8):
        batch = windows[start : start + 8]
        for window, out in zip(batch, decoder.run(batch, ["all"] * len(batch))):
            guides[window.chat_id] = out.reply or ""
        print(f"{len(guides)}/{len(windows)} chats decoded", file=sys.stderr, flush=True)
    return guides


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (("brief", "write the annotators' brief"), ("guides", "decode the model's drafts"),
                       ("score", "score the picker against annotations")):
        command = commands.add_parser(name, help=text)
        command.add_argument("--split", choices=SPLITS, required=True, help="the corpus split of the chats")
        command.add_argument("--library", type=Path, default=DEFAULT_LIBRARY,
                             help="the reply library (default: the shipped one)")
        if name != "score":
            command.add_argument("--chats", type=Path, required=True,
                                 help="a JSON-lines file whose rows' chat_id name the chats (e.g. an annotation file)")
            command.add_argument("--out", type=Path, required=True, help="the file to write")
    commands.choices["guides"].add_argument("--model", default="gemma3-270m", help="the tuned model (default: shipped)")
    scoring = commands.choices["score"]
    scoring.add_argument("--annotations", type=Path, nargs="+", required=True, help="one file per annotator")
    scoring.add_argument("--guides", type=Path, help="decoded drafts (`guides`); without: the customer's words alone")
    scoring.add_argument("--wrong", action="store_true", help="list the chats picked wrongly")
    args = parser.parse_args(argv)

    library = read_library(args.library)
    examples = {e.window.chat_id: e.window for e in load_split(args.split)}
    if args.command == "brief":
        args.out.write_text(brief(library, [examples[i] for i in chat_ids(args.chats)]), encoding="utf-8")
    elif args.command == "guides":
        guides = decoded_guides([examples[i] for i in chat_ids(args.chats)], args.model)
        args.out.write_text("".join(json.dumps({"chat_id": i, "guide": g}, ensure_ascii=False) + "\n"
                                    for i, g in guides.items()), encoding="utf-8")
    else:
        annotations = [{row["chat_id"]: row for row in read_jsonl(path)} for path in args.annotations]
        guides = {row["chat_id"]: row["guide"] for row in read_jsonl(args.guides)} if args.guides else {}
        windows = {i: examples[i] for i in annotations[0]}
        result = score(library, windows, annotations, guides)
        print(json.dumps(result if args.wrong else result["counts"], ensure_ascii=False, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
