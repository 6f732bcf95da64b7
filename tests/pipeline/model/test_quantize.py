"""Serving weights in int8 (`pipeline/model/loading/quantize.py`): keras's own scheme, computed lean."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.model.loading.quantize import ROWS_AT_ONCE, JitAbsMaxQuantizer, summed_axes


@pytest.mark.parametrize("shape, axis", [((4, 32, 8), (1,)), ((32, 64), (0,)), ((3 * ROWS_AT_ONCE + 5, 8), (-1,))])
def test_the_jitted_quantizer_equals_keras_abs_max_quantize(shape, axis):
    """The same int8 values and scales as keras's `abs_max_quantize` in float32, also for a table
    quantized by rows in blocks (the embedding), its last block short."""
    import keras

    x = np.random.default_rng(1).normal(size=shape).astype("float32")
    values, scale = JitAbsMaxQuantizer(axis=axis)(x)
    expected_values, expected_scale = keras.quantizers.abs_max_quantize(x, axis=axis)
    assert values.dtype == np.int8 and values.shape == shape
    np.testing.assert_array_equal(np.asarray(values), np.asarray(expected_values))
    np.testing.assert_allclose(np.asarray(scale), np.asarray(expected_scale), rtol=1e-6)


def test_summed_axes_are_the_kernel_axes_missing_from_the_output():
    assert summed_axes("btd,df->btf") == (-2,)
    assert summed_axes("btd,ndh->btnh") == (-2,)
    assert summed_axes("btnh,nhd->btd") == (-3, -2)
    assert summed_axes("btnh,nhd->btd", 0) == (-2, -1)
    assert summed_axes("...d,vd->...v", 0) == (-1,)


def test_a_quantized_gemma_holds_int8_kernels_and_serves_within_int8_rounding(model_cache):
    """`quantize_int8` on keras-hub's Gemma: every projection and the embedding int8 (keras's own
    layers, as `quantize("int8")` leaves them), no bfloat16 kernel left, logits within rounding."""
    import jax.numpy as jnp

    from pipeline.model.loading.quantize import quantize_int8
    from tests.support.models import tiny_gemma_lm

    lm = tiny_gemma_lm(model_cache, dtype="bfloat16")
    backbone = lm.backbone
    tokens = {"token_ids": jnp.array([[2, 5, 9, 11]]), "padding_mask": jnp.ones((1, 4), bool)}
    before = np.asarray(lm(tokens), "float32")
    quantize_int8(backbone)
    layer = backbone.transformer_layers[0]
    for dense in (layer.attention.query_dense, layer.gating_ffw, layer.ffw_linear):
        assert dense.quantization_mode == "int8" and str(dense._kernel.dtype) == "int8"
    assert backbone.token_embedding.quantization_mode == "int8"
    left = [v for v in backbone.weights if str(v.dtype) != "int8"]
    assert all("scale" in v.path or len(v.shape) == 1 for v in left)  # scales and norms only
    after = np.asarray(lm(tokens), "float32")
    assert np.abs(after - before).max() < 0.1 * np.abs(before).max()


def test_a_local_presets_int8_weights_are_made_once_and_read_into_a_model_quantized_in_structure(
        model_cache, tmp_path):
    """`ModelSource.load(int8=True)` on a preset of one weights file: the int8 weights are made once
    under the cache and read back into a model that never holds its bfloat16 kernels; every weight
    and the logits are those of quantizing the model as loaded, and a second load makes nothing."""
    import jax.numpy as jnp

    from pipeline.model.loading.quantize import quantize_int8
    from pipeline.model.loading.sources import resolve_model
    from tests.support.models import tiny_gemma_lm

    tiny_gemma_lm(model_cache).save_to_preset(str(tmp_path / "tiny"))
    source = resolve_model(str(tmp_path / "tiny"), tmp_path / "cache")
    expected = source.load("bfloat16")
    quantize_int8(expected.backbone)
    read = source.load("bfloat16", int8=True)
    made, = (tmp_path / "cache" / "models").glob("tiny+int8-*/model.weights.h5")
    assert read.backbone.token_embedding.quantization_mode == "int8"
    want = {v.path: np.asarray(v.value) for v in expected.backbone.weights}
    got = {v.path: np.asarray(v.value) for v in read.backbone.weights}
    assert got.keys() == want.keys() and any(a.dtype == np.int8 for a in got.values())
    for path, value in want.items():
        assert got[path].dtype == value.dtype, path
        np.testing.assert_array_equal(got[path], value, err_msg=path)
    tokens = {"token_ids": jnp.array([[2, 5, 9, 11]]), "padding_mask": jnp.ones((1, 4), bool)}
    np.testing.assert_array_equal(np.asarray(read(tokens), "float32"), np.asarray(expected(tokens), "float32"))
    written = made.stat().st_mtime_ns
    source.load("bfloat16", int8=True)
    assert made.stat().st_mtime_ns == written
