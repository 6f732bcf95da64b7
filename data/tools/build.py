"""Builds data/{train,dev,test}.jsonl from the hand-written sources in data/source/.

Run once when sources are added (`.venv/bin/python data/tools/build.py`); the split files
are what the project reads and commits. What it does, and nothing more:
- turns each authoring-format chat (see AUTHORING.md) into a ChatWindow: ids, user ids,
  the tenant of its domain, and message times (deterministic, from the chat id);
- puts the labelled eval chats of the earlier test set (`eval_chats.jsonl` with their gold
  in `source/eval_gold.jsonl`) into `test`;
- assigns every other scenario of the first sources (`source/h*.jsonl`) as a whole to one
  split, stratified by label and by English/not English, in an order fixed by a hash of the
  scenario id;
- puts the chats written later for training only (`source/t*.jsonl`) into `train`: adding
  them leaves `dev` and `test`, and every figure measured on them, exactly as they were;
- assigns the chats of corpus v3's new kinds (`source/s*.jsonl` short chats, `source/m*.jsonl`
  social-media threads) by scenario among themselves, like the first sources, so `dev` and
  `test` grow with each kind while the earlier chats stay where they were;
- adds each partial window (`source/p-*.jsonl`: the first messages of a chat, as an early
  firing sees them) to its chat's split, as an open window of that chat.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections import defaultdict
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from chatlens.contracts import ChatMessage, ChatWindow  # noqa: E402
from pipeline.corpus import DATA_DIR, Example, split_path, write_examples  # noqa: E402

SOURCES = DATA_DIR / "source"
EVAL_CHATS = SOURCES / "eval_chats.jsonl"
TENANTS = {
    "food_delivery": "quickbite", "parcels": "parcelpoint", "telecom": "telnova", "utilities": "voltgrid",
    "banking": "northbank", "insurance": "safeharbor", "travel": "skyway", "hotels": "staywell",
    "retail": "shopmart", "saas": "pixelforge",
}
SHARES = {"train": 0.72, "dev": 0.15, "test": 0.13}  # of the scenarios written for this corpus
START = datetime(2026, 9, 1, tzinfo=timezone.utc)


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


NEW_KINDS = ("s*.jsonl", "m*.jsonl")  # corpus v3: short chats, social-media threads
VERY_LONG_CHARS = 4500  # the `very_long` tag's floor: the start of a very long chat may be short


def window_of(record: dict) -> ChatWindow:
    chat_id = record["id"]
    tenant = TENANTS[record["domain"]]
    h = _hash(chat_id)
    at = START + timedelta(seconds=h % (80 * 86400))
    customer = f"cust-{h % 1_000_000:06d}"
    agent = f"agent-{tenant}-{h % 57 + 1}"
    users = {"customer": customer, "agent": agent, "bot": f"bot-{tenant}"}
    messages = []
    for index, (sender, text) in enumerate(record["messages"], start=1):
        at += timedelta(seconds=15 + _hash(f"{chat_id}/{index}") % 240)
        messages.append(ChatMessage(chat_id=chat_id, message_id=f"{chat_id}-m{index:02d}", sender=sender,
                                    user_id=users[sender], text=text, sent_at=at))
    return ChatWindow(chat_id=chat_id, window_id="w1", tenant=tenant, language=record["language"],
                      customer_id=customer, messages=messages, closed=True)


def _records(pattern: str) -> list[dict]:
    return [json.loads(line) for path in sorted(SOURCES.glob(pattern))
            for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def authored_examples(pattern: str = "h*.jsonl") -> list[Example]:
    return [Example(window_of(r), r["label"], r["summary"], r["reply"], r["scenario"], r["domain"],
                    tuple(r["hard_cases"]), kind=r.get("kind", "chat")) for r in _records(pattern)]


def partial_window(window: ChatWindow, chat_id: str, upto: int) -> ChatWindow:
    """The first `upto` messages of `window` as an open window of their own (an early firing)."""
    messages = [m.model_copy(update={"chat_id": chat_id}) for m in window.messages[:upto]]
    return window.model_copy(update={"chat_id": chat_id, "window_id": f"w1-p{upto}", "messages": messages,
                                     "closed": False})


def with_partial_windows(splits: dict[str, list[Example]]) -> None:
    """Each partial window joins its chat's split (so a story never crosses splits)."""
    chats = {e.window.chat_id: (split, e) for split, examples in splits.items() for e in examples}
    for r in _records("p-*.jsonl"):
        split, chat = chats[r["of"]]
        window = partial_window(chat.window, r["id"], r["upto"])
        hard_cases = tuple(h for h in r["hard_cases"] if h != "very_long" or window.text_chars >= VERY_LONG_CHARS)
        splits[split].append(Example(window, r["label"], r["summary"], r["reply"], chat.scenario, chat.domain,
                                     hard_cases, kind="partial"))


def eval_examples() -> list[Example]:
    gold = {}
    for line in (SOURCES / "eval_gold.jsonl").read_text(encoding="utf-8").splitlines():
        if line.strip():
            g = json.loads(line)
            gold[g["chat_id"]] = g
    examples = []
    for line in EVAL_CHATS.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        label = record.pop("label")
        g = gold[record["chat_id"]]
        window = ChatWindow.model_validate_json(json.dumps(record))
        examples.append(Example(window, label, g["summary"], g["reply"], window.chat_id, g["domain"],
                                tuple(g["hard_cases"])))
    return examples


def assign(examples: list[Example]) -> dict[str, list[Example]]:
    """Whole scenarios to splits: per stratum, each scenario goes where the split is furthest below its share."""
    scenarios: dict[str, list[Example]] = defaultdict(list)
    for example in examples:
        scenarios[example.scenario].append(example)
    strata: dict[tuple, list[str]] = defaultdict(list)
    for name, members in scenarios.items():
        first = members[0]
        strata[(first.label, first.window.language == "en")].append(name)
    splits: dict[str, list[Example]] = {split: [] for split in SHARES}
    for key in sorted(strata, key=str):
        given = dict.fromkeys(SHARES, 0)
        for name in sorted(strata[key], key=_hash):
            total = sum(given.values()) + len(scenarios[name])
            split = max(SHARES, key=lambda s: SHARES[s] * total - given[s])
            given[split] += len(scenarios[name])
            splits[split] += scenarios[name]
    return splits


def build() -> dict[str, list[Example]]:
    splits = assign(authored_examples())
    splits["test"] = eval_examples() + splits["test"]
    splits["train"] += authored_examples("t*.jsonl")
    for split, examples in assign([e for pattern in NEW_KINDS for e in authored_examples(pattern)]).items():
        splits[split] += examples
    with_partial_windows(splits)
    return splits


def main() -> int:
    for split, examples in build().items():
        examples.sort(key=lambda e: e.window.chat_id)
        write_examples(split_path(split), examples)
        print(f"{split}: {len(examples)} chats")
    return 0


if __name__ == "__main__":
    sys.exit(main())
