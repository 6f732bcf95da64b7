"""keras-hub imported the one way ChatLens runs it: on the JAX backend, with TensorFlow's import
notes filtered. What loading a preset and converting the GGUF both start from."""

from __future__ import annotations

import functools
import os
from types import ModuleType

from chatlens.quiet import native_noise_filtered
from pipeline.model.environment import use_default_env


def import_keras_hub() -> ModuleType:
    """Import keras-hub on the JAX backend, the only one ChatLens runs the model on."""
    use_default_env()
    requested = os.environ["KERAS_BACKEND"]
    import keras

    backend = keras.config.backend()
    if backend != "jax":
        why = f"KERAS_BACKEND={requested}" if requested != "jax" else "keras was imported before the backend was set"
        raise RuntimeError(
            f"ChatLens needs the JAX keras backend but keras is using {backend!r} ({why}); "
            "set KERAS_BACKEND=jax before anything imports keras."
        )
    return _quiet_keras_hub()


@functools.cache
def _quiet_keras_hub() -> ModuleType:
    """keras-hub imported once, with TensorFlow's CUDA probing (on import and first op) filtered."""
    with native_noise_filtered():
        import keras_hub
        import tensorflow as tf

        tf.constant(0)
    return keras_hub
