"""A bounded set of compiled XLA programs: what keeps a long-running worker's memory flat.

A decoder compiles one program per batch and length bucket it meets, and `jax.jit` keeps every
one for the life of the process. On a CPU each holds 50-100 MB (a prefill ~95 MB, a decoding
loop ~55 MB, measured here), so a worker that has met 30 shapes holds 2-3 GB of programs it
mostly no longer runs. `Programs` holds at most `limit` of them and drops the least recently
used; one needed again comes back from XLA's on-disk compilation cache
(`loading.sources.use_compilation_cache`) in about 3 s here, or is compiled again where that
cache is off.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import jax

MAX_PROGRAMS = 8
"""Programs a decoder holds at once: the shapes a steady stream meets most stay compiled."""


class Programs:
    """Compiled programs of jitted functions, one per function, argument shapes and static values,
    at most `limit` of them held, all functions together."""

    def __init__(self, limit: int = MAX_PROGRAMS):
        if limit < 1:
            raise ValueError(f"a decoder needs at least one compiled program, not {limit}")
        self.limit = limit
        self._held: OrderedDict[tuple, Any] = OrderedDict()

    def jit(self, function: Callable, **options) -> Callable:
        """`jax.jit(function, **options)`, its programs held here. Each shape gets a `jax.jit` of its
        own: jax keeps every program of one jitted function until that function is dropped, so
        dropping one program means dropping its function."""

        def call(*args, **static):
            key = (function, *_signature(args, static))
            jitted = self._held.pop(key, None)
            if jitted is None:
                jitted = jax.jit(functools.partial(function), **options)
            self._held[key] = jitted  # the most recently used last
            while len(self._held) > self.limit:
                self._held.popitem(last=False)[1].clear_cache()
            return jitted(*args, **static)

        return call

    def __len__(self) -> int:
        return len(self._held)


def _signature(args: tuple, static: dict) -> tuple:
    """What selects a compiled program: the arguments' tree, shapes and dtypes, and the static values."""
    leaves, tree = jax.tree_util.tree_flatten(args)
    return (tree, tuple((getattr(x, "shape", ()), str(getattr(x, "dtype", type(x)))) for x in leaves),
            tuple(sorted(static.items())))
