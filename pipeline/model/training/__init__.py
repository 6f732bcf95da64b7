"""Tuning the model: the one-pass format it learns (`format.py`), the LoRA trainer
(`trainer.py`) and adapter files (`adapters.py`). `chatlens tune` (pipeline/tune.py) drives them."""

DEFAULT_LORA_TARGETS = ("query", "value")
"""keras-hub's LoRA targets for Gemma (`default_lora_layer_names`): what an adapter whose manifest
names no targets trained (the first adapters)."""

SHIPPED_LORA_TARGETS = ("query", "key", "value", "attention_output", "ffw_gating", "ffw_gating_2", "ffw_linear")
"""Every attention and feed-forward projection: what the shipped adapter trains (its manifest) and so
what `chatlens tune` trains unless told otherwise; the feed-forward layers bought more than rank on dev."""
