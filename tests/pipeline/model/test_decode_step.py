"""The one-token decoding step against keras-hub's own cached layers, on a tiny random Gemma 3."""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
import pytest

from pipeline.model.decoding.step import (
    decoding_cache,
    forward_cached,
    forward_one,
    step_weights,
    stacked,
    to_head_major,
    unstacked,
)


def tiny_backbone(seed: int, num_layers: int):
    """A tiny random float32 Gemma 3, with a sliding window of 4 so that a decoded position sees only
    part of the cache on those layers (Gemma 3's every sixth layer attends to everything)."""
    import keras
    import keras_hub

    keras.utils.set_random_seed(seed)
    return keras_hub.models.Gemma3Backbone(
        vocabulary_size=64, image_size=None, num_layers=num_layers, num_query_heads=4, num_key_value_heads=2,
        hidden_dim=32, intermediate_dim=64, head_dim=8, query_head_dim_normalize=True, use_query_key_norm=True,
        use_post_ffw_norm=True, use_post_attention_norm=True, attention_logit_soft_cap=None,
        final_logit_soft_cap=None, use_sliding_window_attention=True, sliding_window_size=4, dtype="float32")


@pytest.fixture(scope="module")
def backbone():
    return tiny_backbone(seed=3, num_layers=2)


def prefilled(backbone, tokens, cache, index, key_mask):
    """`forward_cached` (which carries a stacked cache) on keras-hub's per-layer caches."""
    hidden, new_cache = forward_cached(backbone, tokens, stacked(cache), index, key_mask)
    return hidden, unstacked(new_cache)


def random_cache(backbone, rng, batch, length):
    shape = (batch, length, backbone.num_key_value_heads, backbone.head_dim)
    return tuple((jnp.asarray(rng.normal(size=shape), "float32"), jnp.asarray(rng.normal(size=shape), "float32"))
                 for _ in range(backbone.num_layers))


@pytest.mark.parametrize("index", [2, 9])  # inside the window, and past it
def test_a_decoding_step_equals_keras_hubs_cached_layers(backbone, index):
    rng = np.random.default_rng(0)
    batch, length = 3, 12
    cache = random_cache(backbone, rng, batch, length)
    key_mask = jnp.asarray(np.arange(length)[None, :] >= np.array([[0], [1], [2]]))  # left padding
    tokens = jnp.asarray(rng.integers(0, 64, (batch, 1)), "int32")

    expected, expected_cache = prefilled(backbone, tokens, cache, index, key_mask)  # keras-hub's layers
    logits, new_cache = forward_one(backbone, step_weights(backbone, "float32"), tokens, to_head_major(cache), index,
                                    first=jnp.arange(batch))  # the same left padding

    expected_logits = backbone.token_embedding(expected, reverse=True)[:, 0, :]
    np.testing.assert_allclose(np.asarray(logits), np.asarray(expected_logits), rtol=1e-4, atol=1e-4)
    for (k, v), (k_ref, v_ref) in zip(to_head_major(new_cache), expected_cache):  # swapping back is its inverse
        np.testing.assert_allclose(np.asarray(k), np.asarray(k_ref), atol=1e-5)
        np.testing.assert_allclose(np.asarray(v), np.asarray(v_ref), atol=1e-5)


@pytest.mark.parametrize("filled", [2, 6])  # the ring starts part empty, and full
def test_decoding_on_a_ring_of_the_window_equals_keras_hubs_cached_layers(backbone, filled):
    """`decoding_cache` keeps the sliding-window layers' caches as a ring of their window: step after
    step, past the window's width, the logits are keras-hub's on its whole cache."""
    rng = np.random.default_rng(4)
    batch, steps = 3, 7
    length = filled + steps
    cache = random_cache(backbone, rng, batch, length)
    key_mask = jnp.asarray(np.arange(length)[None, :] >= np.array([[0], [1], [2]]))  # left padding
    ring = decoding_cache(backbone, tuple((k[:, :, :filled], v[:, :, :filled]) for k, v in to_head_major(cache)), steps)
    sliding = [layer.attention.use_sliding_window_attention for layer in backbone.transformer_layers]
    assert [k.shape[2] for k, _ in ring] == [4 if s else length for s in sliding] and any(sliding)
    weights = step_weights(backbone, "float32")
    for index in range(filled, length):
        tokens = jnp.asarray(rng.integers(0, 64, (batch, 1)), "int32")
        expected, cache = prefilled(backbone, tokens, cache, index, key_mask)
        logits, ring = forward_one(backbone, weights, tokens, ring, index, first=jnp.arange(batch))
        expected_logits = backbone.token_embedding(expected, reverse=True)[:, 0, :]
        np.testing.assert_allclose(np.asarray(logits), np.asarray(expected_logits), rtol=1e-4, atol=1e-4)


