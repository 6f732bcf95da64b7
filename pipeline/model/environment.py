"""The process settings the model needs, set in one place: `use_default_env()`.

Keras picks its backend, and JAX its GPU memory policy, once, when first imported; so every
entry point calls `use_default_env()` before anything imports keras or JAX: the `chatlens`
command (cli/main.py), the Beam workers (GemmaModelHandler passes `DEFAULT_ENV` to Beam,
which sets it in the process that loads the model), the bench scripts, deploy/bake_model.py
and the tests (tests/conftest.py). Values already in the environment win. Beside them, the
process's memory between batches: `release_freed_memory()`, and `status_mib()` to read it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from pathlib import Path

DEFAULT_ENV = {
    "KERAS_BACKEND": "jax",
    # JAX on GPU would otherwise take 75% of the device memory at start-up.
    "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
    "TF_CPP_MIN_LOG_LEVEL": "2",
}


DEFAULT_XLA_FLAGS = ("--xla_cpu_enable_concurrency_optimized_scheduler=false",)
"""XLA's CPU scheduler orders a program's operations for less live memory rather than for
concurrency: the same outputs and, on 2 cores, the same speed, for a lower peak while analysing
(README, "Serving memory"). Added to a user's XLA_FLAGS, never in place of them."""


def with_default_xla_flags(flags: str) -> str:
    """`flags` (XLA_FLAGS) with each of DEFAULT_XLA_FLAGS appended, unless it already sets that
    flag: the user's value wins."""
    given = flags.split()
    named = {flag.split("=", 1)[0] for flag in given}
    return " ".join(given + [flag for flag in DEFAULT_XLA_FLAGS if flag.split("=", 1)[0] not in named])


def use_default_env() -> None:
    """Set DEFAULT_ENV in this process (where unset) and add DEFAULT_XLA_FLAGS to XLA_FLAGS,
    before keras or JAX is imported (JAX reads XLA_FLAGS once, when its backend starts)."""
    for name, value in DEFAULT_ENV.items():
        os.environ.setdefault(name, value)
    os.environ["XLA_FLAGS"] = with_default_xla_flags(os.environ.get("XLA_FLAGS", ""))


def release_freed_memory() -> bool:
    """Give the memory the C heap holds free back to the system (glibc's `malloc_trim`); False where
    the C library has none. glibc keeps what a batch freed (XLA's working buffers, the cache) for
    its next allocations, so a worker rested ~200 MiB above what it held between batches, and
    the next batch's peak started there (README, "Serving memory"). 57 ms for 400 MiB freed here,
    0.1 ms for none."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


@functools.cache
def _malloc_trim():
    library = ctypes.util.find_library("c")
    return getattr(ctypes.CDLL(library), "malloc_trim", None) if library else None


def status_mib(field: str) -> float:
    """A memory field of this process's `/proc/self/status` (`VmRSS`: resident now, `VmHWM`: its
    peak) in MiB; NaN where there is no such field (or no /proc)."""
    status = Path("/proc/self/status")
    for line in status.read_text().splitlines() if status.exists() else ():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")
