"""The process settings the model needs, set in one place: `use_default_env()`.

Keras picks its backend, and JAX its GPU memory policy, once, when first imported; so every
entry point calls `use_default_env()` before anything imports keras or JAX: the `chatlens`
command (cli/main.py), the Beam workers (GemmaModelHandler passes `DEFAULT_ENV` to Beam,
which sets it in the process that loads the model), the bench scripts, deploy/bake_model.py
and the tests (tests/conftest.py). Values already in the environment win.
"""

from __future__ import annotations

import os

DEFAULT_ENV = {
    "KERAS_BACKEND": "jax",
    # JAX on GPU would otherwise take 75% of the device memory at start-up.
    "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
    "TF_CPP_MIN_LOG_LEVEL": "2",
}


def use_default_env() -> None:
    """Set DEFAULT_ENV in this process (where unset), before keras or JAX is imported."""
    for name, value in DEFAULT_ENV.items():
        os.environ.setdefault(name, value)
