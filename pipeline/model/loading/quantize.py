"""A tuned model's weights served in int8: keras's own `quantize("int8")`, layer by layer.

keras's int8 scheme (`EinsumDense`, `ReversibleEmbedding`): each kernel int8 with a float scale per
output channel (per token for the embedding), each input quantized by its absolute maximum as it
arrives, the product summed in int32. The decoding step reads the same int8 arrays
(`step.Int8Kernel`): a one-token step is bound by the bytes it reads, and int8 halves them.

keras's `quantize` took 26 s and +2.2 GiB at load for Gemma 3 270M here: it runs `gc.collect()` for
every variable it deletes (run once instead: `compat.garbage_collected_once`), and computes the scales
in numpy, where bfloat16 is slow and each widened copy whole. `JitAbsMaxQuantizer` computes the same
abs-max in XLA, in float32 inside one program per kernel (the embedding by blocks of rows): 2.0 s, +285 MiB.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import keras

from pipeline import compat
from pipeline.model.environment import release_freed_memory

INT8 = "int8"

ROWS_AT_ONCE = 8192
"""Rows of a per-row table (the embedding) quantized together: a float32 block of 21 MB for Gemma 3,
not a float32 copy of the whole 262,144-token table."""


@functools.partial(jax.jit, static_argnames=("axis",))
def _abs_max(x, axis):
    return keras.quantizers.abs_max_quantize(x.astype("float32"), axis=axis)


@functools.partial(jax.jit, donate_argnums=(0, 1))
def _write_rows(values, scales, rows, start):
    rows_values, rows_scales = _abs_max(rows, axis=(-1,))
    return (jax.lax.dynamic_update_slice(values, rows_values, (start, 0)),
            jax.lax.dynamic_update_slice(scales, rows_scales, (start, 0)))


def _abs_max_by_rows(x):
    """Per-row abs-max of a table, `ROWS_AT_ONCE` rows a call, written into one int8 table in place
    (one program over the whole table, even with its rows in a loop, held a float32 copy of it)."""
    values, scales = jnp.zeros(x.shape, "int8"), jnp.zeros((x.shape[0], 1), "float32")
    for start in range(0, x.shape[0], ROWS_AT_ONCE):
        values, scales = _write_rows(values, scales, x[start:start + ROWS_AT_ONCE], start)
    return values, scales


class JitAbsMaxQuantizer(keras.quantizers.AbsMaxQuantizer):
    """keras's `AbsMaxQuantizer` (int8, -127..127, its epsilon) as one XLA program, in float32: a
    table quantized per row (the last axis summed) in blocks of `ROWS_AT_ONCE` rows."""

    def __call__(self, x, axis=None, to_numpy=False):
        x = x.value if isinstance(x, keras.Variable) else x
        axis = self.axis if axis is None else axis
        axis = tuple(axis) if isinstance(axis, (list, tuple)) else (axis,)
        if x.ndim == 2 and axis in ((-1,), (1,)) and x.shape[0] > ROWS_AT_ONCE:
            return _abs_max_by_rows(x)
        return _abs_max(x, axis=axis)


class ShapeQuantizer(keras.quantizers.AbsMaxQuantizer):
    """int8 zeros and unit scales of a kernel's shapes, from its shape alone (it may hold no value):
    a layer quantized in structure only, its int8 weights read next (`sources.ModelSource.load`)."""

    def __call__(self, x, axis=None, to_numpy=False):
        import numpy as np

        axis = self.axis if axis is None else axis
        summed = {a % len(x.shape) for a in (axis if isinstance(axis, (list, tuple)) else (axis,))}
        return (np.zeros(x.shape, "int8"),
                np.ones([1 if i in summed else size for i, size in enumerate(x.shape)], "float32"))


def summed_axes(equation: str, operand: int = 1) -> tuple[int, ...]:
    """The axes of an einsum's operand (0: the input, 1: the kernel) that `equation` sums over,
    counted from the operand's last axis, so an ellipsis may lead ("btd,df->btf": (-2,) for the kernel)."""
    inputs, output = equation.split("->")
    letters = inputs.split(",")[operand]
    return tuple(i - len(letters) for i, letter in enumerate(letters) if letter.isalpha() and letter not in output)


def quantize_int8(backbone, quantizer: type[keras.quantizers.AbsMaxQuantizer] = JitAbsMaxQuantizer) -> None:
    """Quantize a keras-hub Gemma backbone's projections and token embedding to keras's int8, in place,
    handing each layer's freed bfloat16 kernels back to the system as it goes (the loading peak).
    `ShapeQuantizer`: in structure only, for a backbone whose int8 weights are read next."""
    with compat.garbage_collected_once():
        for layer in backbone.transformer_layers:
            attention = layer.attention
            for dense in (attention.query_dense, attention.key_dense, attention.value_dense,
                          attention.output_dense, layer.gating_ffw, layer.gating_ffw_2, layer.ffw_linear):
                weight_quantizer = quantizer(axis=summed_axes(dense.equation))
                dense.quantize(INT8, config=keras.quantizers.Int8QuantizationConfig(weight_quantizer=weight_quantizer))
            release_freed_memory()
        backbone.token_embedding.quantize(INT8, config=keras.quantizers.Int8QuantizationConfig(
            weight_quantizer=quantizer(axis=-1)))
        release_freed_memory()
