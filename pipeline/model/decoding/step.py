"""One decoding step through a keras-hub Gemma 3 backbone: one new token per row, on a head-major cache.

keras-hub's cached attention keeps the cache as (batch, time, kv_heads, head_dim) and writes the
new key and value into it before reading it back. Inside a `jax.lax.while_loop` on CPU, XLA then
copies every layer's whole cache on every step (the read and the in-place write overlap), and the
attention einsums transpose it again: at a few hundred cached positions that was more than the
weights' own reads. Here the cache is (batch, kv_heads, time, head_dim), attention reads the cache
as it was before this step plus the new key and value on their own, and the write comes last
(the loop around it is compiled with XLA's region analysis, `one_pass.LOOP_COMPILER_OPTIONS`, so
that write happens in place). A sliding-window layer's cache is a ring of its window
(`decoding_cache`): on the 15 of Gemma 3 270M's 18 layers that see 512 positions, a step reads
those, not the whole cache. The arithmetic is keras-hub's (same norms, rotary embedding and masks: padding, causal, sliding
window); only the order of the sums differs.

The step's matrix products read `step_weights`: keras-hub's own kernels, as they are laid out, by
default in bfloat16 with float32 accumulation. One token per row makes every product a
matrix-vector one whose cost is reading the weights; on a CPU with AVX512-BF16 or AMX that halves
the bytes and the time (8 rows, measured here: the transformer's products 39 -> 17.5 ms a step, the
262,144-token vocabulary projection 47 -> 24 ms). A model served in bfloat16 so keeps its weights
once: the step reads the very arrays the prefill does (they were a second, fused and transposed
copy until 2026-11-29: ~190 MiB for Gemma 3 270M). Prefill, and so the label probabilities, stays
on keras-hub's layers in the model's own dtype, its products asking XLA for float32 sums as the
step's do (`compat.float32_accumulation`: XLA's CPU backend otherwise widens both operands of a
bfloat16 product and misses its bfloat16 kernel; a prefill of 32 chats 15.2 -> 9.2 s here).
A model quantized by keras (`quantize("int8")`, `loading/quantize.py`, served so by default) is read
the same way: the step multiplies by its int8 kernels (`Int8Kernel`) as keras's int8 layers do, half
the bytes of bfloat16 a step, and the prefill runs keras's own int8 layers.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import keras
import numpy as np

from pipeline import compat
from pipeline.model.loading.quantize import summed_axes


def empty_cache(backbone, batch: int, length: int, dtype):
    """keras-hub's per-layer (key, value) caches, (B, T, K, H), all zeros: what a prefill writes into."""
    shape = (batch, length, backbone.num_key_value_heads, backbone.head_dim)
    return tuple((jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in range(backbone.num_layers))


def stacked(cache):
    """keras-hub's per-layer (key, value) caches as one (keys, values) pair on a first axis of
    layers, each (L, B, T, K, H): the cache a prefill carries (`forward_cached`)."""
    return tuple(jnp.stack(part) for part in zip(*cache))


def unstacked(cache):
    """A stacked cache's per-layer (key, value) caches, keras-hub's layout."""
    keys, values = cache
    return tuple((keys[number], values[number]) for number in range(keys.shape[0]))


def each_layer(backbone, cache, update):
    """A stacked cache with `update(template, key, value) -> (key, value)` applied to each layer's
    slice, `template` a layer of its kind (`layer_kinds`): one layer at a time, in place (the loop
    carries the cache), so the working memory is a layer's, not a second cache."""
    templates, kinds = layer_kinds(backbone.transformer_layers)
    kinds = jnp.asarray(kinds, "int32")

    def one(number, cache):
        keys, values = cache
        key, value = jax.lax.switch(kinds[number], [functools.partial(update, t) for t in templates],
                                    keys[number], values[number])
        return keys.at[number].set(key), values.at[number].set(value)

    return jax.lax.fori_loop(0, kinds.shape[0], one, cache)


def to_head_major(cache):
    """keras-hub's per-layer (key, value) caches, (B, T, K, H), as this module's (B, K, T, H)."""
    return tuple((jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)) for k, v in cache)


class Int8Kernel(NamedTuple):
    """A kernel as keras's int8 quantization (`quantize("int8")`) keeps it: int8 values and a float32
    scale laid out as the kernel, its summed axes 1; the weight is values / scale."""

    values: Any
    scale: Any

    @property
    def shape(self):
        return self.values.shape