def test_the_sliding_window_is_applied(backbone):
    """A key outside the window must not change the step: without the window term it would."""
    rng = np.random.default_rng(1)
    shape = (1, 12, backbone.num_key_value_heads, backbone.head_dim)
    cache = [(jnp.asarray(rng.normal(size=shape), "float32"), jnp.asarray(rng.normal(size=shape), "float32"))
             for _ in range(backbone.num_layers)]
    token = jnp.asarray([[5]], "int32")
    weights = step_weights(backbone, "float32")
    before, _ = forward_one(backbone, weights, token, to_head_major(tuple(cache)), 9, first=0)
    changed = [(k.at[0, 0].set(100.0), v.at[0, 0].set(100.0)) for k, v in cache]  # position 0: 9 back, > 4
    after, _ = forward_one(backbone, weights, token, to_head_major(tuple(changed)), 9, first=0)
    np.testing.assert_allclose(np.asarray(after), np.asarray(before), atol=1e-6)


def test_bfloat16_step_weights_keep_the_step_close_to_float32(backbone):
    """The shipped step reads its matrices in bfloat16 (accumulating in float32): a rounding of the
    weights, not a different model."""
    rng = np.random.default_rng(2)
    cache = to_head_major(random_cache(backbone, rng, 3, 12))
    tokens = jnp.asarray(rng.integers(0, 64, (3, 1)), "int32")
    exact, exact_cache = forward_one(backbone, step_weights(backbone, "float32"), tokens, cache, 9, first=0)
    rounded, rounded_cache = forward_one(backbone, step_weights(backbone), tokens, cache, 9, first=0)
    assert step_weights(backbone)["vocabulary"].dtype == jnp.bfloat16 and rounded.dtype == jnp.float32
    spread = float(jnp.std(exact))
    np.testing.assert_allclose(np.asarray(rounded), np.asarray(exact), atol=0.02 * spread)
    assert not np.array_equal(np.asarray(rounded), np.asarray(exact))  # it did round
    for (k, v), (k_ref, v_ref) in zip(rounded_cache, exact_cache):
        np.testing.assert_allclose(np.asarray(k), np.asarray(k_ref), atol=0.05)
        np.testing.assert_allclose(np.asarray(v), np.asarray(v_ref), atol=0.05)


def test_a_bfloat16_cache_is_read_as_it_is_and_the_step_stays_close(backbone):
    """Attention reads a bfloat16 cache (a model served in bfloat16) in its own dtype, adding up in
    float32: a query of another dtype had XLA convert every layer's whole cache on every step, three
    quarters of the attention's time on this CPU. The step still gives the float32 cache's logits."""
    import jax

    rng = np.random.default_rng(5)
    batch, length = 3, 12
    cache = to_head_major(random_cache(backbone, rng, batch, length))
    halved = tuple((k.astype("bfloat16"), v.astype("bfloat16")) for k, v in cache)
    tokens = jnp.asarray(rng.integers(0, 64, (batch, 1)), "int32")
    weights = step_weights(backbone)
    program = jax.jit(lambda c: forward_one(backbone, weights, tokens, c, 9, 0)).lower(halved).as_text()
    shape = "x".join(map(str, halved[0][0].shape))
    assert f"tensor<{shape}xbf16>) -> tensor<{shape}xf32>" not in program  # no conversion of a cache
    exact, _ = forward_one(backbone, weights, tokens, cache, 9, 0)
    read, _ = forward_one(backbone, weights, tokens, halved, 9, 0)
    np.testing.assert_allclose(np.asarray(read), np.asarray(exact), atol=0.1 * float(jnp.std(exact)))


