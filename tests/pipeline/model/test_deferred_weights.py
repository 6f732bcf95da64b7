"""Building without initial weights: every weight must then be assigned, and keras must not redo it."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.model.loading.deferred_weights import build_unfilled, settle


def tiny_backbone():
    import keras_hub

    return keras_hub.models.Gemma3Backbone(
        vocabulary_size=64, image_size=None, num_layers=2, num_query_heads=2, num_key_value_heads=1,
        hidden_dim=16, intermediate_dim=32, head_dim=8, sliding_window_size=4, dtype="float32")


def test_an_unfilled_backbone_holds_the_weights_assigned_and_keras_leaves_them_alone():
    import keras

    reference = tiny_backbone()
    backbone = build_unfilled(tiny_backbone)
    assert all(v._value is None for v in backbone.weights)
    for target, source in zip(backbone.weights, reference.weights, strict=True):
        target.assign(source.numpy())
    settle(backbone)

    # The next top-level stateless scope initializes keras's deferred variables: none may be ours.
    with keras.StatelessScope():
        pass
    inputs = {"token_ids": np.array([[1, 5, 9, 3]]), "padding_mask": np.ones((1, 4), bool)}
    np.testing.assert_array_equal(np.asarray(backbone(inputs)), np.asarray(reference(inputs)))


def test_a_weight_left_unassigned_is_an_error():
    backbone = build_unfilled(tiny_backbone)
    for variable in backbone.weights[1:]:
        variable.assign(np.zeros(variable.shape, variable.dtype))
    with pytest.raises(ValueError, match="1 weights were never assigned"):
        settle(backbone)
    # The failed load leaves keras able to build the next model (its deferred list holds none of ours with a value).
    assert tiny_backbone().count_params() == backbone.count_params()
