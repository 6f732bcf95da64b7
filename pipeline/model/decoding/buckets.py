"""Buckets and padding: the few batch sizes and lengths XLA compiles a program for, and how a
batch of token rows is grouped and padded to them. Model-independent, cheap to test."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import numpy as np

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
LENGTH_BUCKETS = (64, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 4096, 8192)


def bucket(value: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds `value`: XLA compiles one program per bucket, not per size."""
    for size in buckets:
        if value <= size:
            return size
    raise ValueError(f"{value} is larger than the largest bucket {buckets[-1]}")


def length_groups(lengths: Sequence[int], max_spread: int, max_batch: int = BATCH_BUCKETS[-1]) -> list[list[int]]:
    """Indices sorted by length, split where a group's lengths would differ by more than `max_spread`.

    One long chat in a batch would otherwise pad every row to its length, and prefill
    (scoring and generation alike) costs padded tokens, not real ones.
    """
    groups: list[list[int]] = []
    for index in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if not groups or lengths[index] - lengths[groups[-1][0]] > max_spread or len(groups[-1]) == max_batch:
            groups.append([])
        groups[-1].append(index)
    return groups


def padded_rows(rows: Sequence[Sequence[int]], extra: int = 0, left: bool = False,
                length: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and mask: rows padded to a batch bucket and a length bucket (or `length`), plus
    `extra` free (unmasked) positions at the end.

    Right padding suits scoring (each row's last token is read); left padding puts every
    prompt's end at the same position, so generation starts at once for all rows.
    """
    batch = bucket(len(rows), BATCH_BUCKETS)
    length = length or bucket(max(map(len, rows)), LENGTH_BUCKETS)
    filler = min(rows, key=len)  # padding rows repeat a real prompt: a 0-length row breaks decoding
    token_ids = np.zeros((batch, length + extra), dtype="int32")
    mask = np.zeros((batch, length + extra), dtype="bool")
    mask[:, length:] = True
    for i, row in enumerate(itertools.chain(rows, itertools.repeat(filler, batch - len(rows)))):
        span = slice(length - len(row), length) if left else slice(0, len(row))
        token_ids[i, span] = row
        mask[i, span] = True
    return token_ids, mask


PREFILL_OVERHEAD_TOKENS = 256
"""What one more prefill call costs beside its padded tokens, in tokens: its head and vocabulary
projections and a pass over the weights (measured here: ~0.2 s, at ~1,100 prefilled tokens/s)."""

RELOAD_TOKENS = 3072
"""What a prefill of a shape whose program is not held costs more, in tokens: ~3 s to trace it,
lower it and read it from the compilation cache (`programs.py`), at ~1,100 prefilled tokens/s."""


def prefill_groups(lengths: Sequence[int], overhead: int = PREFILL_OVERHEAD_TOKENS,
                   held: Callable[[int, int], bool] | None = None, reload: int = RELOAD_TOKENS,
                   max_batch: int = BATCH_BUCKETS[-1]) -> list[list[int]]:
    """Indices sorted by length, split into the groups of at most `max_batch` that prefill the fewest
    padded tokens: each group pads to its own batch and length buckets and costs `overhead` more,
    and `reload` more where `held(batch, length)` says that shape's program is not compiled. One
    long chat among short ones gets a prefill of its own instead of padding every row to its
    length; a worker settles on the shapes it holds instead of reloading a program for a few
    padded tokens."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    best, start_of = [0] + [None] * len(order), [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        for start in range(max(0, end - max_batch), end):
            batch, length = bucket(end - start, BATCH_BUCKETS), bucket(lengths[order[end - 1]], LENGTH_BUCKETS)
            missing = reload if held is not None and not held(batch, length) else 0
            cost = best[start] + overhead + missing + batch * length
            if best[end] is None or cost < best[end]:
                best[end], start_of[end] = cost, start
    groups, end = [], len(order)
    while end:
        groups.append(order[start_of[end] : end])
        end = start_of[end]
    return groups[::-1]