@pytest.mark.slow
def test_a_decoding_loop_makes_no_float32_copy_of_a_bfloat16_vocabulary():
    """XLA's CPU backend gathers bfloat16 embedding rows from a float32 conversion of the table, and
    in a loop it hoisted that conversion out: a float32 copy of the whole vocabulary (671 MB for
    Gemma 3 270M) made on every call of the decoding loop, about a fifth of serving's peak memory. `embed`
    ties the table to the ids, so only the rows gathered are converted; the rows are keras-hub's.
    The conversion only shows at the real vocabulary's size (random weights, one layer)."""
    import jax
    import keras
    import keras_hub

    from pipeline.model.decoding.step import embed

    keras.utils.set_random_seed(4)
    vocabulary, hidden = 262_144, 640
    backbone = keras_hub.models.Gemma3Backbone(
        vocabulary_size=vocabulary, image_size=None, num_layers=1, num_query_heads=4, num_key_value_heads=1,
        hidden_dim=hidden, intermediate_dim=64, head_dim=256, query_head_dim_normalize=True,
        use_query_key_norm=True, use_post_ffw_norm=True, use_post_attention_norm=True,
        attention_logit_soft_cap=None, final_logit_soft_cap=None, dtype="bfloat16")
    ids = jnp.asarray([[1], [5], [9]], "int32")

    def loop(ids):  # the next ids from the rows, as a decoding loop's next tokens come from them
        def body(i, ids):
            rows = embed(backbone, ids).astype("float32")
            return (ids * 7 + (rows.sum(-1) > 0).astype("int32") + i) % vocabulary
        return jax.lax.fori_loop(0, 4, body, ids)

    program = jax.jit(loop).lower(ids).compile().as_text()
    carried = [line for line in program.splitlines() if " while(" in line]
    assert carried and not any(f"f32[{vocabulary},{hidden}]" in line for line in carried)
    expected = backbone.token_embedding(ids) * jnp.sqrt(jnp.asarray(hidden, "bfloat16"))
    np.testing.assert_array_equal(np.asarray(embed(backbone, ids), "float32"), np.asarray(expected, "float32"))


def test_a_prefill_widens_one_layers_kernels_at_a_time(model_cache, monkeypatch):
    """XLA's CPU backend widens bfloat16 kernels to float32 for a prefill's matrix products. The
    prefill runs the layers twice (the prompt, then the label and the summary cue), and in one
    computation XLA shared each widened kernel between the two runs: every layer's was held from
    the first to the second (~390 MiB for Gemma 3 270M, whatever the batch). The second run is now
    a computation of its own, and the working memory holds about one layer's (random weights with
    wide feed-forward layers, the real tokenizer). The outputs are unchanged: the decoder's other
    tests compare them with plain greedy decoding."""
    import jax

    from pipeline.corpus import DATA_DIR, load_examples
    from pipeline.model.decoding import one_pass
    from pipeline.model.decoding.programs import Programs
    from tests.support.models import tiny_gemma_lm

    layers, hidden, intermediate = 8, 64, 16_384  # the feed-forward kernels dominate the weights
    lm = tiny_gemma_lm(model_cache, seed=6, dtype="bfloat16", num_layers=layers, hidden_dim=hidden,
                       intermediate_dim=intermediate, head_dim=32)

    temps = []

    class Measured(Programs):  # the real programs, their working memory read as they are compiled
        def jit(self, function, **options):
            call = super().jit(function, **options)

            def measured(*args, **static):
                if function.__name__ == "prefill":
                    compiled = jax.jit(function, **options).lower(*args, **static).compile()
                    temps.append(compiled.memory_analysis().temp_size_in_bytes)
                return call(*args, **static)
            measured.holds = call.holds
            return measured

    monkeypatch.setattr(one_pass, "Programs", Measured)
    window = load_examples(DATA_DIR / "v2" / "train.jsonl")[0].window
    output, = one_pass.OnePassDecoder(lm, summary_tokens=3, reply_tokens=2).run([window], "all")
    assert output.summary_tokens + output.reply_tokens > 0
    widened_kernels = layers * 3 * hidden * intermediate * 4  # float32 bytes of the feed-forward kernels
    assert temps and max(temps) < widened_kernels / 2  # 131 MB before, 38 MB now


