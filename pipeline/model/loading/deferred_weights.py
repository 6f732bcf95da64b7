"""Build a keras model without running its initializers when its weights are assigned next.

keras draws every variable's initial value as a layer is built: for Gemma 3 270M about 6 s of
random numbers on a 2-core CPU (half of loading a preset), each overwritten at once by the
preset's or the GGUF's weights. Inside `keras.StatelessScope(initialize_variables=False)` keras
defers those initializers instead (what its symbolic builds rely on); the caller then assigns
every variable and `settle` checks that it did.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

Model = TypeVar("Model")


def build_unfilled(build: Callable[[], Model]) -> Model:
    """`build()` with its variables' initializers deferred: each variable holds no value yet."""
    import keras

    with keras.StatelessScope(initialize_variables=False):
        return build()


def settle(model: Any) -> None:
    """Fail if a variable of `model` was left without a value; take the rest off keras's deferred list.

    keras initializes the deferred variables when the next top-level stateless scope closes
    (a `stateless_call`, for one) and refuses any that already hold a value.
    """
    from pipeline import compat

    # The list first, so that a failed load leaves no assigned variable on it to break the next build.
    empty = compat.settle_deferred_variables(model)
    if empty:
        raise ValueError(f"{len(empty)} weights were never assigned, e.g. {empty[:3]}")


def changed_unfilled(model: Any, change: Callable[[], None]) -> None:
    """`change()`, one that replaces some of the variables of a `model` built by `build_unfilled`
    (quantizing its layers in structure, say), with the new variables deferred too and the replaced
    ones forgotten: keras would otherwise draw their initial values at its next stateless scope."""
    import keras

    from pipeline import compat

    before = list(model.weights)
    with keras.StatelessScope(initialize_variables=False):
        change()
    kept = {id(variable) for variable in model.weights}
    compat.forget_deferred_variables([variable for variable in before if id(variable) not in kept])
