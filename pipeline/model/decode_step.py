"""One decoding step through a keras-hub Gemma 3 backbone: one new token per row, on a head-major cache.

keras-hub's cached attention keeps the cache as (batch, time, kv_heads, head_dim) and writes the
new key and value into it before reading it back. Inside a `jax.lax.while_loop` on CPU, XLA then
copies every layer's whole cache on every step (the read and the in-place write overlap), and the
attention einsums transpose it again: at a few hundred cached positions that was more than the
weights' own reads. Here the cache is (batch, kv_heads, time, head_dim), attention reads the cache
as it was before this step plus the new key and value on their own, and the write comes last.
The arithmetic is keras-hub's (same sublayers, the same masks: padding, causal, sliding window);
only the order of the sums differs. Prefill stays on keras-hub's layers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import keras
import numpy as np


def to_head_major(cache):
    """keras-hub's per-layer (key, value) caches, (B, T, K, H), as this module's (B, K, T, H)."""
    return tuple((jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)) for k, v in cache)


def attend(attention, x, cache, index, key_mask):
    """`CachedGemma3Attention` for one token per row at cache position `index`; returns the new cache."""
    k_cache, v_cache = cache
    query, key = attention.query_dense(x), attention.key_dense(x)
    if attention.use_query_key_norm:
        query, key = attention.query_norm(query), attention.key_norm(key)
    query, key = attention._apply_rope(query, index), attention._apply_rope(key, index)
    key = jnp.swapaxes(key, 1, 2).astype(k_cache.dtype)  # (B, K, 1, H)
    value = jnp.swapaxes(attention.value_dense(x), 1, 2).astype(v_cache.dtype)
    batch, _, heads, dim = query.shape
    groups = attention.num_key_value_heads
    scale = 1 / np.sqrt(attention.head_dim if attention.query_head_dim_normalize
                        else attention.hidden_dim // attention.num_query_heads)
    query = (query * scale).reshape(batch, groups, heads // groups, dim)
    logits = jnp.concatenate([jnp.einsum("bkgh,bkth->bkgt", query, k_cache),
                              jnp.einsum("bkgh,bkth->bkgt", query, key)], axis=-1)
    if attention.logit_soft_cap is not None:
        logits = jnp.tanh(logits / attention.logit_soft_cap) * attention.logit_soft_cap
    position = jnp.arange(k_cache.shape[2])
    allowed = key_mask & (position < index)  # the cache before this step; the new token is appended
    if attention.use_sliding_window_attention:
        allowed &= index - position < attention.sliding_window_size
    allowed = jnp.concatenate([allowed, jnp.ones((batch, 1), bool)], axis=-1)
    weights = jax.nn.softmax(jnp.where(allowed[:, None, None, :], logits.astype("float32"), -1e9), axis=-1)
    weights = weights.astype(v_cache.dtype)
    out = jnp.einsum("bkgt,bkth->bkgh", weights[..., :-1], v_cache) + weights[..., -1:] * value
    out = attention.output_dense(out.reshape(batch, 1, heads, dim))
    k_cache = jax.lax.dynamic_update_slice(k_cache, key, (0, 0, index, 0))
    v_cache = jax.lax.dynamic_update_slice(v_cache, value, (0, 0, index, 0))
    return out, (k_cache, v_cache)


def decoder_block(layer, x, cache, index, key_mask):
    """`Gemma3DecoderBlock` (text only) for one token per row."""
    attended, cache = attend(layer.attention, layer.pre_attention_norm(x), cache, index, key_mask)
    if layer.use_post_attention_norm:
        attended = layer.post_attention_norm(attended)
    x = x + attended
    normed = layer.pre_ffw_norm(x)
    y = layer.ffw_linear(keras.activations.gelu(layer.gating_ffw(normed), approximate=True)
                         * layer.gating_ffw_2(normed))
    if layer.use_post_ffw_norm:
        y = layer.post_ffw_norm(y)
    return x + y, cache


def embed(backbone, token_ids):
    """Gemma's scaled token embeddings."""
    x = backbone.token_embedding(token_ids)
    return x * jnp.sqrt(jnp.asarray(backbone.hidden_dim, x.dtype))


def forward_cached(backbone, token_ids, cache, index, key_mask):
    """Final hidden states of `token_ids` written at `index` of keras-hub's own (B, T, K, H) cache,
    through keras-hub's layers (the prefill); no vocabulary projection."""
    x = embed(backbone, token_ids)
    caches = []
    for layer, layer_cache in zip(backbone.transformer_layers, cache):
        x, layer_cache = layer(x, cache=layer_cache, cache_update_index=index, padding_mask=key_mask)
        caches.append(layer_cache)
    return backbone.layer_norm(x), tuple(caches)


def forward_one(backbone, token_ids, cache, index, key_mask):
    """Final hidden states (B, 1, D) of one token per row written at `index` of a head-major cache
    (`to_head_major`); no vocabulary projection."""
    x = embed(backbone, token_ids)
    caches = []
    for layer, layer_cache in zip(backbone.transformer_layers, cache):
        x, layer_cache = decoder_block(layer, x, layer_cache, index, key_mask)
        caches.append(layer_cache)
    return backbone.layer_norm(x), tuple(caches)
