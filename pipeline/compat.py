"""Every private keras, keras-hub and Apache Beam name ChatLens uses, in one place.

Upgrading one of these libraries means reading this file, not hunting the code base: each
entry says which library version it was written for (`PINNED`, as in constraints.txt) and
what of the library it reaches into, and tests/pipeline/test_compat.py checks each one
against the installed library, failing with the entry's name when an upgrade moved it.
Nothing else in pipeline/, app/, cli/, chatlens/, localpubsub/, bench/ or deploy/ may name a
private keras / keras-hub / Beam name (tests/pipeline/test_compat.py greps for them).

Imports are inside the functions: keras and Beam are heavy, and this module is also read by
code that needs neither.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

PINNED = {"keras": "3.15.1", "keras-hub": "0.32.0", "apache-beam": "2.77.0"}
"""The versions every entry below was written for and tested with (constraints.txt)."""

PRIVATE_NAMES = (
    # keras
    "keras.src", "global_state", "uninitialized_variables", "_value", "_flatten_layers", "_h5_entry_group",
    # keras-hub
    "keras_hub.src", "_lora_rank", "_lora_enabled_layers",
    # Beam
    "_DirectReadFromPubSub", "_PubSubReadEvaluator", "_test_evaluators_overrides", "_from_message",
    "_applied_ptransform", "_get_subscriber_client", "_sub_name", "_read_from_pubsub", "_infer_output_coder",
)
"""What the grep test looks for outside this module (as identifiers, `keras.src` as a prefix)."""


# ---- keras (3.15.1) ----------------------------------------------------------------------------
def settle_deferred_variables(model: Any) -> list[str]:
    """keras 3.15.1: variables built inside `StatelessScope(initialize_variables=False)` wait on
    a process-wide list (`keras.src.backend.common.global_state`, "uninitialized_variables")
    and are initialized when the next top-level stateless scope closes, which refuses any that
    already hold a value (`Variable._value`). Take those that were assigned off the list and
    return the paths of `model`'s variables still without a value."""
    from keras.src.backend.common import global_state

    pending = global_state.get_global_attribute("uninitialized_variables") or []
    global_state.set_global_attribute("uninitialized_variables", [v for v in pending if v._value is None])
    return [v.path for v in model.weights if v._value is None]


def forget_deferred_variables(variables: Any) -> None:
    """keras 3.15.1: take `variables` off the process-wide list of deferred ones (see
    `settle_deferred_variables`): variables a model no longer holds, never to be initialized."""
    from keras.src.backend.common import global_state

    gone = {id(variable) for variable in variables}
    pending = global_state.get_global_attribute("uninitialized_variables") or []
    global_state.set_global_attribute("uninitialized_variables", [v for v in pending if id(v) not in gone])


def layers_with_weights(model: Any) -> list:
    """keras 3.15.1 `Layer._flatten_layers(include_self=False)`, keeping those holding weights:
    the numbering keras-hub's LoRA adapter files use for their layers (keras-hub 0.32.0
    `Backbone.save_lora_weights`)."""
    return [layer for layer in model._flatten_layers(include_self=False) if layer.weights]


@contextmanager
def h5_reads_replaced(read: Callable[[Callable[[], Any], Any], Any]):
    """keras 3.15.1 `saving_lib.H5IOStore.__getitem__(key)`: how `load_weights` reads each variable's
    array from a `.weights.h5` (the whole dataset, `np.array`ed in the file's dtype). While inside,
    it answers `read(read_whole, dataset)`, `dataset` the h5py dataset (`safe_get_h5_dataset`
    on the store's `_h5_entry_group`, its safety checks kept) and `read_whole()` keras's own read."""
    from keras.src.saving import saving_lib

    read_whole = saving_lib.H5IOStore.__getitem__

    def replaced(store, key):
        return read(lambda: read_whole(store, key), saving_lib.safe_get_h5_dataset(store._h5_entry_group, key))

    saving_lib.H5IOStore.__getitem__ = replaced
    try:
        yield
    finally:
        saving_lib.H5IOStore.__getitem__ = read_whole



@contextmanager
def float32_accumulation():
    """keras 3.15.1 `keras.src.backend.jax.numpy.einsum` and `.matmul`, which keras's `ops.einsum` and
    `ops.matmul` (and so its Dense, EinsumDense and keras-hub's attention) look up on each call. While
    inside, a product of two bfloat16 (or float16) operands asks XLA for a float32 result
    (`preferred_element_type`) and rounds it back to their dtype. XLA's CPU backend has no kernel for a
    bfloat16 product with a bfloat16 result: it widens both operands to float32 and runs a float32
    product (2,048 x 640 x 2,048: 21.6 ms, 249 GFLOPS on an AMX Xeon); asked for a float32 result it
    runs its bfloat16 kernel (4.0 ms). The sums are float32 either way; only their order differs."""
    import jax.numpy as jnp
    from keras.src.backend.jax import numpy as backend_numpy

    einsum, matmul = backend_numpy.einsum, backend_numpy.matmul
    narrow = ("bfloat16", "float16")

    def narrow_dtype(*operands):
        dtypes = {str(getattr(x, "dtype", "")) for x in operands}
        return dtypes.pop() if len(dtypes) == 1 and dtypes <= set(narrow) else None

    def accumulating_einsum(subscripts, *operands, **kwargs):
        dtype = narrow_dtype(*operands)
        if dtype is None or kwargs.get("preferred_element_type") is not None:
            return einsum(subscripts, *operands, **kwargs)
        return jnp.einsum(subscripts, *operands, **kwargs, preferred_element_type=jnp.float32).astype(dtype)

    def accumulating_matmul(x1, x2):
        dtype = narrow_dtype(x1, x2)
        if dtype is None:
            return matmul(x1, x2)
        return jnp.matmul(x1, x2, preferred_element_type=jnp.float32).astype(dtype)

    backend_numpy.einsum, backend_numpy.matmul = accumulating_einsum, accumulating_matmul
    try:
        yield
    finally:
        backend_numpy.einsum, backend_numpy.matmul = einsum, matmul

