"""LoRA adapter files: where the shipped one lies, their names and manifests, and loading one
into a backbone (keras-hub's `.lora.h5` format, on any layers).

Light on purpose: loading a model for serving (`loading/sources.py` merges an adapter into
a preset) reads this module, never the trainer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pipeline import compat
from pipeline.model.decoding.calibration import LabelCalibration
from pipeline.model.decoding.offer import OfferPolicy
from pipeline.model.types import ModelSpecError

SHIPPED_ADAPTER = Path(__file__).resolve().parents[1] / "adapters" / "chatlens-gemma3-270m.lora.h5"
ADAPTER_SUFFIX = ".lora.h5"


def adapter_name(adapter: str | Path) -> str:
    """'chatlens-gemma3-270m' for '.../chatlens-gemma3-270m.lora.h5'; a clear error for other files."""
    name = Path(adapter).name
    if not name.endswith(ADAPTER_SUFFIX):
        raise ModelSpecError(f"adapter {str(adapter)!r}: not a {ADAPTER_SUFFIX} file (keras-hub's adapter format)")
    return name.removesuffix(ADAPTER_SUFFIX)


def manifest_path(adapter: str | Path) -> Path:
    """Where `chatlens tune` writes an adapter's manifest: beside it, `NAME.manifest.json`."""
    return Path(adapter).with_name(adapter_name(adapter) + ".manifest.json")


def _manifest(adapter: str | Path) -> dict:
    try:
        return json.loads(manifest_path(adapter).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}


@dataclass(frozen=True)
class AdapterServing:
    """How an adapter is served, from its manifest (read once): the label calibration, when drafts
    are offered, the prompt format it learnt (`training/format.py`) and how its summaries are served
    (`decoding/one_pass.py`, SUMMARY_STYLES). Without a manifest: identity calibration, drafts always
    offered, format 1, the decoded summary itself ("model")."""

    calibration: LabelCalibration = LabelCalibration()
    offer_policy: OfferPolicy = OfferPolicy()
    prompt_format: int = 1
    summary_style: str = "model"

    @classmethod
    def of(cls, adapter: str | Path) -> AdapterServing:
        manifest = _manifest(adapter)
        return cls(LabelCalibration.from_json(manifest.get("label_calibration")),
                   OfferPolicy.from_json(manifest.get("offer_policy")), int(manifest.get("prompt_format", 1)),
                   str(manifest.get("summary_style", "model")))


def load_adapter(backbone, adapter: str) -> None:
    """`backbone.load_lora_weights` for an adapter on any layers, not only keras-hub's default targets.

    keras-hub's file names layers by index and holds no target names, and its loader enables LoRA on
    the default targets only. Here LoRA is enabled on the layers the file holds (by their names),
    unless the backbone already has it, then every layer in the file is filled from it.
    """
    import h5py

    layers = compat.layers_with_weights(backbone)
    with h5py.File(adapter, "r") as store:
        lora = store["lora"]
        rank = int(lora["vars/rank"][()])
        held = sorted(int(key) for key in lora if key.isdigit())
        names = {layers[i].name for i in held}
        enabled = compat.lora_enabled_layers(backbone)
        if not enabled:
            backbone.enable_lora(rank, target_layer_names=sorted(names))
            enabled = compat.lora_enabled_layers(backbone)
        elif compat.lora_rank(backbone) != rank:
            raise ValueError(f"adapter {adapter}: LoRA rank {rank}, the model has rank {compat.lora_rank(backbone)}")
        missing = sorted(names - {layers[i].name for i in enabled})
        if missing:
            raise ValueError(f"adapter {adapter}: LoRA on {missing}, which this model does not train")
        for i in held:
            layers[i].lora_kernel_a.assign(lora[f"{i}/vars/lora_kernel_a"][()])
            layers[i].lora_kernel_b.assign(lora[f"{i}/vars/lora_kernel_b"][()])
