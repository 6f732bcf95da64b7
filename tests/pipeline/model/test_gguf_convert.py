"""The GGUF -> keras-hub conversion of Gemma 3 270M, checked against the GGUF itself.

The decisive test is an independent NumPy forward pass over the raw dequantized
GGUF tensors (llama.cpp layout, norm scales used as stored): if a layout, a norm
offset, RoPE base, window or tokenizer detail were wrong, the logits would differ.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import gguf
import numpy as np
import pytest
import sentencepiece as spm

from tests.support.models import gguf_metadata
from pipeline.model.loading.gguf_convert import CONVERTER_VERSION, _heads_in, _heads_out, read_metadata, tokenizer_proto
from pipeline.model.loading.sources import BASE_SPEC, GGUF_SPEC, MARKER, bundled_gguf, load_causal_lm, resolve_model
from pipeline.model.types import ModelSpecError
from pipeline.model.loading.spm_proto import model_proto_class

PROSE = (
    "The history of the city goes back more than two thousand years. It began as a small fishing village on the "
    "banks of the river, and over the centuries it grew into an important center of trade. Merchants came from "
    "distant countries to buy wool, wine and salt, and the town built a market square, a cathedral and a bridge "
    "that still stands today. In the nineteenth century the railway arrived, and with it factories and new "
    "neighborhoods for the workers who moved in from the countryside."
)
TRICKY = "<start_of_turn>user\nOrder #12345 arrived 😀 at 09:30?\n\n  tabs\tand  spaces 𘀀<end_of_turn>\n"
BOS = 2


@pytest.fixture(scope="module")
def gguf_path(model_cache: Path) -> Path:
    return bundled_gguf(model_cache)


@pytest.fixture(scope="module")
def gguf_meta(model_cache: Path) -> dict:
    return gguf_metadata(model_cache)  # read once per run: the tiny Gemma's tokenizer reads it too


def tokenize(lm, text: str) -> list[int]:
    return [int(i) for i in np.asarray(lm.preprocessor.tokenizer(text))]


def log_probs(lm, ids: list[int]) -> np.ndarray:
    logits = np.asarray(lm({"token_ids": np.array([ids], "int32"), "padding_mask": np.ones((1, len(ids)), "int32")}))
    return logits[0].astype(np.float64) - _logsumexp(logits[0].astype(np.float64))


def _logsumexp(x: np.ndarray) -> np.ndarray:
    top = x.max(-1, keepdims=True)
    return top + np.log(np.exp(x - top).sum(-1, keepdims=True))


# --- cheap checks (no model weights loaded) -----------------------------------------


def _field_numbers(message, names: list[str]) -> dict[str, int]:
    return {name: message.fields_by_name[name].number for name in names}


def test_spm_descriptor_has_sentencepiece_field_numbers():
    model = model_proto_class().DESCRIPTOR
    assert _field_numbers(model, ["pieces", "trainer_spec", "normalizer_spec"]) == {
        "pieces": 1, "trainer_spec": 2, "normalizer_spec": 3,
    }
    piece = model.nested_types_by_name["SentencePiece"]
    assert _field_numbers(piece, ["piece", "score", "type"]) == {"piece": 1, "score": 2, "type": 3}
    trainer = {"model_type": 3, "vocab_size": 4, "split_digits": 25, "byte_fallback": 35,
               "unk_id": 40, "bos_id": 41, "eos_id": 42, "pad_id": 43}
    assert _field_numbers(model.fields_by_name["trainer_spec"].message_type, list(trainer)) == trainer
    normalizer = {"name": 1, "add_dummy_prefix": 3, "remove_extra_whitespaces": 4, "escape_whitespaces": 5}
    assert _field_numbers(model.fields_by_name["normalizer_spec"].message_type, list(normalizer)) == normalizer


def test_head_layouts_match_keras_einsums():
    rng = np.random.default_rng(0)
    heads, head_dim, hidden = 4, 8, 12
    x = rng.normal(size=(2, 3, hidden))
    w_q = rng.normal(size=(heads * head_dim, hidden))  # HF/GGUF: out_features x in_features
    expected = (x @ w_q.T).reshape(2, 3, heads, head_dim)
    kernel = _heads_in(w_q, (heads, hidden, head_dim))
    np.testing.assert_allclose(np.einsum("btd,ndh->btnh", x, kernel), expected)

    attended = rng.normal(size=(2, 3, heads, head_dim))
    w_o = rng.normal(size=(hidden, heads * head_dim))
    expected = attended.reshape(2, 3, heads * head_dim) @ w_o.T
    kernel = _heads_out(w_o, (heads, head_dim, hidden))
    np.testing.assert_allclose(np.einsum("btnh,nhd->btd", attended, kernel), expected)


def test_rebuilt_sentencepiece_model_round_trips(gguf_meta):
    processor = spm.SentencePieceProcessor(model_proto=tokenizer_proto(gguf_meta))
    assert processor.vocab_size() == 262_144
    assert (processor.bos_id(), processor.eos_id(), processor.pad_id(), processor.unk_id()) == (2, 1, 0, 3)
    ids = processor.encode(TRICKY)
    assert processor.decode(ids) == TRICKY
    assert processor.encode("<start_of_turn>") == [processor.piece_to_id("<start_of_turn>")]
    assert processor.encode("<end_of_turn>") == [processor.piece_to_id("<end_of_turn>")]
    assert [processor.id_to_piece(i) for i in processor.encode("12345")] == list("12345")
    assert processor.id_to_piece(processor.encode("a  b")[1]) == "\u2581\u2581"  # llama.cpp wrote "  "


def test_missing_directory_is_a_clear_error(tmp_path):
    with pytest.raises(ModelSpecError, match="no keras-hub preset directory"):
        resolve_model(str(tmp_path / "no-such-model"))


def test_directory_without_config_is_a_clear_error(tmp_path):
    with pytest.raises(ModelSpecError, match="not a keras-hub preset directory"):
        resolve_model(str(tmp_path))


def test_unknown_name_is_a_clear_error():
    with pytest.raises(ModelSpecError, match="unknown model 'gemma-9000'"):
        resolve_model("gemma-9000")


def test_preset_names_and_handles_resolve_without_network():
    instruct = resolve_model("gemma3_instruct_1b")
    assert (instruct.kind, instruct.preset, instruct.model_id, instruct.instruction_tuned) == (
        "preset_handle", "gemma3_instruct_1b", "gemma3_instruct_1b", True,
    )
    assert resolve_model("kaggle://keras/gemma3/keras/gemma3_1b/3").instruction_tuned is False
    assert resolve_model("hf://google/gemma-3-270m-it").instruction_tuned is True


def test_preset_directory_uses_its_marker_or_its_name(tmp_path):
    baked = tmp_path / "gemma3_instruct_4b_text"
    baked.mkdir()
    (baked / "config.json").write_text("{}")
    source = resolve_model(str(baked))
    assert (source.kind, source.model_id, source.instruction_tuned) == ("preset_dir", "gemma3_instruct_4b_text", True)

    (baked / MARKER).write_text(json.dumps({"model_id": "support-gemma@v7", "instruction_tuned": False}))
    source = resolve_model(str(baked))
    assert (source.model_id, source.instruction_tuned) == ("support-gemma@v7", False)


def test_stale_or_interrupted_conversion_is_redone(tmp_path, monkeypatch):
    """Only the marker decides reuse; a failed conversion leaves nothing that looks usable."""
    calls = []

    def fake_convert(gguf_path, preset_dir, **kwargs):
        calls.append(preset_dir)
        if len(calls) == 1:
            raise KeyboardInterrupt  # killed half-way
        (preset_dir / "config.json").write_text("{}")

    monkeypatch.setattr("pipeline.model.loading.gguf_convert.convert_gguf", fake_convert)
    with pytest.raises(KeyboardInterrupt):
        resolve_model(BASE_SPEC, tmp_path)
    models = tmp_path / "models"
    assert [p.name for p in models.iterdir()] == [".convert.lock"]

    first = resolve_model(BASE_SPEC, tmp_path)
    assert first.converted and first.model_id.startswith("gemma3-270m-q4_k_m@") and not first.instruction_tuned
    assert Path(first.preset).stat().st_mode & 0o777 == 0o755  # readable by other users of a baked image
    marker = Path(first.preset) / MARKER
    assert json.loads(marker.read_text())["converter_version"] == CONVERTER_VERSION
    assert not resolve_model(BASE_SPEC, tmp_path).converted

    marker.write_text(json.dumps({**json.loads(marker.read_text()), "converter_version": CONVERTER_VERSION - 1}))
    assert resolve_model(BASE_SPEC, tmp_path).converted
    assert len(calls) == 3


@pytest.mark.parametrize(
    ("forget_env", "why"),
    [(False, "KERAS_BACKEND=numpy"), (True, "keras was imported before the backend was set")],
)
def test_keras_on_another_backend_is_refused(forget_env, why):
    code = (
        "import os, keras\n"
        + ("del os.environ['KERAS_BACKEND']\n" if forget_env else "")
        + "from pipeline.model.loading.keras_import import import_keras_hub\nimport_keras_hub()\n"
    )
    env = {**os.environ, "KERAS_BACKEND": "numpy"}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert f"needs the JAX keras backend but keras is using 'numpy' ({why})" in result.stderr


@pytest.mark.parametrize(
    ("given", "expected"),
    [("", "--xla_cpu_enable_concurrency_optimized_scheduler=false"),
     ("--xla_cpu_use_thunk_runtime=true", "--xla_cpu_use_thunk_runtime=true "
                                          "--xla_cpu_enable_concurrency_optimized_scheduler=false"),
     ("--xla_cpu_enable_concurrency_optimized_scheduler=true", "--xla_cpu_enable_concurrency_optimized_scheduler=true")],
)
def test_xla_flags_are_added_to_a_users_and_xla_accepts_them(given, expected):
    """ChatLens's XLA flags (environment.DEFAULT_XLA_FLAGS) join the user's, whose own setting
    wins; XLA aborts on a flag it does not know, so a computation running proves it took them."""
    code = ("import os\nfrom pipeline.model.loading.keras_import import import_keras_hub\nimport_keras_hub()\n"
            "import jax.numpy as jnp\nprint(int(jnp.arange(4).sum()), os.environ['XLA_FLAGS'])\n")
    env = {**os.environ, "XLA_FLAGS": given}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == f"6 {expected}"


def test_serving_loads_a_preset_without_tensorflow_and_tokenizes_the_same(tiny_lm, tmp_path):
    """TensorFlow is ~600 MiB of RSS that serving never uses (keras-hub tokenizes with sentencepiece)."""
    tiny_lm.save_to_preset(str(tmp_path / "tiny"))
    text = "Hello <start_of_turn>model\nPP-5561027 ünïcode"
    code = ("import sys\nfrom pipeline.model.loading.sources import ModelSource\n"
            f"lm = ModelSource('tiny', 'preset_dir', {str(tmp_path / 'tiny')!r}, 'tiny', False).load('bfloat16', "
            "tensorflow=False)\n"
            "assert sys.modules['tensorflow'] is None and 'tensorflow_text' not in sys.modules\n"
            f"print(lm.backbone.dtype_policy.name, *lm.preprocessor.tokenizer.tokenize({text!r}).tolist())\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["bfloat16", *map(str, tiny_lm.preprocessor.tokenizer.tokenize(text).tolist())]


# --- the real model ---------------------------------------------------------------------


@pytest.mark.slow
def test_keras_tokenizer_round_trips_and_keeps_markers_whole(gemma_lm):
    tokenizer = gemma_lm.preprocessor.tokenizer
    ids = tokenize(gemma_lm, TRICKY)
    assert tokenizer.detokenize(ids) == TRICKY
    assert tokenize(gemma_lm, "<start_of_turn>") == [105]
    assert tokenize(gemma_lm, "<end_of_turn>") == [106]
    assert tokenize(gemma_lm, "2024") == [tokenizer.token_to_id(d) for d in "2024"]


@pytest.mark.slow
def test_prose_perplexity_is_that_of_a_working_model(gemma_lm):
    ids = [BOS, *tokenize(gemma_lm, PROSE)]
    nll = -log_probs(gemma_lm, ids)[np.arange(len(ids) - 1), ids[1:]].mean()
    print(f"per-token NLL {nll:.3f} over {len(ids) - 1} tokens")
    assert nll < 3.0


@pytest.mark.slow
def test_greedy_continuation_knows_paris(gemma_lm):
    prompt = "The capital of France is a city called"
    continuation = gemma_lm.generate(prompt, max_length=16)[len(prompt):]
    assert continuation.strip().startswith("Paris"), continuation


@pytest.mark.slow
def test_cached_conversion_is_reused(gemma_source, model_cache):
    marker = Path(gemma_source.preset) / MARKER
    before = marker.stat().st_mtime_ns
    start = time.perf_counter()
    again = resolve_model(GGUF_SPEC, model_cache)
    resolved = time.perf_counter() - start
    lm, source = load_causal_lm(GGUF_SPEC, model_cache)
    loaded = time.perf_counter() - start
    print(f"cached resolve {resolved:.2f}s, resolve+load {loaded:.1f}s")
    assert not again.converted and again.preset == gemma_source.preset
    assert marker.stat().st_mtime_ns == before
    assert resolved < 2.0  # a marker read, no conversion; the load itself is timed above, not bounded
    assert type(lm).__name__ == "Gemma3CausalLM" and not source.converted


# --- independent NumPy reference over the raw GGUF tensors -------------------------------


def _rms_norm(x: np.ndarray, stored_scale: np.ndarray, eps: float) -> np.ndarray:
    """llama.cpp's RMSNorm: the GGUF scale already includes Gemma's +1."""
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * stored_scale


def _rope(x: np.ndarray, base: float) -> np.ndarray:
    """NeoX-style (rotate-half) RoPE over (tokens, heads, head_dim)."""
    half = x.shape[-1] // 2
    angles = np.arange(x.shape[0])[:, None] * base ** (-np.arange(half) / half)[None, :]
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def reference_logits(path: Path, ids: list[int], positions: list[int]) -> np.ndarray:
    """Gemma 3 forward pass in float64 straight from the GGUF (llama.cpp semantics)."""
    reader = gguf.GGUFReader(path)
    meta = read_metadata(reader)
    w = {t.name: gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64) for t in reader.tensors}
    a = "gemma3."
    layers, hidden = meta[a + "block_count"], meta[a + "embedding_length"]
    n_q, n_kv = meta[a + "attention.head_count"], meta[a + "attention.head_count_kv"]
    head_dim = meta[a + "attention.key_length"]
    eps, window = meta[a + "attention.layer_norm_rms_epsilon"], meta[a + "attention.sliding_window"]
    global_base, local_base = meta[a + "rope.freq_base"], 10_000.0  # Gemma 3: local base is not in the GGUF

    t = len(ids)
    embed = w["token_embd.weight"]
    x = embed[ids] * np.sqrt(hidden)
    qi, ki = np.arange(t)[:, None], np.arange(t)[None, :]
    for layer in range(layers):
        p = f"blk.{layer}."
        is_global = layer % 6 == 5  # five sliding-window layers, then one global
        mask = ki <= qi if is_global else (ki <= qi) & (ki > qi - window)
        base = global_base if is_global else local_base

        h = _rms_norm(x, w[p + "attn_norm.weight"], eps)
        q = _rms_norm((h @ w[p + "attn_q.weight"].T).reshape(t, n_q, head_dim), w[p + "attn_q_norm.weight"], eps)
        k = _rms_norm((h @ w[p + "attn_k.weight"].T).reshape(t, n_kv, head_dim), w[p + "attn_k_norm.weight"], eps)
        v = (h @ w[p + "attn_v.weight"].T).reshape(t, n_kv, head_dim)
        q, k = _rope(q, base), _rope(k, base)
        k, v = np.repeat(k, n_q // n_kv, axis=1), np.repeat(v, n_q // n_kv, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(head_dim)
        scores = np.where(mask[None], scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attended = np.einsum("hqk,khd->qhd", probs, v).reshape(t, n_q * head_dim)
        x = x + _rms_norm(attended @ w[p + "attn_output.weight"].T, w[p + "post_attention_norm.weight"], eps)

        h = _rms_norm(x, w[p + "ffn_norm.weight"], eps)
        gated = _gelu_tanh(h @ w[p + "ffn_gate.weight"].T) * (h @ w[p + "ffn_up.weight"].T)
        x = x + _rms_norm(gated @ w[p + "ffn_down.weight"].T, w[p + "post_ffw_norm.weight"], eps)
    x = _rms_norm(x, w["output_norm.weight"], eps)
    return x[positions] @ embed.T  # tied embeddings, no final soft-cap in Gemma 3


@pytest.mark.slow
def test_keras_logits_match_numpy_reference_of_the_gguf(gemma_lm, gguf_path):
    """A 600-token prompt, so local layers really slide past the 512-token window."""
    ids = [BOS, *tokenize(gemma_lm, " ".join([PROSE] * 7))][:600]
    positions = [0, 1, 7, 100, 510, 511, 512, 513, 550, 599]
    expected = reference_logits(gguf_path, ids, positions)
    logits = np.asarray(
        gemma_lm({"token_ids": np.array([ids], "int32"), "padding_mask": np.ones((1, len(ids)), "int32")})
    )[0, positions].astype(np.float64)
    rel = np.abs(logits - expected).max() / np.abs(expected).max()
    print(f"max |keras - numpy| = {np.abs(logits - expected).max():.2e}, logit scale {np.abs(expected).max():.1f}")
    assert rel < 1e-3
    assert (logits.argmax(-1) == expected.argmax(-1)).all()
