"""keras-hub imported the one way ChatLens runs it: on the JAX backend, with TensorFlow's import
notes filtered. What loading a preset and converting the GGUF both start from."""

from __future__ import annotations

import functools
import os
import sys
from types import ModuleType

from chatlens.quiet import native_noise_filtered
from pipeline.model.environment import use_default_env


def import_keras_hub(tensorflow: bool = True) -> ModuleType:
    """Import keras-hub on the JAX backend, the only one ChatLens runs the model on.

    `tensorflow=False` (serving): without TensorFlow and tensorflow-text, about 600 MiB of RSS
    that decoding never uses (keras-hub tokenizes with the `sentencepiece` package outside
    `tf.data` whatever is installed, so the tokens are the same), where this process has not
    imported keras-hub yet. keras-hub imports TensorFlow whenever it can; a module marked missing
    is what makes it take its no-TensorFlow path (`has_tensorflow` then says False).
    """
    use_default_env()
    if not tensorflow and "keras_hub" not in sys.modules:
        sys.modules.setdefault("tensorflow", None)
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


def has_tensorflow() -> bool:
    """Whether keras-hub runs with TensorFlow in this process: its causal-LM preprocessors need it
    (`sources.ModelSource.load` does without them), the decoders do not."""
    from pipeline import compat

    return compat.keras_hub_has_tensorflow()


@functools.cache
def _quiet_keras_hub() -> ModuleType:
    """keras-hub imported once, with TensorFlow's CUDA probing (on import and first op) filtered."""
    with native_noise_filtered():
        import keras_hub

        if has_tensorflow():
            import tensorflow as tf

            tf.constant(0)
    return keras_hub
