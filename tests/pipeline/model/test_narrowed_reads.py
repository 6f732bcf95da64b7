"""A float32 weights file read into a bfloat16 model block by block (pipeline/model/loading/narrowed_reads.py)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.model.loading import narrowed_reads
from pipeline.model.loading.narrowed_reads import reads_narrowed


def model(dtype: str):
    import keras

    keras.utils.set_random_seed(7)
    return keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(1000, 48, dtype=dtype),
                             keras.layers.Dense(5, dtype=dtype)])


def test_a_large_array_is_read_in_blocks_straight_to_bfloat16_with_kerass_own_values(tmp_path, monkeypatch):
    import keras
    from keras.src.saving import saving_lib

    path = tmp_path / "model.weights.h5"
    model("float32").save_weights(path)
    expected = model("bfloat16")
    expected.load_weights(path)  # keras's own way: whole float32 arrays, converted on assignment

    monkeypatch.setattr(narrowed_reads, "LARGE", 1000)  # the 48,000-value embedding counts as large here
    monkeypatch.setattr(narrowed_reads, "BLOCK_BYTES", 48 * 4 * 64)  # 64 rows a block: 16 blocks
    reads, read_whole = [], saving_lib.H5IOStore.__getitem__
    narrowed = model("bfloat16")
    with reads_narrowed("bfloat16"):
        patched = saving_lib.H5IOStore.__getitem__
        saving_lib.H5IOStore.__getitem__ = lambda s, k: reads.append(v := patched(s, k)) or v  # what each read gave
        try:
            narrowed.load_weights(path)
        finally:
            saving_lib.H5IOStore.__getitem__ = patched
    assert saving_lib.H5IOStore.__getitem__ is read_whole  # keras's reader is back
    assert [str(r.dtype) for r in reads] == ["bfloat16", "float32", "float32"]  # the embedding narrowed, the rest whole
    for got, want in zip(narrowed.weights, expected.weights, strict=True):
        assert got.dtype == want.dtype == "bfloat16"
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(got).astype("float32"),
                                      keras.ops.convert_to_numpy(want).astype("float32"))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_another_dtype_loads_as_keras_does(dtype):
    from keras.src.saving import saving_lib

    read_whole = saving_lib.H5IOStore.__getitem__
    with reads_narrowed(dtype):
        assert saving_lib.H5IOStore.__getitem__ is read_whole