@contextmanager
def garbage_collected_once():
    """keras 3.15.1's `Layer.__delattr__` runs `gc.collect()` for every variable deleted: 128 ms each in a
    process holding keras-hub's Gemma (16 of the 18 s `quantize("int8")` took on its 127 layers). While
    inside, `gc.collect` does nothing; it runs once on the way out."""
    import gc

    collect = gc.collect
    gc.collect = lambda *args, **kwargs: 0
    try:
        yield
    finally:
        gc.collect = collect
        gc.collect()


def int8_kernel(dense: Any) -> tuple[Any, Any]:
    """keras 3.15.1's int8 `EinsumDense` (`quantize("int8")`): its int8 kernel (`_kernel`) and its scale
    laid out as the kernel, the summed axes 1 (`_adjust_scale_for_dequant`): the weight is kernel / scale."""
    return dense._kernel.value, dense._adjust_scale_for_dequant(dense.kernel_scale.value)


def int8_embeddings(embedding: Any) -> tuple[Any, Any] | None:
    """keras 3.15.1's int8 `ReversibleEmbedding` (tied): its int8 table (`_embeddings`) and one scale per
    token (`embeddings_scale`); None for one not quantized."""
    if embedding.quantization_mode != "int8":
        return None
    return embedding._embeddings.value, embedding.embeddings_scale.value


# ---- keras-hub (0.32.0) ------------------------------------------------------------------------
def lora_rank(backbone: Any) -> int | None:
    """keras-hub 0.32.0 `Backbone._lora_rank` (set by `enable_lora`), None before it."""
    return getattr(backbone, "_lora_rank", None)


def lora_enabled_layers(backbone: Any) -> list[int]:
    """keras-hub 0.32.0 `Backbone._lora_enabled_layers`: the indices (in `layers_with_weights`
    order) of the layers `enable_lora` enabled; empty before it."""
    return list(getattr(backbone, "_lora_enabled_layers", None) or [])


def keras_hub_has_tensorflow() -> bool:
    """keras-hub 0.32.0 `keras_hub.src.utils.tensor_utils.tf`: the TensorFlow keras-hub imported
    on its own import (`try_import_tensorflow`, None where the import failed, as it does for a
    module marked missing in `sys.modules`: `keras_import.import_keras_hub(tensorflow=False)`)."""
    from keras_hub.src.utils import tensor_utils

    return tensor_utils.tf is not None


# ---- Apache Beam (2.77.0) ----------------------------------------------------------------------
def read_source(read: Any) -> Any:
    """Beam 2.77.0 `ReadFromPubSub._source`: the `_PubSubSource` a ReadFromPubSub reads."""
    return read._source


def pubsub_message(received: Any) -> Any:
    """Beam 2.77.0 `PubsubMessage._from_message`: a PubsubMessage from the client's proto."""
    from apache_beam.io.gcp.pubsub import PubsubMessage

    return PubsubMessage._from_message(received)


@functools.cache
def direct_pubsub_read_base() -> type:
    """A base for a Pub/Sub read the BundleBasedDirectRunner evaluates with an evaluator of our
    own: Beam 2.77.0 `direct_runner._DirectReadFromPubSub`, whose output coder (bytes) is
    replaced by none (`_infer_output_coder`): it yields PubsubMessage objects."""
    from apache_beam.runners.direct.direct_runner import _DirectReadFromPubSub

    class DirectPubSubRead(_DirectReadFromPubSub):
        def _infer_output_coder(self, unused_input_type=None, unused_input_coder=None):
            return None

    return DirectPubSubRead


@functools.cache
def direct_pubsub_evaluator_base() -> type:
    """A base for that read's evaluator: Beam 2.77.0 `transform_evaluator._PubSubReadEvaluator`,
    whose `_read_from_pubsub(timestamp_attribute)` (a list of (timestamp, message)) a subclass
    gives as `read_messages`, with the transform, the subscription path and the subscriber
    client under public names."""
    from apache_beam.runners.direct.transform_evaluator import _PubSubReadEvaluator

    class PubSubReadEvaluator(_PubSubReadEvaluator):
        @property
        def transform(self) -> Any:
            return self._applied_ptransform.transform

        @property
        def subscription(self) -> str:
            return self._sub_name

        def subscriber_client(self) -> Any:
            return self._get_subscriber_client(self._applied_ptransform)

        def _read_from_pubsub(self, timestamp_attribute):
            return self.read_messages(timestamp_attribute)

        def read_messages(self, timestamp_attribute):  # pragma: no cover - subclasses define it
            raise NotImplementedError

    return PubSubReadEvaluator


def register_direct_evaluator(transform: type, evaluator: type) -> None:
    """Beam 2.77.0 `TransformEvaluatorRegistry._test_evaluators_overrides`: the process-wide
    table the BundleBasedDirectRunner consults first for a transform's evaluator."""
    from apache_beam.runners.direct.transform_evaluator import TransformEvaluatorRegistry

    TransformEvaluatorRegistry._test_evaluators_overrides[transform] = evaluator