def test_one_rows_vocabulary_projection_makes_no_float32_copy_of_the_table():
    """For a single row XLA's CPU backend multiplies by a float32 conversion of the whole bfloat16
    table (641 MiB for Gemma 3 270M's vocabulary; a decoding loop hoists it and holds it), which
    every chat served alone met. `project` computes one row as two; a chat alone gets the logits it
    gets beside another chat. The conversion only shows at the real vocabulary's size (random values)."""
    import jax

    from pipeline.model.decoding.step import project

    vocabulary, hidden = 262_144, 640
    keys = jax.random.split(jax.random.PRNGKey(5), 3)
    table = jax.random.normal(keys[0], (vocabulary, hidden), "bfloat16")
    row = jax.random.normal(keys[1], (1, 1, hidden), "float32")  # the prefill's last position of one chat
    compiled = jax.jit(project).lower(row, table).compile()
    assert f"f32[{vocabulary},{hidden}]" not in compiled.as_text()
    assert compiled.memory_analysis().temp_size_in_bytes < 16 * 2**20
    logits = project(row, table)
    assert logits.shape == (1, 1, vocabulary)
    beside_another = project(jnp.concatenate([row, jax.random.normal(keys[2], row.shape, "float32")]), table)
    np.testing.assert_array_equal(np.asarray(logits), np.asarray(beside_another[:1]))


def test_one_rows_layer_products_make_no_float32_copy_of_their_kernels():
    """The same for the layers' kernels (`product`): for one row XLA converted each to float32, and a
    decoding loop held those copies (~390 MB for Gemma 3 270M's 18 layers) for its life."""
    import jax

    from pipeline.model.decoding.step import product

    keys = jax.random.split(jax.random.PRNGKey(6), 3)
    kernel = jax.random.normal(keys[0], (640, 2048), "bfloat16")  # a feed-forward gate's shape
    row = jax.random.normal(keys[1], (1, 1, 640), "float32")
    text = jax.jit(functools.partial(product, "btd,df->btf")).lower(row, kernel).compile().as_text()
    assert "f32[640,2048]" not in text
    alone = product("btd,df->btf", row, kernel)
    beside_another = product("btd,df->btf", jnp.concatenate([row, jax.random.normal(keys[2], row.shape)]), kernel)
    np.testing.assert_array_equal(np.asarray(alone), np.asarray(beside_another[:1]))


def test_a_model_served_in_the_steps_dtype_keeps_its_weights_once(model_cache):
    """The step reads the backbone's own kernels, in their own layouts: for a model already in the
    step's dtype (serving's bfloat16) they are the very arrays the prefill reads, not a second,
    transposed copy (~190 MiB for Gemma 3 270M); only another dtype makes a copy. The one-pass
    decoder builds them outside jit, whose outputs would always be new arrays."""
    from pipeline.model.decoding.one_pass import OnePassDecoder
    from tests.support.models import tiny_gemma_lm

    lm = tiny_gemma_lm(model_cache, dtype="bfloat16")
    backbone = lm.backbone
    own = {id(v.value) for v in backbone.weights}
    weights = step_weights(backbone)
    arrays = [weights["vocabulary"], *(a for layer in weights["layers"] for a in layer.values())]
    assert all(id(a) in own for a in arrays)
    assert not any(id(a) in own for layer in step_weights(backbone, "float32")["layers"] for a in layer.values())

    decoder = OnePassDecoder(lm)
    state = decoder._state()
    held = {id(a) for part in state for a in part}
    served = decoder._weights(state)
    assert all(id(a) in held for a in [served["vocabulary"], *(a for layer in served["layers"] for a in layer.values())])


def test_the_prefills_scan_over_layers_equals_keras_hubs_layers_one_after_another():
    """`forward_cached` runs the layers under one scan, each step a layer of its kind on its own
    weights: the same hidden states and cache as the layers called in turn, on a backbone with
    both kinds (Gemma 3's sixth layer attends to everything, the others to a window)."""
    from pipeline.model.decoding.step import embed, layer_kinds

    backbone = tiny_backbone(seed=5, num_layers=7)
    templates, kinds = layer_kinds(backbone.transformer_layers)
    assert kinds == [0, 0, 0, 0, 0, 1, 0] and len(templates) == 2

    rng = np.random.default_rng(6)
    batch, length, index = 2, 12, 3
    cache = random_cache(backbone, rng, batch, length)
    key_mask = jnp.asarray(np.arange(length)[None, :] >= np.array([[0], [2]]))
    tokens = jnp.asarray(rng.integers(0, 64, (batch, 6)), "int32")
    x, expected_cache = embed(backbone, tokens), []
    for layer, layer_cache in zip(backbone.transformer_layers, cache):
        x, layer_cache = layer(x, cache=layer_cache, cache_update_index=index, padding_mask=key_mask)
        expected_cache.append(layer_cache)

    hidden, new_cache = prefilled(backbone, tokens, cache, index, key_mask)
    np.testing.assert_allclose(np.asarray(hidden), np.asarray(backbone.layer_norm(x)), rtol=1e-5, atol=1e-5)
    for (k, v), (k_ref, v_ref) in zip(new_cache, expected_cache, strict=True):
        np.testing.assert_allclose(np.asarray(k), np.asarray(k_ref), atol=1e-5)
        np.testing.assert_allclose(np.asarray(v), np.asarray(v_ref), atol=1e-5)