def take_rows(table, ids):
    """Rows `ids` of a (tokens, hidden) table, int8 or not."""
    if isinstance(table, Int8Kernel):
        return Int8Kernel(jnp.take(table.values, ids, axis=0), jnp.take(table.scale, ids, axis=0))
    return jnp.take(table, ids, axis=0)


def vocabulary_table(embedding):
    """The token embedding as a (tokens, hidden) projection table: an `Int8Kernel` where keras
    quantized it to int8, its own array otherwise."""
    quantized = compat.int8_embeddings(embedding)
    if quantized is None:
        return jnp.asarray(embedding.embeddings)
    values, scale = quantized
    return Int8Kernel(values, jnp.asarray(scale, "float32")[:, None])


def step_weights(backbone, dtype="bfloat16"):
    """The one-token step's matrices: the backbone's kernels (LoRA included where enabled) in their
    own layouts, and the token embedding as the vocabulary projection, in `dtype`; those keras
    quantized to int8 as `Int8Kernel`s. Those already in `dtype` (or int8) are the backbone's own
    arrays, not copies: call it outside `jax.jit` (a jitted function's outputs are always new arrays)."""

    def read(dense):
        if dense.quantization_mode == "int8":
            values, scale = compat.int8_kernel(dense)
            return Int8Kernel(values, jnp.asarray(scale, "float32"))
        kernel = jnp.asarray(dense.kernel)
        return kernel if kernel.dtype == dtype else kernel.astype(dtype)

    layers = [{
        "query": read(layer.attention.query_dense),  # (heads, hidden, head_dim)
        "key": read(layer.attention.key_dense),  # (kv_heads, hidden, head_dim)
        "value": read(layer.attention.value_dense),
        "out": read(layer.attention.output_dense),  # (heads, head_dim, hidden)
        "gate": read(layer.gating_ffw),  # (hidden, intermediate)
        "linear": read(layer.gating_ffw_2),
        "down": read(layer.ffw_linear),  # (intermediate, hidden)
    } for layer in backbone.transformer_layers]
    vocabulary = vocabulary_table(backbone.token_embedding)
    if not isinstance(vocabulary, Int8Kernel) and vocabulary.dtype != dtype:
        vocabulary = vocabulary.astype(dtype)
    return {"layers": layers, "vocabulary": vocabulary}


def product(equation, x, weight):
    """`jnp.einsum(equation, x, weight)` in the weight's dtype, accumulating in float32, for `x` with
    its rows first (one token per row in the step) and a weight without them; for an `Int8Kernel`,
    keras's int8 arithmetic (`int8_product`).

    One row is computed as two (the row twice, one result kept). XLA's CPU backend has no
    bfloat16 kernel for a single row's product: it converts the weight to float32 first, and a
    decoding loop hoists those conversions, holding the copies for the loop's life. For the
    vocabulary that was 641 MiB (Gemma 3's 262,144 tokens, ~410 ms against ~50 ms for two rows), met
    by every chat served alone; for the layers' kernels ~390 MB, a one-row loop's working memory.
    Two rows read the bfloat16 kernels themselves: on an AMX Xeon the same speed (a one-row step 35.2
    against 35.5 ms, 34.5 against 34.9) and 325 MiB less at peak for a chat served alone (2026-11-30);
    on an AMD Zen 4 it had been slower (121 against 99 ms a step), when the vocabulary was whole."""
    rows = x.shape[0]
    if rows == 1:
        x = jnp.concatenate([x, x])
    if isinstance(weight, Int8Kernel):
        return int8_product(equation, x, weight)[:rows]
    return jnp.einsum(equation, x.astype(weight.dtype), weight, preferred_element_type=jnp.float32)[:rows]


def int8_product(equation, x, weight: Int8Kernel):
    """keras's int8 `EinsumDense` arithmetic, float32 out: `x` quantized to int8 by its absolute
    maximum over the summed axes (`keras.quantizers.abs_max_quantize`), an int8 product summed in
    int32, both scales divided out. A one-token step reads half the bytes of bfloat16: 18 layers'
    products for two rows 24.5 -> 10.6 ms a step on this CPU (microbenchmark, random weights)."""
    x_values, x_scale = keras.quantizers.abs_max_quantize(x.astype("float32"), axis=summed_axes(equation, 0))
    sums = jnp.einsum(equation, x_values, weight.values, preferred_element_type=jnp.int32)
    # Both scales are 1 on the summed axes, so the same equation lays their product out as the output.
    return sums.astype(jnp.float32) * jnp.einsum(equation, 1 / x_scale, 1 / weight.scale)


