"""Tuning the model: the one-pass format it learns (`format.py`), the LoRA trainer
(`trainer.py`) and adapter files (`adapters.py`). `chatlens tune` (pipeline/tune.py) drives them."""

DEFAULT_LORA_TARGETS = ("query", "value")
"""keras-hub's LoRA targets for Gemma (`default_lora_layer_names`); an adapter may name more, e.g. the
feed-forward projections ffw_gating, ffw_gating_2 and ffw_linear (`chatlens tune --lora-targets`)."""
