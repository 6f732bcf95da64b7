"""Checks a hand-written corpus source file (compact authoring format) and prints its counts.

Usage: python3 data/tools/check_source.py data/source/h1.jsonl [more files]
A partial-window file (`p-*.jsonl`, see AUTHORING.md) is checked against the chats it points at
(every other file in its folder). Stdlib only. Exit 1 on any error.
"""
import collections
import json
import re
import sys
from pathlib import Path

DOMAINS = {"food_delivery", "parcels", "telecom", "utilities", "banking", "insurance", "travel",
           "hotels", "retail", "saas"}
LANGS = {"en", "fr", "es", "de", "it", "pt", "nl"}
HARD = {"sarcasm", "polite_anger", "mixed_feelings", "angry_then_resolved", "neutral_bad_event",
        "profanity", "typos", "emoji_only", "very_long", "prompt_injection", "code_switching"}
SENDERS = {"customer", "agent", "bot"}
KINDS = {"chat", "short", "social"}
KEYS = {"id", "scenario", "domain", "language", "label", "hard_cases", "messages", "summary", "reply"}
PARTIAL_KEYS = {"id", "of", "upto", "label", "hard_cases", "summary", "reply"}
PLACEHOLDER = re.compile(r"\[[^\]]*\]|\{[^}]*\}|<[A-Za-z_ ]+>|XXX|\bN/A\b")
NUMBER = re.compile(r"\d+(?:[.,:]\d+)*")


def numbers(text):
    return {n.strip(".,:") for n in NUMBER.findall(text)}


