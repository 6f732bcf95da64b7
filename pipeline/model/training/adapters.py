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
from pipeline.model.decoding.answer_vocabulary import AnswerVocabulary
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


SUMMARY_STYLES = ("model", "extractive")
"""How a tuned model's summary is served: "model", the decoded summary itself; "extractive", the
chat's own sentences that the decoded summary names, quoted with the agent's last word and a status
(decoding/extractive.py). The blind review of dev chose extractive (README, "The retrained model")."""
REPLY_STYLES = ("model", "macro", "macro+opening")
"""How its reply is served: "model", the decoded reply itself; "macro", the team's macro that the
decoded reply and the customer's words pick (decoding/macros.py); "macro+opening", that macro opened
by the decoded reply's first sentence where it only restates the problem. Chosen by the review of dev."""


@dataclass(frozen=True)
class AdapterServing:
    """How an adapter is served, from its manifest (read once): the label calibration, when drafts
    are offered, the prompt format it learnt (`training/format.py`), how its summaries and
    replies are served (SUMMARY_STYLES and REPLY_STYLES, above) and the tokens it may write
    (`decoding/answer_vocabulary.py`). Without a manifest: identity calibration, drafts always
    offered, format 1, the decoded texts themselves, any token."""

    calibration: LabelCalibration = LabelCalibration()
    offer_policy: OfferPolicy = OfferPolicy()
    prompt_format: int = 1
    summary_style: str = "model"
    reply_style: str = "model"
    answer_vocabulary: AnswerVocabulary | None = None

    def __post_init__(self) -> None:
        for name, styles in (("summary_style", SUMMARY_STYLES), ("reply_style", REPLY_STYLES)):
            if getattr(self, name) not in styles:
                raise ValueError(f"{name} {getattr(self, name)!r}: one of {styles}")

    @classmethod
    def of(cls, adapter: str | Path) -> AdapterServing:
        return cls.from_json(_manifest(adapter))

    @classmethod
    def from_json(cls, data: dict) -> AdapterServing:
        """From a manifest, or the marker of a preset the adapter was merged into (`to_json`)."""
        return cls(LabelCalibration.from_json(data.get("label_calibration")),
                   OfferPolicy.from_json(data.get("offer_policy")), int(data.get("prompt_format", 1)),
                   str(data.get("summary_style", "model")), str(data.get("reply_style", "model")),
                   AnswerVocabulary.from_json(data.get("answer_vocabulary")))

    def to_json(self) -> dict:
        return {"label_calibration": self.calibration.to_json(), "offer_policy": self.offer_policy.to_json(),
                "prompt_format": self.prompt_format, "summary_style": self.summary_style,
                "reply_style": self.reply_style,
                **({"answer_vocabulary": self.answer_vocabulary.to_json()} if self.answer_vocabulary else {})}


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
