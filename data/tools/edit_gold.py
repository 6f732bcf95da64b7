"""Applies a gold review's edits to an authoring file, in place (corpus v3's gold rewrite).

Usage: python3 data/tools/edit_gold.py data/source/h1.jsonl edits.jsonl
Each line of the edits file is {"id": ..., and any of "summary", "reply", "label", "messages"}:
the chat with that id gets those fields replaced (`"reply": null` removes its reply). In
`eval_gold.jsonl` the id is the `chat_id`, and `messages` and `label` cannot change (eval chats are fixed).
Stdlib only; run check_source.py and check_gold.py on the file afterwards.
"""
import json
import sys
from pathlib import Path

EDITABLE = {"summary", "reply", "label", "messages"}


def main(source: str, edits_path: str) -> int:
    edits = {}
    for line in Path(edits_path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            edit = json.loads(line)
            unknown = set(edit) - EDITABLE - {"id"}
            if unknown:
                sys.exit(f"{edit.get('id')}: cannot edit {sorted(unknown)}")
            edits[edit.pop("id")] = edit
    lines, done = [], set()
    for line in Path(source).read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        key = record.get("id", record.get("chat_id"))
        if key in edits:
            if "chat_id" in record and {"messages", "label"} & set(edits[key]):
                sys.exit(f"{key}: an eval chat's messages and label are fixed")
            record.update(edits[key])
            done.add(key)
        lines.append(json.dumps(record, ensure_ascii=False))
    missing = set(edits) - done
    if missing:
        sys.exit(f"no such chats in {source}: {sorted(missing)[:10]}")
    Path(source).write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"{source}: {len(done)} chats edited")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
