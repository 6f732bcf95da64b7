"""Convert a Gemma 3 GGUF (llama.cpp layout) into a keras-hub `Gemma3CausalLM` preset.

llama.cpp keeps Hugging Face's tensor layout but changes two things we must undo:
every RMSNorm scale is stored with +1 folded in (keras-hub applies `1 + scale`),
and the tokenizer's added tokens were re-typed (markers became CONTROL, spaces in
user-defined pieces were un-escaped). What GGUF does not carry — the 5 local : 1
global layer pattern and the 10k local RoPE base — keras-hub's `Gemma3Backbone`
hard-codes to the same values llama.cpp does, so we only check the global base.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from functools import reduce
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from tqdm import tqdm

from pipeline.model.loading.deferred_weights import build_unfilled, settle
from pipeline.model.loading.spm_proto import PieceType, SpecialIds, build_bpe_model

# Bump whenever the produced preset would change; cached conversions are redone.
CONVERTER_VERSION = 1

ARCH = "gemma3"
_GLOBAL_ROPE_BASE = 1_000_000.0  # keras-hub's fixed wavelength for global layers

Transform = Callable[[np.ndarray, tuple[int, ...]], np.ndarray]


def _norm_scale(w: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return w - 1.0


def _heads_in(w: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """(heads*head_dim, hidden) -> keras (heads, hidden, head_dim)."""
    heads, hidden, head_dim = shape
    return w.reshape(heads, head_dim, hidden).transpose(0, 2, 1)


def _heads_out(w: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """(hidden, heads*head_dim) -> keras (heads, head_dim, hidden)."""
    heads, head_dim, hidden = shape
    return w.reshape(hidden, heads, head_dim).transpose(1, 2, 0)


def _transpose(w: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return w.T


def _identity(w: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    return w


# GGUF tensor -> (keras attribute path, transform).
_GLOBAL_TENSORS: dict[str, tuple[str, str, Transform]] = {
    "token_embd.weight": ("token_embedding", "embeddings", _identity),
    "output_norm.weight": ("final_normalization", "scale", _norm_scale),
}
_BLOCK_TENSORS: dict[str, tuple[str, Transform]] = {
    "attn_norm": ("pre_attention_norm.scale", _norm_scale),
    "post_attention_norm": ("post_attention_norm.scale", _norm_scale),
    "ffn_norm": ("pre_ffw_norm.scale", _norm_scale),
    "post_ffw_norm": ("post_ffw_norm.scale", _norm_scale),
    "attn_q_norm": ("attention.query_norm.scale", _norm_scale),
    "attn_k_norm": ("attention.key_norm.scale", _norm_scale),
    "attn_q": ("attention.query_dense.kernel", _heads_in),
    "attn_k": ("attention.key_dense.kernel", _heads_in),
    "attn_v": ("attention.value_dense.kernel", _heads_in),
    "attn_output": ("attention.output_dense.kernel", _heads_out),
    "ffn_gate": ("gating_ffw.kernel", _transpose),
    "ffn_up": ("gating_ffw_2.kernel", _transpose),
    "ffn_down": ("ffw_linear.kernel", _transpose),
}


def read_metadata(reader: gguf.GGUFReader) -> dict[str, Any]:
    """All key/value fields of a GGUF file as Python values."""
    return {name: field.contents() for name, field in reader.fields.items()}


def backbone_config(meta: Mapping[str, Any]) -> dict[str, Any]:
    """`Gemma3Backbone` keyword arguments for a text-only Gemma 3 GGUF."""
    if meta.get("general.architecture") != ARCH:
        raise ValueError(f"not a Gemma 3 GGUF: architecture is {meta.get('general.architecture')!r}")
    rope_base = float(meta[f"{ARCH}.rope.freq_base"])
    if rope_base != _GLOBAL_ROPE_BASE:
        raise ValueError(f"keras-hub fixes the global RoPE base at {_GLOBAL_ROPE_BASE:g}, GGUF has {rope_base:g}")
    head_dim = int(meta[f"{ARCH}.attention.key_length"])
    if int(meta[f"{ARCH}.attention.value_length"]) != head_dim:
        raise ValueError("keras-hub's Gemma3Backbone needs equal key and value head sizes")
    return {
        "vocabulary_size": len(meta["tokenizer.ggml.tokens"]),
        "image_size": None,
        "num_layers": int(meta[f"{ARCH}.block_count"]),
        "num_query_heads": int(meta[f"{ARCH}.attention.head_count"]),
        "num_key_value_heads": int(meta[f"{ARCH}.attention.head_count_kv"]),
        "hidden_dim": int(meta[f"{ARCH}.embedding_length"]),
        "intermediate_dim": int(meta[f"{ARCH}.feed_forward_length"]),
        "head_dim": head_dim,
        # llama.cpp scales queries by 1/sqrt(head_dim) for every size but 27B.
        "query_head_dim_normalize": True,
        "use_query_key_norm": True,
        "use_post_ffw_norm": True,
        "use_post_attention_norm": True,
        "attention_logit_soft_cap": None,
        "final_logit_soft_cap": None,
        "use_sliding_window_attention": True,
        "sliding_window_size": int(meta[f"{ARCH}.attention.sliding_window"]),
        "local_rope_scaling_factor": 1.0,
        "global_rope_scaling_factor": float(meta.get(f"{ARCH}.rope.scaling.factor", 1.0)),
        # Stored as float32; its shortest repr gives back the intended 1e-06.
        "layer_norm_epsilon": float(str(np.float32(meta[f"{ARCH}.attention.layer_norm_rms_epsilon"]))),
    }


def special_ids(meta: Mapping[str, Any]) -> SpecialIds:
    return SpecialIds(
        bos=int(meta["tokenizer.ggml.bos_token_id"]),
        eos=int(meta["tokenizer.ggml.eos_token_id"]),
        pad=int(meta["tokenizer.ggml.padding_token_id"]),
        unk=int(meta["tokenizer.ggml.unknown_token_id"]),
    )


def tokenizer_proto(meta: Mapping[str, Any]) -> bytes:
    """Rebuild Gemma's SentencePiece model from the `tokenizer.ggml.*` fields.

    llama.cpp typed every added marker (`<start_of_turn>`, `<unused0>`, ...) as
    CONTROL, which SentencePiece never matches in text; in Gemma's own model they
    are USER_DEFINED, so only bos/eos/pad stay CONTROL and unk becomes UNKNOWN.
    It also wrote spaces in user-defined pieces as ' ' instead of '▁'.
    """
    ids = special_ids(meta)
    pieces, types = [], []
    listed = zip(meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"], strict=True)
    for i, (piece, kind) in enumerate(listed):
        kind = PieceType(kind)
        if i == ids.unk:
            kind = PieceType.UNKNOWN
        elif kind == PieceType.CONTROL and i not in (ids.bos, ids.eos, ids.pad):
            kind = PieceType.USER_DEFINED
        if kind == PieceType.USER_DEFINED:
            piece = piece.replace(" ", "\u2581")
        pieces.append(piece)
        types.append(kind)
    return build_bpe_model(pieces, meta["tokenizer.ggml.scores"], types, ids)


def _targets(backbone: Any) -> Iterator[tuple[str, Any, Transform]]:
    """(GGUF tensor name, keras variable, transform) for every backbone weight."""
    for name, (layer, attr, fn) in _GLOBAL_TENSORS.items():
        yield name, getattr(backbone.get_layer(layer), attr), fn
    for i in range(backbone.num_layers):
        block = backbone.get_layer(f"decoder_block_{i}")
        for short, (path, fn) in _BLOCK_TENSORS.items():
            yield f"blk.{i}.{short}.weight", reduce(getattr, path.split("."), block), fn


def fill_backbone(backbone: Any, reader: gguf.GGUFReader, progress: bool = True) -> None:
    """Assign every GGUF tensor, dequantized, to its keras variable (and check none is left out)."""
    targets = {name: (variable, fn) for name, variable, fn in _targets(backbone)}
    filled = set()
    for tensor in tqdm(reader.tensors, desc="Converting Gemma 3 GGUF", unit="tensor", disable=not progress):
        if tensor.name not in targets:
            raise ValueError(f"unexpected GGUF tensor {tensor.name!r}")
        variable, fn = targets[tensor.name]
        shape = tuple(variable.shape)
        value = fn(gguf.quants.dequantize(tensor.data, tensor.tensor_type), shape)
        if value.shape != shape:
            raise ValueError(f"{tensor.name}: {value.shape} does not fit {variable.path} {shape}")
        variable.assign(value)
        filled.add(variable.path)
    missing = {v.path for v in backbone.weights} - filled
    if missing:
        raise ValueError(f"GGUF left keras weights unset: {sorted(missing)[:5]}")


def backbone_from_gguf(reader: gguf.GGUFReader, dtype: str = "float32", progress: bool = True) -> Any:
    """A `Gemma3Backbone` holding the GGUF's weights (built without random initial ones)."""
    import keras_hub

    backbone = build_unfilled(lambda: keras_hub.models.Gemma3Backbone(**backbone_config(read_metadata(reader)),
                                                                      dtype=dtype))
    fill_backbone(backbone, reader, progress)
    settle(backbone)
    return backbone


def convert_gguf(gguf_path: Path, preset_dir: Path, *, dtype: str = "float32", progress: bool = True) -> None:
    """Write a `Gemma3CausalLM` preset (weights, tokenizer, preprocessor) to `preset_dir`.

    Every GGUF tensor must land on exactly one keras variable and every keras
    variable must be filled, so a layout change in either library fails loudly.
    """
    from chatlens.quiet import native_noise_filtered
    from pipeline.model.loading.keras_import import import_keras_hub

    keras_hub = import_keras_hub()  # JAX backend, TensorFlow's import notes filtered (a first run converts)
    reader = gguf.GGUFReader(gguf_path)
    meta = read_metadata(reader)
    with native_noise_filtered():  # sentencepiece's note on Gemma's tokenizer
        tokenizer = keras_hub.models.Gemma3Tokenizer(proto=tokenizer_proto(meta), has_vision_tokens=False)
    preprocessor = keras_hub.models.Gemma3CausalLMPreprocessor(tokenizer=tokenizer, image_converter=None)
    backbone = backbone_from_gguf(reader, dtype, progress)
    causal_lm = keras_hub.models.Gemma3CausalLM(backbone=backbone, preprocessor=preprocessor)
    causal_lm.save_to_preset(str(preset_dir))
