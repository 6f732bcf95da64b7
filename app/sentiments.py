"""Sentiment values (-1, 0, 1: how contracts and the database keep them) and their names.

The database sorts by value (negative first); people and the JSON API see names.
"""

from __future__ import annotations

from chatlens.contracts import SENTIMENT_LABELS

NAMES: tuple[str, ...] = tuple(SENTIMENT_LABELS[value] for value in sorted(SENTIMENT_LABELS))
_VALUES = {label: value for value, label in SENTIMENT_LABELS.items()}


def name(value: int) -> str:
    return SENTIMENT_LABELS[value]


def value(label: str) -> int:
    """The value of a sentiment name; KeyError for anything else."""
    return _VALUES[label]