def chats_beside(path):
    """The full chats of every authoring file in `path`'s folder, by id (what partial windows point at)."""
    chats = {}
    for other in sorted(Path(path).parent.glob("*.jsonl")):
        if not other.name.startswith(("p-", "eval_")):
            for line in other.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    r = json.loads(line)
                    chats[r["id"]] = r
    folder = Path(path).parent
    domains = {g["chat_id"]: g["domain"] for g in map(json.loads, filter(
        str.strip, (folder / "eval_gold.jsonl").read_text(encoding="utf-8").splitlines()))}
    for line in (folder / "eval_chats.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            r = json.loads(line)
            chats[r["chat_id"]] = {"id": r["chat_id"], "language": r["language"], "domain": domains[r["chat_id"]],
                                   "messages": [[m["sender"], m["text"]] for m in r["messages"]]}
    return chats


def as_window(r, chats, where, errors):
    """A partial-window line as a full record (its chat's first `upto` messages), or None when it is wrong."""
    if set(r) != PARTIAL_KEYS:
        errors.append(f"{where}: a partial window's keys are exactly {sorted(PARTIAL_KEYS)}, got {sorted(r)}")
        return None
    chat = chats.get(r["of"])
    if chat is None:
        errors.append(f"{where}: no chat {r['of']!r} to be a partial window of")
        return None
    upto = r["upto"]
    if not isinstance(upto, int) or not 1 <= upto < len(chat["messages"]):
        errors.append(f"{where}: upto must be 1..{len(chat['messages']) - 1} (the chat has {len(chat['messages'])})")
        return None
    if r["id"] != f"{r['of']}-p{upto}":
        errors.append(f"{where}: a partial window's id is {r['of']}-p{upto}")
    if chat["messages"][upto - 1][0] != "customer":
        errors.append(f"{where}: the window must end on a customer message")
    return {**chat, **{k: r[k] for k in ("id", "label", "hard_cases", "summary", "reply")},
            "scenario": chat.get("scenario", chat["id"]), "messages": chat["messages"][:upto], "kind": "partial"}


def check(path):
    errors, seen = [], set()
    counts = collections.defaultdict(collections.Counter)
    partial = Path(path).name.startswith("p-")
    chats = chats_beside(path) if partial else {}
    for lineno, line in enumerate(open(path, encoding="utf-8"), 1):
        where = f"{path}:{lineno}"
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            errors.append(f"{where}: not JSON: {e}")
            continue
        if partial:
            r = as_window(r, chats, where, errors)
            if r is None:
                continue
        elif not KEYS <= set(r) <= KEYS | {"kind"}:
            errors.append(f"{where}: keys must be exactly {sorted(KEYS)} (and optionally kind), got {sorted(r)}")
            continue
        kind = r.get("kind", "chat")
        if kind not in KINDS | {"partial"} or (kind == "partial") != partial:
            errors.append(f"{where}: kind must be one of {sorted(KINDS)}")
        if kind == "short":
            senders = [m[0] for m in r["messages"]]
            if "agent" in senders or not 1 <= senders.count("customer") <= 3:
                errors.append(f"{where}: a short chat has 1 to 3 customer messages and no agent")
        if kind == "social" and "agent" not in [m[0] for m in r["messages"]] and len(r["messages"]) < 2:
            errors.append(f"{where}: a social thread has several posts")
        if r["id"] in seen:
            errors.append(f"{where}: duplicate id {r['id']}")
        seen.add(r["id"])
        if r["domain"] not in DOMAINS:
            errors.append(f"{where}: unknown domain {r['domain']}")
        if r["language"] not in LANGS:
            errors.append(f"{where}: unknown language {r['language']}")
        if r["label"] not in (-1, 0, 1):
            errors.append(f"{where}: label must be -1, 0 or 1")
        bad = set(r["hard_cases"]) - HARD
        if bad:
            errors.append(f"{where}: unknown hard cases {bad}")
        msgs = r["messages"]
        if not 1 <= len(msgs) <= 20:
            errors.append(f"{where}: {len(msgs)} messages (1 to 20)")
        if any(len(m) != 2 or m[0] not in SENDERS or not isinstance(m[1], str) or not m[1].strip() for m in msgs):
            errors.append(f"{where}: each message is [sender, non-empty text]")
            continue
        if not any(m[0] == "customer" for m in msgs):
            errors.append(f"{where}: no customer message")
        chat = "\n".join(m[1] for m in msgs)
        s = r["summary"]
        if not isinstance(s, str) or not s or len(s) > 240:
            errors.append(f"{where}: summary must be 1..240 characters ({len(s or '')})")
        rep = r["reply"]
        if r["label"] == -1 and not rep:
            errors.append(f"{where}: a negative chat needs a gold reply")
        if rep is not None:
            if not isinstance(rep, str) or not rep or len(rep) > 600:
                errors.append(f"{where}: reply must be 1..600 characters")
            elif PLACEHOLDER.search(rep):
                errors.append(f"{where}: reply has a placeholder: {PLACEHOLDER.search(rep).group()}")
        for field, text in (("summary", s), ("reply", rep or "")):
            missing = numbers(text) - numbers(chat)
            if missing:
                errors.append(f"{where}: {field} has numbers not in the chat: {sorted(missing)}")
        if "very_long" in r["hard_cases"] and len(chat) < 4500:
            errors.append(f"{where}: very_long chat has only {len(chat)} characters (need >= 4500)")
        if r["label"] == 0 and r["reply"] is None and r["messages"][-1][0] == "customer" and "?" in r["messages"][-1][1]:
            errors.append(f"{where}: a neutral window that ends on an unanswered customer question needs a reply")
        counts["kind"][kind] += 1
        counts["label"][r["label"]] += 1
        counts["language"][r["language"]] += 1
        counts["domain"][r["domain"]] += 1
        for h in r["hard_cases"]:
            counts["hard_case"][h] += 1
        counts["reply"]["with reply" if rep else "no reply"] += 1
        counts["messages"][min(len(msgs) // 5 * 5, 20)] += 1
    return errors, counts, len(seen)


def main():
    failed = False
    for path in sys.argv[1:]:
        errors, counts, n = check(path)
        print(f"== {path}: {n} chats")
        for name, c in counts.items():
            print(f"  {name}: " + ", ".join(f"{k}={v}" for k, v in sorted(c.items(), key=str)))
        for e in errors:
            print("  ERROR", e)
        failed |= bool(errors)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
