"""The model as a pure function: its variables' values as explicit state, and the one helper that
runs keras code on them (as keras-hub's own jitted generate does); plus the tokenizer's two
directions as plain lists and strings. Shared by both engines and the trainer."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import keras

if keras.config.backend() != "jax":  # the programs here are JAX's; keras picks its backend once, on import
    raise ImportError(f"pipeline.model.decoding and .training need keras on JAX, not {keras.config.backend()!r}: "
                      "call pipeline.model.environment.use_default_env() before anything imports keras")


def model_state(model) -> tuple[list, list]:
    """The current values of `model`'s trainable and non-trainable variables."""
    return ([v.value for v in model.trainable_variables], [v.value for v in model.non_trainable_variables])


def stateless_scope(model, state) -> keras.StatelessScope:
    """A scope in which `model`'s variables read the values in `state` (`model_state`'s shape):
    what a jitted function needs so that the weights are its arguments, not constants."""
    trainable, non_trainable = state
    return keras.StatelessScope(state_mapping=itertools.chain(
        zip(model.trainable_variables, trainable), zip(model.non_trainable_variables, non_trainable)))


def token_ids(tokenizer, text: str) -> list[int]:
    """`text` as token ids (no BOS)."""
    ids = tokenizer.tokenize(text)
    return ids.tolist() if hasattr(ids, "tolist") else list(ids)


def detokenize(tokenizer, ids: Sequence[int]) -> str:
    """Token ids back to text ("" for none)."""
    if not ids:
        return ""
    text = tokenizer.detokenize([list(ids)])[0]
    return text.decode("utf-8") if isinstance(text, bytes) else str(text)
