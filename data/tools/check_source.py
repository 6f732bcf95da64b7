"""Checks a hand-written corpus source file (compact authoring format) and prints its counts.

Usage: python3 data/tools/check_source.py data/source/h1.jsonl [more files]
Stdlib only. Exit 1 on any error.
"""
import collections
import json
import re
import sys

DOMAINS = {"food_delivery", "parcels", "telecom", "utilities", "banking", "insurance", "travel",
           "hotels", "retail", "saas"}
LANGS = {"en", "fr", "es", "de", "it", "pt", "nl"}
HARD = {"sarcasm", "polite_anger", "mixed_feelings", "angry_then_resolved", "neutral_bad_event",
        "profanity", "typos", "emoji_only", "very_long", "prompt_injection", "code_switching"}
SENDERS = {"customer", "agent", "bot"}
PLACEHOLDER = re.compile(r"\[[^\]]*\]|\{[^}]*\}|<[A-Za-z_ ]+>|XXX|\bN/A\b")
NUMBER = re.compile(r"\d+(?:[.,:]\d+)*")


def numbers(text):
    return {n.strip(".,:") for n in NUMBER.findall(text)}


def check(path):
    errors, seen = [], set()
    counts = collections.defaultdict(collections.Counter)
    for lineno, line in enumerate(open(path, encoding="utf-8"), 1):
        where = f"{path}:{lineno}"
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            errors.append(f"{where}: not JSON: {e}")
            continue
        keys = {"id", "scenario", "domain", "language", "label", "hard_cases", "messages", "summary", "reply"}
        if set(r) != keys:
            errors.append(f"{where}: keys must be exactly {sorted(keys)}, got {sorted(r)}")
            continue
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
