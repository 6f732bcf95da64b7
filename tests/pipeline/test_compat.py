"""pipeline/compat.py against the installed libraries: one test per entry, each failing with the
entry's name and the version it was written for when an upgrade moved what it reaches into.
Cheap: classes and functions are looked at, no model is built (the entries' behaviour is tested
where it is used: test_deferred_weights, test_decode_step, test_tuning, test_transforms)."""

from __future__ import annotations

import inspect
from importlib.metadata import version

import pytest

from pipeline import compat


def upgraded(entry: str, library: str) -> str:
    return (f"pipeline.compat.{entry} was written for {library} {compat.PINNED[library]}, "
            f"installed is {version(library)}: re-check it against the new {library}")


@pytest.mark.parametrize("library", sorted(compat.PINNED))
def test_the_installed_libraries_are_the_pinned_ones(library):
    """An upgrade lands here first: every entry of its library needs a look (then bump PINNED)."""
    assert version(library) == compat.PINNED[library], upgraded("PINNED", library)


def test_settle_deferred_variables():
    from keras.src.backend.common import global_state, variables

    assert callable(getattr(global_state, "get_global_attribute", None)), upgraded("settle_deferred_variables", "keras")
    assert callable(getattr(global_state, "set_global_attribute", None)), upgraded("settle_deferred_variables", "keras")
    source = inspect.getsource(variables)
    assert '"uninitialized_variables"' in source and "self._value = None" in source, \
        upgraded("settle_deferred_variables", "keras")


def test_layers_with_weights():
    import keras

    assert callable(getattr(keras.layers.Layer, "_flatten_layers", None)), upgraded("layers_with_weights", "keras")
    outer = keras.Sequential([keras.layers.Dense(2), keras.layers.Dropout(0.1), keras.layers.Dense(1)])
    outer.build((None, 3))
    assert [type(layer).__name__ for layer in compat.layers_with_weights(outer)] == ["Dense", "Dense"], \
        upgraded("layers_with_weights", "keras")


def test_h5_reads_replaced():
    from keras.src.saving import saving_lib

    source = inspect.getsource(saving_lib.H5IOStore.__getitem__)
    assert "safe_get_h5_dataset(self._h5_entry_group, key)" in source, upgraded("h5_reads_replaced", "keras")
    assert callable(getattr(saving_lib, "safe_get_h5_dataset", None)), upgraded("h5_reads_replaced", "keras")



def test_float32_accumulation():
    """Inside, keras's einsum and matmul (as its layers call them) on bfloat16 run XLA's bfloat16
    product (no float32 copy of either operand in the compiled program) with the widened product's
    values; outside, keras's own functions again."""
    import jax
    import jax.numpy as jnp
    import keras
    import numpy as np
    from keras.src.backend.jax import numpy as backend_numpy

    own = backend_numpy.einsum, backend_numpy.matmul
    x = jax.random.normal(jax.random.PRNGKey(0), (4, 16, 64), "bfloat16")
    w = jax.random.normal(jax.random.PRNGKey(1), (64, 32), "bfloat16")
    widened = np.asarray(jnp.einsum("btd,df->btf", x.astype("float32"), w.astype("float32")).astype("bfloat16"))

    def program(function):
        return jax.jit(function).lower(x, w).compile().as_text()

    def widens(text):  # the computation holding the product takes float32 operands
        blocks = text.split("\n}\n")
        return any(line.split("=")[1].strip().startswith("f32[") for block in blocks if " dot(" in block
                   for line in block.splitlines() if "parameter(" in line)

    assert widens(program(lambda x, w: keras.ops.einsum("btd,df->btf", x, w))), \
        "XLA no longer widens a bfloat16 product with a bfloat16 result: float32_accumulation may be unneeded"
    with compat.float32_accumulation():
        for call in (lambda x, w: keras.ops.einsum("btd,df->btf", x, w), lambda x, w: keras.ops.matmul(x, w)):
            assert not widens(program(call)), upgraded("float32_accumulation", "keras")
            got = jax.jit(call)(x, w)
            assert got.dtype == jnp.bfloat16
            np.testing.assert_allclose(np.asarray(got, "float32"), widened.astype("float32"), rtol=1e-2, atol=1e-2)
        assert keras.ops.einsum("ij,jk->ik", np.ones((2, 3), "float32"), np.ones((3, 2), "float32")).dtype == "float32"
    assert (backend_numpy.einsum, backend_numpy.matmul) == own

def test_keras_hub_has_tensorflow():
    from keras_hub.src.utils import tensor_utils

    source = inspect.getsource(tensor_utils)
    assert "tf = try_import_tensorflow()" in source and "except ImportError:" in source, \
        upgraded("keras_hub_has_tensorflow", "keras-hub")


@pytest.mark.parametrize("entry, name", [("lora_rank", "_lora_rank"), ("lora_enabled_layers", "_lora_enabled_layers")])
def test_lora_attributes(entry, name):
    from keras_hub.models import Backbone

    assert f"self.{name}" in inspect.getsource(Backbone.enable_lora), upgraded(entry, "keras-hub")


def test_direct_pubsub_read_base():
    from apache_beam.io.gcp.pubsub import PubsubMessage, ReadFromPubSub

    base = compat.direct_pubsub_read_base()
    assert "_infer_output_coder" in vars(base) and callable(base.__mro__[1]._infer_output_coder), \
        upgraded("direct_pubsub_read_base", "apache-beam")
    read = ReadFromPubSub(subscription="projects/chatlens-local/subscriptions/s", with_attributes=True)
    assert compat.read_source(read) is not None, upgraded("read_source", "apache-beam")
    assert callable(getattr(PubsubMessage, "_from_message", None)), upgraded("pubsub_message", "apache-beam")


def test_direct_pubsub_evaluator_base():
    from apache_beam.runners.direct.transform_evaluator import TransformEvaluatorRegistry, _PubSubReadEvaluator

    for name in ("_read_from_pubsub", "_get_subscriber_client"):
        assert callable(getattr(_PubSubReadEvaluator, name, None)), upgraded("direct_pubsub_evaluator_base", "apache-beam")
    source = inspect.getsource(_PubSubReadEvaluator)
    for name in ("self._applied_ptransform", "self._sub_name", "self._read_from_pubsub("):
        assert name in source, upgraded("direct_pubsub_evaluator_base", "apache-beam")
    assert isinstance(getattr(TransformEvaluatorRegistry, "_test_evaluators_overrides", None), dict), \
        upgraded("register_direct_evaluator", "apache-beam")

