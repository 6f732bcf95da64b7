"""One story, one chat: finds chats of different scenarios that tell the same story.

Two chats tell one story when they share an identifier (an order, parcel, ticket or card number,
a booking code) or when their gold summaries are near-copies: TF-IDF cosine >= 0.5. Chats of one
scenario (a chat and its partial windows) may share both; partial windows' summaries are left out of
the comparison (their story is their chat's, and "Only said hello" is no story). The corpus tests
run this; run it by
hand to see the clusters: `.venv/bin/python data/tools/stories.py`.
"""

from __future__ import annotations

import re
import sys
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from pipeline.corpus import SPLITS, Example, load_split  # noqa: E402
from pipeline.review_checks import NOT_FACTS  # noqa: E402

SUMMARY_COSINE = 0.5
# Codes with a digit: 5+ digits (order 48213), or letters and digits with a dash or 4+ digits (PP-4471-0932,
# QB90214). Handles, links and hashtags are who and where, not a story's identifiers.
# Phone numbers ("07700 900412") are left out: a shared fictional prefix is not a shared story.
_IDENTIFIER = re.compile(r"(?<![\w.,:/@#-])(?<!\d )(?:\d{5,}|[A-Z]{1,4}-?\d{4,}(?:-\d+)*|\d{2,}-\d{3,}(?:-\d+)*)"
                         r"(?![\w.,-]\d)(?! \d)")


def identifiers(example: Example) -> set[str]:
    text = NOT_FACTS.sub(" ", "\n".join(m.text for m in example.window.messages))
    return {code.replace("-", "") for code in _IDENTIFIER.findall(text)}


def shared_identifiers(examples: Sequence[Example]) -> dict[str, set[str]]:
    """identifier -> the scenarios that use it, for identifiers used by more than one scenario."""
    users: dict[str, set[str]] = defaultdict(set)
    for example in examples:
        for code in identifiers(example):
            users[code].add(example.scenario)
    return {code: scenarios for code, scenarios in users.items() if len(scenarios) > 1}


def similar_summaries(examples: Sequence[Example], threshold: float = SUMMARY_COSINE
                      ) -> list[tuple[float, str, str]]:
    """(cosine, chat, chat) for gold summaries of different scenarios at or above `threshold`."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    vectors = TfidfVectorizer(sublinear_tf=True).fit_transform([e.summary for e in examples])
    similarity = (vectors @ vectors.T).tocoo()
    return sorted(((round(float(v), 3), examples[i].window.chat_id, examples[j].window.chat_id)
                   for i, j, v in zip(similarity.row, similarity.col, similarity.data)
                   if i < j and v >= threshold and examples[i].scenario != examples[j].scenario), reverse=True)


def main() -> int:
    examples = [e for split in SPLITS for e in load_split(split)]
    for code, scenarios in sorted(shared_identifiers(examples).items(), key=lambda kv: -len(kv[1])):
        print(f"identifier {code}: {', '.join(sorted(scenarios))}")
    for cosine, a, b in similar_summaries([e for e in examples if e.kind != "partial"]):
        print(f"summaries {cosine:.2f}: {a} {b}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