def test_a_prefill_writes_its_stacked_cache_in_place():
    """The prefill's scan carries the cache stacked on a first axis of layers and writes each layer's
    slice back in place, and moving rows and rotating their keys (`right_aligned`) go
    a layer at a time: the working memory is a layer's, not the cache's. Given per-layer caches, the
    scan stacked them and unstacked them after (8 chats of 384 tokens of Gemma 3 270M: 226 MiB of
    working memory, 52 of them the cache's own size)."""
    import jax

    from pipeline.model.decoding.step import empty_cache, right_aligned

    backbone = tiny_backbone(seed=9, num_layers=12)
    batch, length, new = 4, 512, 8
    cache = stacked(empty_cache(backbone, batch, length, "float32"))
    tokens = jnp.zeros((batch, new), "int32")
    key_mask = jnp.ones((batch, length), bool)
    padding = jnp.arange(batch)

    def prefill(tokens, cache):
        hidden, cache = forward_cached(backbone, tokens, cache, 0, key_mask)
        return hidden, right_aligned(backbone, cache, padding, new)

    compiled = jax.jit(prefill).lower(tokens, cache).compile()
    cache_bytes = sum(part.nbytes for part in cache)
    assert compiled.memory_analysis().temp_size_in_bytes < cache_bytes / 2  # 2.2 times it, stacked and unstacked
    hidden, written = compiled(tokens, cache)
    assert all(part.shape == (12, batch, length, 2, 8) for part in written)


def test_an_int8_step_equals_keras_int8_layers():
    """A backbone quantized by keras's `quantize("int8")` (`quantize_int8`): the step reads its int8
    kernels and scales as they are (`Int8Kernel`, the layers' own arrays) and computes what keras's
    int8 layers compute, cached prefill and vocabulary projection included."""
    from pipeline.model.decoding.step import Int8Kernel
    from pipeline.model.loading.quantize import quantize_int8

    backbone = tiny_backbone(seed=7, num_layers=2)
    rng = np.random.default_rng(8)
    batch, length, index = 3, 12, 9
    cache = random_cache(backbone, rng, batch, length)
    key_mask = jnp.asarray(np.arange(length)[None, :] >= np.array([[0], [1], [2]]))
    tokens = jnp.asarray(rng.integers(0, 64, (batch, 1)), "int32")
    before = backbone.token_embedding(prefilled(backbone, tokens, cache, index, key_mask)[0], reverse=True)

    quantize_int8(backbone)
    weights = step_weights(backbone, "float32")
    own = {id(v.value) for v in backbone.weights}
    kernels = [weights["vocabulary"], *(k for layer in weights["layers"] for k in layer.values())]
    assert all(isinstance(k, Int8Kernel) and k.values.dtype == jnp.int8 and id(k.values) in own for k in kernels)

    expected, expected_cache = prefilled(backbone, tokens, cache, index, key_mask)  # keras's int8 layers
    expected_logits = backbone.token_embedding(expected, reverse=True)[:, 0, :]
    logits, new_cache = forward_one(backbone, weights, tokens, to_head_major(cache), index, first=jnp.arange(batch))
    np.testing.assert_allclose(np.asarray(logits), np.asarray(expected_logits), rtol=1e-4, atol=1e-4)
    for (k, v), (k_ref, v_ref) in zip(to_head_major(new_cache), expected_cache):
        np.testing.assert_allclose(np.asarray(k), np.asarray(k_ref), atol=1e-4)
        np.testing.assert_allclose(np.asarray(v), np.asarray(v_ref), atol=1e-4)
    # int8 moves the logits by its rounding, not more
    np.testing.assert_allclose(np.asarray(expected_logits), np.asarray(before[:, 0, :]), atol=0.05)
    assert not np.array_equal(np.asarray(expected_logits), np.asarray(before[:, 0, :]))
