"""The pipeline's metrics: Beam counters in the `chatlens` namespace, mirrored in-process.

Beam's BundleBasedDirectRunner only reports each step's first bundle in streaming (its
StateSampler caches the ScopedState, and with it the first bundle's MetricsContainer), so
`chatlens pipeline`'s progress lines and `chatlens analyze`'s progress bar read `STATS`
instead. On other runners `STATS` is per worker and unused; Beam's metrics are the real ones.
"""

from __future__ import annotations

import threading

from apache_beam.metrics import Metrics

NAMESPACE = "chatlens"


class LocalStats:
    """The chatlens metrics as plain in-process totals, for progress on the local runners."""

    def __init__(self):
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._distributions: dict[str, list[int]] = {}  # name -> [count, sum, min, max]

    def inc(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + n

    def update(self, name: str, value: int) -> None:
        with self._lock:
            d = self._distributions.get(name)
            if d is None:
                self._distributions[name] = [1, value, value, value]
            else:
                d[0] += 1
                d[1] += value
                d[2] = min(d[2], value)
                d[3] = max(d[3], value)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def distribution(self, name: str) -> tuple[int, int, int, int] | None:
        """(count, mean, min, max), or None when nothing was recorded."""
        with self._lock:
            d = self._distributions.get(name)
            return (d[0], d[1] // d[0], d[2], d[3]) if d else None

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()
            self._distributions.clear()


STATS = LocalStats()
"""Process-wide on purpose: a local runner runs every step in the process that reports progress."""


class Counter:
    """A Beam counter in the chatlens namespace that also counts in STATS."""

    def __init__(self, name: str):
        self.name = name
        self._metric = Metrics.counter(NAMESPACE, name)

    def inc(self, n: int = 1) -> None:
        self._metric.inc(n)
        STATS.inc(self.name, n)


class Distribution:
    """A Beam distribution in the chatlens namespace that also records in STATS."""

    def __init__(self, name: str):
        self.name = name
        self._metric = Metrics.distribution(NAMESPACE, name)

    def update(self, value: int) -> None:
        self._metric.update(value)
        STATS.update(self.name, value)
