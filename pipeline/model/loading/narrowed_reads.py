"""Load a float32 weights file into a bfloat16 model without a float32 copy of its largest arrays.

keras reads each variable of a `.weights.h5` whole, in the file's dtype, and converts it as it
assigns it: for Gemma 3 270M's vocabulary (168M values) a 671 MB float32 array beside its
conversions, the highest point of a served model's memory (bench/serving_memory.py, 2026-11-29:
2.37 GiB while loading, 2.14 GiB at most while analysing). Read in blocks of rows and converted
block by block, a large array is only ever held in bfloat16. The values are the same: numpy's
bfloat16 (ml_dtypes) rounds to nearest even, as XLA's conversion does.

keras offers no hook for this, so `reads_narrowed` replaces its HDF5 store's read while a model
loads (`compat.h5_reads_replaced`: keras is pinned, and tests/pipeline/test_compat.py checks it).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from pipeline import compat

LARGE = 1 << 24
"""Arrays of at least this many float32 values are read in blocks: the vocabulary, not the kernels."""

BLOCK_BYTES = 64 << 20
"""About this many bytes of float32 read at a time."""


@contextmanager
def reads_narrowed(dtype: str) -> Iterator[None]:
    """While a model of `dtype` loads, its large float32 arrays reach keras already in bfloat16.

    Only for a bfloat16 model, whose variables are all bfloat16 (keras-hub's `dtype=`): a float32
    variable would be given rounded values."""
    if dtype != "bfloat16":
        yield
        return
    with compat.h5_reads_replaced(_narrowed):
        yield


def _narrowed(read_whole, dataset):
    if dataset.dtype != np.float32 or dataset.size < LARGE:
        return read_whole()
    import ml_dtypes

    narrowed = np.empty(dataset.shape, ml_dtypes.bfloat16)
    rows = max(1, BLOCK_BYTES // (dataset.dtype.itemsize * (dataset.size // dataset.shape[0])))
    for start in range(0, dataset.shape[0], rows):
        narrowed[start : start + rows] = dataset[start : start + rows]
    return narrowed
