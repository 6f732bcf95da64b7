"""A bounded set of compiled XLA programs: what keeps a long-running worker's memory flat.

A decoder compiles one program per batch and length bucket it meets, and `jax.jit` keeps every
one for the life of the process. On a CPU each holds tens of MB (RSS as each is compiled, measured
here: a decoding loop 59-88 MiB, a prefill 33-53 MiB with its layers under one scan, 111-135 MiB
while they were unrolled), so a worker that has met 30 shapes would hold GBs of programs it
mostly no longer runs. `Programs` holds at most `limit` of them and drops the least recently used;
one needed again comes back from XLA's on-disk compilation cache
(`loading.sources.use_compilation_cache`), or is compiled again where that cache is off.

A program comes back at a price: its function traced again through keras-hub's layers (~0.6 s
for a prefill here, 1.6 s unrolled), lowered and read from the cache or compiled (a fresh prefill
~4.5 s). A decoder that can choose its shapes (`one_pass`, its prefill groups) asks `holds` first.

Each program is compiled ahead of time (`jax.jit(...).trace(...).lower().compile()`) and held as
that one executable: `jax.jit`'s own caches also kept each shape's traced and lowered forms,
~17 MiB a program more (13 programs of `gemma3-270m` held: 2,558 -> 2,338 MiB, measured here).
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

    def jit(self, function: Callable, **options) -> "Program":
        """`jax.jit(function, **options)`, its programs held here: called with its static arguments
        by keyword, as `jax.jit` would be."""
        return Program(self, function, options)

    def __len__(self) -> int:
        return len(self._held)


class Program:
    """One jitted function of a `Programs`: call it as the function; `holds` says whether a call
    with such arguments would find its program compiled."""

    def __init__(self, programs: Programs, function: Callable, options: dict):
        self.programs, self.function, self.options = programs, function, options

    def __call__(self, *args, **static):
        held = self.programs._held
        key = self._key(args, static)
        compiled = held.pop(key, None)
        if compiled is None:  # a function of its own: jax's caches of its traces go with it
            jitted = jax.jit(functools.partial(self.function), **self.options)
            compiled = jitted.trace(*args, **static).lower().compile()
        held[key] = compiled  # the most recently used last
        while len(held) > self.programs.limit:
            held.popitem(last=False)
        return compiled(*args)

    def holds(self, *args, **static) -> bool:
        """Whether these arguments' program is held (arrays may be `jax.ShapeDtypeStruct`s)."""
        return self._key(args, static) in self.programs._held

    def _key(self, args: tuple, static: dict) -> tuple:
        """What selects a compiled program: the function, the arguments' tree, shapes and dtypes, and
        the static values."""
        leaves, tree = jax.tree_util.tree_flatten(args)
        return (self.function, tree, tuple((getattr(x, "shape", ()), str(getattr(x, "dtype", type(x))))
                                           for x in leaves), tuple(sorted(static.items())))
