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