def project(x, vocabulary):
    """x @ vocabulary.T, the logits over an (tokens, hidden) table: `product` on x's last axis."""
    return product("...d,vd->...v", x, vocabulary)


def attend(attention, weights, x, cache, index, first):
    """`CachedGemma3Attention` for one token per row at position `index` (each row's positions before
    `first[row]` are padding or another chat's, however the cache holds them); returns the new cache."""
    k_cache, v_cache = cache
    batch = x.shape[0]
    heads, groups, dim = attention.num_query_heads, attention.num_key_value_heads, attention.head_dim
    query = product("btd,ndh->btnh", x, weights["query"])
    key, value = product("btd,kdh->btkh", x, weights["key"]), product("btd,kdh->btkh", x, weights["value"])
    if attention.use_query_key_norm:
        query, key = attention.query_norm(query), attention.key_norm(key)
    query, key = (attention.rope_layer(part, start_index=index) for part in (query, key))
    key = jnp.swapaxes(key, 1, 2).astype(k_cache.dtype)  # (B, K, 1, H)
    value = jnp.swapaxes(value, 1, 2).astype(v_cache.dtype)
    scale = 1 / np.sqrt(attention.head_dim if attention.query_head_dim_normalize
                        else attention.hidden_dim // attention.num_query_heads)
    query = (query * scale).reshape(batch, groups, heads // groups, dim)
    position, slot = slot_positions(k_cache.shape[2], index)
    # Both attention products read the cache in its own dtype and add up in float32: a query in
    # another dtype (or an output left in bfloat16) had XLA convert the whole cache on every step,
    # 18 layers' attention 76 -> 22 ms a step for 8 rows (a model served in bfloat16, this CPU).
    query = query.astype(k_cache.dtype)
    logits = jnp.concatenate([jnp.einsum("bkgh,bkth->bkgt", query, k_cache, preferred_element_type=jnp.float32),
                              jnp.einsum("bkgh,bkth->bkgt", query, key, preferred_element_type=jnp.float32)], axis=-1)
    if attention.logit_soft_cap is not None:
        logits = jnp.tanh(logits / attention.logit_soft_cap) * attention.logit_soft_cap
    # the cache before this step; the new token is appended
    allowed = (position[None, :] >= jnp.reshape(first, (-1, 1))) & (position < index)[None, :]
    if attention.use_sliding_window_attention:
        allowed &= (index - position < attention.sliding_window_size)[None, :]
    allowed = jnp.concatenate([jnp.broadcast_to(allowed, (batch, k_cache.shape[2])), jnp.ones((batch, 1), bool)],
                              axis=-1)
    shares = jax.nn.softmax(jnp.where(allowed[:, None, None, :], logits.astype("float32"), -1e9), axis=-1)
    shares = shares.astype(v_cache.dtype)
    out = (jnp.einsum("bkgt,bkth->bkgh", shares[..., :-1], v_cache, preferred_element_type=jnp.float32)
           + shares[..., -1:] * value)
    out = product("btnh,nhd->btd", out.reshape(batch, 1, heads, dim), weights["out"])
    k_cache = jax.lax.dynamic_update_slice(k_cache, key, (0, 0, slot, 0))
    v_cache = jax.lax.dynamic_update_slice(v_cache, value, (0, 0, slot, 0))
    return out, (k_cache, v_cache)


def slot_positions(width, index):
    """The position each of a cache's `width` slots holds when the step at `index` reads it (negative:
    never written), and the slot that step writes. Every decoding cache is a ring: position p at
    slot p % width, the latest such p before `index`. Below `width` that is slot = position (a
    plain cache); a sliding-window layer's ring is its window (`decoding_slots`), so a step
    reads only the window; the others' as wide as a row's prompt and tokens, so a loop's rows may
    go on past it (`one_pass`: chats join as others finish)."""
    slots = jnp.arange(width)
    return index - 1 - jnp.mod(index - 1 - slots, width), jnp.mod(index, width)


def decoding_cache(backbone, cache, steps):
    """The head-major cache a decoding loop writes `steps` more tokens into, from the one of the
    positions so far (`ring_layer_cache`, layer by layer)."""
    return tuple(ring_layer_cache(layer, k, v, k.shape[2] + steps, k.shape[2])
                 for layer, (k, v) in zip(backbone.transformer_layers, cache))


def decoding_slots(layer, width: int) -> int:
    """The slots of a layer's decoding cache for `width` positions (`slot_positions`): a
    sliding-window layer that would outgrow its window keeps a ring of it."""
    attention = layer.attention
    if attention.use_sliding_window_attention and width > attention.sliding_window_size:
        return attention.sliding_window_size
    return width


def empty_decoding_cache(backbone, batch: int, width: int, dtype):
    """A decoding loop's head-major cache for `width` positions a row, all zeros (`decoding_slots`):
    what prefilled rows are written into (`one_pass`)."""
    return tuple((jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for shape in (
        (batch, backbone.num_key_value_heads, decoding_slots(layer, width), backbone.head_dim)
        for layer in backbone.transformer_layers))


def ring_layer_cache(layer, k, v, width, end):
    """One layer's head-major cache (B, K, T, H) of positions end - T .. end - 1, laid out as the ring
    a decoding loop for `width` positions a row reads at position `end` (`decoding_slots`,
    `slot_positions`): a sliding-window layer's ring holds the last of them that its window sees.
    Slots of positions before them hold copies of the first, which the loop masks."""
    positions, _ = slot_positions(decoding_slots(layer, width), end)
    taken = jnp.clip(positions - (end - k.shape[2]), 0, k.shape[2] - 1)
    return jnp.take(k, taken, axis=2), jnp.take(v, taken, axis=2)


def decoder_block(layer, weights, x, cache, index, first):
    """`Gemma3DecoderBlock` (text only) for one token per row."""
    attended, cache = attend(layer.attention, weights, layer.pre_attention_norm(x), cache, index, first)
    if layer.use_post_attention_norm:
        attended = layer.post_attention_norm(attended)
    x = x + attended
    normed = layer.pre_ffw_norm(x)
    gate, linear = product("btd,df->btf", normed, weights["gate"]), product("btd,df->btf", normed, weights["linear"])
    y = product("btf,fd->btd", keras.activations.gelu(gate, approximate=True) * linear, weights["down"])
    if layer.use_post_ffw_norm:
        y = layer.post_ffw_norm(y)
    return x + y, cache


def shift_positions(backbone, cache, offset):
    """A stacked cache (`stacked`) with every key rotated `offset` positions on (one for all rows,
    or one per row): the cache a prefill at `cache_update_index=offset` would have written (rotary
    angles add), so a group of prompts can join a decoding loop at its position. Values carry no
    position."""
    return each_layer(backbone, cache, lambda layer, key, value: (rotated(layer, key, offset), value))


def rotated(layer, key, offset):
    """One layer's keys (B, T, K, H) rotated `offset` positions on (one for all rows, or one per
    row) by its own rotary embedding: rotary angles add."""
    rope = layer.attention.rope_layer
    if getattr(rope, "rope_type", "linear") != "linear":  # YaRN also scales magnitudes: no simple shift
        raise ValueError(f"cannot shift keys under {rope.rope_type} rotary embeddings")
    positions = jnp.broadcast_to(jnp.reshape(jnp.asarray(offset, "int32"), (-1, 1)), key.shape[:2])
    return rope(key, positions=positions).astype(key.dtype)


def right_aligned(backbone, cache, padding, length):
    """A stacked cache (`stacked`) whose rows were written from slot 0 and end `padding` (one per
    row) short of `length`, moved on by that much within the first `length` slots, keys rotated on
    as far: the cache a left-padded prefill of the same rows would have written (the slots moved in
    front hold only padding, which the mask hides)."""
    slots = jnp.mod(jnp.arange(length)[None, :] - padding[:, None], length)[:, :, None, None]

    def move(x):
        return jnp.concatenate([jnp.take_along_axis(x[:, :length], slots, axis=1), x[:, length:]], axis=1)

    return each_layer(backbone, cache, lambda layer, key, value: (rotated(layer, move(key), padding), move(value)))


def embed(backbone, token_ids):
    """Gemma's scaled token embeddings: keras's lookup (`Embedding.call`), with the table tied to the
    ids by an optimisation barrier. XLA's CPU backend gathers bfloat16 rows from a float32
    conversion of the table; in the decoding loop it hoisted that conversion out of the loop, a
    float32 copy of the whole vocabulary (671 MB for Gemma 3) made on every call. Tied to the ids,
    which change every step, only the rows gathered are converted. The same values either way."""
    embedding = backbone.token_embedding
    quantized = compat.int8_embeddings(embedding)
    if quantized is None:
        table, token_ids = jax.lax.optimization_barrier((embedding.embeddings.value, token_ids))
        x = jnp.take(table, token_ids, axis=0).astype(embedding.compute_dtype)
    else:  # keras's int8 lookup: the rows over their scales
        (table, scale), token_ids = jax.lax.optimization_barrier((quantized, token_ids))
        x = (jnp.take(table, token_ids, axis=0).astype("float32")
             / jnp.take(scale, token_ids, axis=0).astype("float32")[..., None]).astype(embedding.compute_dtype)
    return x * jnp.sqrt(jnp.asarray(backbone.hidden_dim, x.dtype))


def forward_cached(backbone, token_ids, cache, index, key_mask):
    """Final hidden states of `token_ids` written at `index` of a stacked cache (`stacked`: keras-hub's
    (B, T, K, H) caches on a first axis of layers), through keras-hub's layers (the prefill); no
    vocabulary projection.

    The layers run under one `jax.lax.scan`, not one after another: each step picks its layer's
    weights (`jax.lax.switch`, a copy of that layer's ~11 MB) and runs one layer of its kind (a
    sliding-window one or a global one; `layer_kinds`) on them. An XLA program so holds two layers'
    code, not 18: unrolled, a prefill (prompt and head, 36 layer runs) had 2,041 fusions and held
    111-135 MiB (33-53 now), and bringing one back (traced through keras-hub again, lowered, read
    from XLA's cache) took ~3 s. The same arithmetic, layer by layer. The scan carries the stacked
    cache and writes each layer's slice back in place: given per-layer caches, it stacked them for
    the scan and unstacked them after, copies of the whole cache (8 chats of 384 tokens of Gemma 3
    270M: 52 -> 226 MiB of working memory). Its products sum in float32 on XLA's bfloat16 kernel
    (`compat.float32_accumulation`, see the module's docstring)."""
    x = embed(backbone, token_ids)
    layers = backbone.transformer_layers
    templates, kinds = layer_kinds(layers)
    weights = [tuple(variable.value for variable in layer.variables) for layer in layers]  # in the caller's scope

    def run(template, layer_weights, x, layer_cache):
        scope = keras.StatelessScope(state_mapping=zip(template.variables, layer_weights))
        with scope, compat.float32_accumulation():
            return template(x, cache=layer_cache, cache_update_index=index, padding_mask=key_mask)

    def layer_step(carry, scanned):
        x, keys, values = carry
        number, kind = scanned
        layer_weights = jax.lax.switch(number, [functools.partial(lambda w: w, w) for w in weights])
        x, (key, value) = jax.lax.switch(kind, [functools.partial(run, t) for t in templates],
                                         layer_weights, x, (keys[number], values[number]))
        return (x, keys.at[number].set(key), values.at[number].set(value)), None

    (x, keys, values), _ = jax.lax.scan(layer_step, (x, *cache), (jnp.arange(len(layers)), jnp.asarray(kinds, "int32")))
    return backbone.layer_norm(x), (keys, values)


def layer_kinds(layers):
    """The distinct kinds of layers (those whose configurations differ only in name and whose weights
    have the same shapes: Gemma 3's sliding-window and global ones), one of each as its template, and
    each layer's kind."""
    configs, templates, kinds = [], [], []
    for layer in layers:
        config = ({key: value for key, value in layer.get_config().items() if key != "name"},
                  [(tuple(variable.shape), str(variable.dtype)) for variable in layer.variables])  # LoRA or not
        if config not in configs:
            configs.append(config)
            templates.append(layer)
        kinds.append(configs.index(config))
    return templates, kinds


def forward_one(backbone, weights, token_ids, cache, index, first):
    """Next-token logits (B, V), float32, of one token per row written at `index` of a head-major
    cache (`to_head_major`, or the `decoding_cache` made from one), through `step_weights`, each row
    reading its positions from `first[row]` on (one for all rows, or one each); and the new cache."""
    x = embed(backbone, token_ids)
    caches = []
    for layer, layer_weights, layer_cache in zip(backbone.transformer_layers, weights["layers"], cache):
        x, layer_cache = decoder_block(layer, layer_weights, x, layer_cache, index, first)
        caches.append(layer_cache)
    logits = project(backbone.layer_norm(x)[:, 0, :], weights["vocabulary"])
    return vocabulary_logits(backbone.token_embedding, logits), tuple(caches)


def vocabulary_logits(embedding, logits):
    """The token embedding's logit soft cap, where it has one, on logits projected without it."""
    cap = embedding.logit_soft_cap
    return logits if cap is None else jnp.tanh(logits / cap) * cap
