"""One pass per chat for a Gemma tuned on `chat_format`: prefill once, then label, summary, reply.

For a batch of chats (left-padded, one length group):
1. the prompts are prefilled once into one attention cache; the label probabilities are
   the three label tokens' logits at the prompt's end through the adapter's calibration
   (`pipeline/model/calibration.py`), and the label is their argmax;
2. each row is fed its label token and the summary cue, then decodes its summary greedily;
3. a row whose reply is wanted (`reply_for`: always, or where its label came out negative)
   is fed the reply cue as soon as its summary ends and decodes the reply on the same cache;
   other rows stop there.
Every row advances one position per step, so a row's sequence has no gaps and is exactly
what it was trained on. The vocabulary projection runs only where a token is read: the
last prompt position and one position per decoding step.
"""

from __future__ import annotations

import functools
import itertools
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import keras
import numpy as np

from chatlens.contracts import MAX_REPLY_CHARS, MAX_SUMMARY_CHARS, ChatWindow
from pipeline.model.analysis import REPLY_FOR, WindowAnalysis, reply_policies
from pipeline.model.calibration import LabelCalibration
from pipeline.model.chat_format import (
    MAX_PROMPT_TOKENS,
    REPLY_CHARS,
    REPLY_TOKENS,
    SUMMARY_CHARS,
    SUMMARY_TOKENS,
    Vocabulary,
)
from pipeline.model.decode_step import forward_cached, forward_one, to_head_major
from pipeline.model.generation import BATCH_BUCKETS, LENGTH_BUCKETS, bucket, clean_completion, length_groups

log = logging.getLogger(__name__)

SUMMARY, REPLY_CUE, REPLY, DONE = 0, 1, 2, 3  # a row's phase while decoding


@dataclass(frozen=True)
class ChatOutput:
    """What one pass produced for one chat."""

    probabilities: tuple[float, float, float]  # P(negative), P(neutral), P(positive), calibrated
    label_logits: tuple[float, float, float]  # before calibration, for fitting one
    summary: str
    reply: str | None
    truncated: bool
    summary_tokens: int
    reply_tokens: int


class OnePassDecoder:
    """Label probabilities, summary and reply from one prefill per chat, batched."""

    def __init__(self, causal_lm, *, max_prompt_tokens: int = MAX_PROMPT_TOKENS,
                 summary_tokens: int = SUMMARY_TOKENS, reply_tokens: int = REPLY_TOKENS,
                 calibration: LabelCalibration = LabelCalibration()):
        self.lm = causal_lm
        self.backbone = causal_lm.backbone
        tokenizer = causal_lm.preprocessor.tokenizer
        self.tokenizer = tokenizer
        self.vocabulary = Vocabulary.of(self._tokenize, tokenizer.start_token_id, tokenizer.end_token_id)
        self.max_prompt_tokens = max_prompt_tokens
        self.summary_tokens = summary_tokens
        self.reply_tokens = reply_tokens
        self.calibration = calibration
        self.compiles: list[str] = []
        self._lock = threading.Lock()
        self._run = self._build()

    def _tokenize(self, text: str) -> list[int]:
        ids = self.tokenizer.tokenize(text)
        return ids.tolist() if hasattr(ids, "tolist") else list(ids)

    def _decode(self, ids: Sequence[int]) -> str:
        if not ids:
            return ""
        text = self.tokenizer.detokenize([list(ids)])[0]
        return text.decode("utf-8") if isinstance(text, bytes) else str(text)

    def _state(self):
        return ([v.value for v in self.lm.trainable_variables], [v.value for v in self.lm.non_trainable_variables])

    def _scope(self, state):
        trainable, frozen = state
        return keras.StatelessScope(state_mapping=itertools.chain(
            zip(self.lm.trainable_variables, trainable), zip(self.lm.non_trainable_variables, frozen)))

    def _logits(self, hidden):
        return self.backbone.token_embedding(hidden, reverse=True).astype("float32")

    def _build(self):
        v = self.vocabulary
        backbone = self.backbone
        labels = jnp.array(v.labels, "int32")
        cue = jnp.array(v.summary_cue, "int32")
        reply_cue = jnp.array(v.reply_cue, "int32")
        summary_stops = jnp.array([v.summary_end, v.eos], "int32")
        reply_stops = jnp.array([v.eos, v.summary_end], "int32")
        max_summary, max_reply = self.summary_tokens, self.reply_tokens

        @functools.partial(jax.jit, static_argnames=("steps",))
        def run(state, prompt_ids, key_mask, reply_mode, label_bias, steps):
            batch, length = prompt_ids.shape
            total = length + 1 + cue.shape[0] + steps
            shape = (batch, total, backbone.num_key_value_heads, backbone.head_dim)
            dtype = self.lm.compute_dtype
            cache = tuple((jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)) for _ in range(backbone.num_layers))
            mask = jnp.concatenate([key_mask, jnp.ones((batch, total - length), bool)], axis=1)
            with self._scope(state):
                hidden, cache = forward_cached(backbone, prompt_ids, cache, 0, mask)
                label_logits = self._logits(hidden[:, -1:, :])[:, 0, :][:, labels]
                if steps == 0:  # the label only
                    return label_logits, jnp.zeros((batch, 0), "int32"), jnp.zeros((batch, 0), "int32")
                chosen = labels[jnp.argmax(label_logits + label_bias, axis=-1)]
                # reply_mode is an index into REPLY_FOR: 0 negative, 1 all, 2 none
                wants_reply = (reply_mode == 1) | ((reply_mode == 0) & (chosen == labels[0]))
                head = jnp.concatenate([chosen[:, None], jnp.broadcast_to(cue, (batch, cue.shape[0]))], axis=1)
                hidden, cache = forward_cached(backbone, head, cache, length, mask)
                logits = self._logits(hidden[:, -1:, :])[:, 0, :]
            cache = to_head_major(cache)

            def step(carry):
                i, cache, logits, phase, count, cue_at, tokens, phases = carry
                greedy = jnp.argmax(logits, axis=-1).astype("int32")
                token = jnp.select(
                    [phase == REPLY_CUE, (phase == SUMMARY) & (count >= max_summary), (phase == REPLY) & (count >= max_reply)],
                    [reply_cue[jnp.minimum(cue_at, reply_cue.shape[0] - 1)], v.summary_end, v.eos], greedy)
                tokens = tokens.at[:, i].set(token)
                phases = phases.at[:, i].set(phase)
                after_summary = jnp.where(wants_reply & (token == v.summary_end), REPLY_CUE, DONE)
                next_phase = jnp.select(
                    [phase == SUMMARY, phase == REPLY_CUE, phase == REPLY],
                    [jnp.where(jnp.isin(token, summary_stops), after_summary, SUMMARY),
                     jnp.where(cue_at + 1 >= reply_cue.shape[0], REPLY, REPLY_CUE),
                     jnp.where(jnp.isin(token, reply_stops), DONE, REPLY)], DONE)
                count = jnp.where(next_phase != phase, 0, count + 1)
                cue_at = jnp.where(phase == REPLY_CUE, cue_at + 1, 0)
                with self._scope(state):
                    position = length + 1 + cue.shape[0] + i
                    hidden, cache = forward_one(backbone, token[:, None], cache, position, mask)
                    logits = self._logits(hidden)[:, 0, :]
                return i + 1, cache, logits, next_phase, count, cue_at, tokens, phases

            def running(carry):
                i, *_, phase, _count, _cue_at, _tokens, _phases = carry
                return (i < steps) & ~jnp.all(phase == DONE)

            zeros = jnp.zeros((batch,), "int32")
            carry = (0, cache, logits, zeros + SUMMARY, zeros, zeros, jnp.zeros((batch, steps), "int32"),
                     jnp.full((batch, steps), DONE, "int32"))
            _, _, _, _, _, _, tokens, phases = jax.lax.while_loop(running, step, carry)
            return label_logits, tokens, phases

        return run

    def run(self, windows: Sequence[ChatWindow], reply_for: Sequence[str] | None = None,
            label_only: bool = False) -> list[ChatOutput]:
        """One pass per chat; `reply_for[i]` says when chat i gets a reply: 'negative' (when its
        label comes out negative), 'all' or 'none' (the default). `label_only` stops after the
        label (no summary, no reply): what classifying and fitting a calibration need."""
        wants = reply_policies(reply_for if reply_for is not None else "none", len(windows))
        prompts, cut = zip(*(self.vocabulary.prompt(w, self.max_prompt_tokens) for w in windows))
        outputs: list[ChatOutput | None] = [None] * len(windows)
        with self._lock:
            # One group per call (up to the largest batch bucket), however different the lengths:
            # the decoding steps, not the prefill, are most of the cost here, and every group decodes
            # them again; one group also means one XLA program per length bucket, not per group shape.
            for group in length_groups([len(p) for p in prompts], max_spread=self.max_prompt_tokens):
                rows = self._run_group([prompts[i] for i in group], [wants[i] for i in group], label_only)
                for i, out in zip(group, rows):
                    outputs[i] = ChatOutput(truncated=cut[i], **out)
        return outputs  # type: ignore[return-value]

    def _run_group(self, prompts: list[list[int]], wants: list[str], label_only: bool = False) -> list[dict]:
        batch = bucket(len(prompts), BATCH_BUCKETS)
        length = bucket(max(map(len, prompts)), LENGTH_BUCKETS)
        filler = min(prompts, key=len)
        token_ids = np.zeros((batch, length), "int32")
        mask = np.zeros((batch, length), bool)
        for i, row in enumerate(itertools.chain(prompts, itertools.repeat(filler, batch - len(prompts)))):
            token_ids[i, length - len(row):] = row
            mask[i, length - len(row):] = True
        modes = np.array([REPLY_FOR.index(w) for w in wants] + [REPLY_FOR.index("none")] * (batch - len(prompts)),
                         "int32")
        may_reply = any(w != "none" for w in wants)
        steps = 0 if label_only else (
            self.summary_tokens + 1 + (len(self.vocabulary.reply_cue) + self.reply_tokens if may_reply else 0))
        key = f"one-pass batch={batch} length={length} steps={steps}"
        if key not in self.compiles:
            self.compiles.append(key)
            log.info("XLA compile #%d: %s", len(self.compiles), key)
        bias = np.asarray(self.calibration.bias, "float32")
        logits, tokens, phases = map(np.asarray, self._run(self._state(), token_ids, mask, modes, bias, steps=steps))
        probabilities = self.calibration.probabilities(logits)
        results = []
        for row in range(len(prompts)):
            summary = [t for t, p in zip(tokens[row], phases[row]) if p == SUMMARY]
            reply = [t for t, p in zip(tokens[row], phases[row]) if p == REPLY]
            results.append({
                "probabilities": tuple(float(x) for x in probabilities[row]),
                "label_logits": tuple(float(x) for x in logits[row]),
                "summary": self._finish(summary, "summary"),
                "reply": self._finish(reply, "reply") if any(p == REPLY_CUE for p in phases[row]) else None,
                "summary_tokens": len(self._content(summary)),
                "reply_tokens": len(self._content(reply)),
            })
        return results

    def _content(self, tokens: Sequence[int]) -> list[int]:
        return [t for t in tokens if t not in (self.vocabulary.summary_end, self.vocabulary.eos)]

    def _finish(self, tokens: Sequence[int], kind: str) -> str:
        """Generated tokens as staff see them: stops dropped, one clean paragraph ending at the last
        whole sentence within `SUMMARY_CHARS` or `REPLY_CHARS` (pipeline/model/chat_format.py)."""
        limits = {"summary": (MAX_SUMMARY_CHARS, SUMMARY_CHARS), "reply": (MAX_REPLY_CHARS, REPLY_CHARS)}[kind]
        return clean_completion(self._decode(self._content(tokens)), *limits)


class OnePassEngine:
    """The engine interface (`analyze`, `classify`) of a model tuned by ChatLens: one pass per chat.

    What the Beam handler shares per machine when the model spec resolves to a tuned model
    (the default `gemma3-270m`); untuned models get the prompted `GemmaEngine`.
    """

    prompt_version = "tuned-one-pass-v1"

    def __init__(self, causal_lm, model_id: str, max_prompt_tokens: int = MAX_PROMPT_TOKENS,
                 calibration: LabelCalibration = LabelCalibration()):
        self.decoder = OnePassDecoder(causal_lm, max_prompt_tokens=max_prompt_tokens, calibration=calibration)
        self.model_id = model_id
        self.batches = 0
        self.generated_tokens = 0

    def analyze(self, windows: Sequence[ChatWindow], reply_for: str | Sequence[str] = "none") -> list[WindowAnalysis]:
        """Sentiment, summary and (where `reply_for`, one policy or one per window, selects it) a
        reply draft, from one pass each."""
        outputs = self.decoder.run(windows, reply_policies(reply_for, len(windows)))
        self.batches += 1
        self.generated_tokens += sum(o.summary_tokens + o.reply_tokens for o in outputs)
        results = []
        for out in outputs:
            flags = ("context_truncated",) if out.truncated else ()
            summary = out.summary
            if not summary:
                summary, flags = "(no summary: the model returned nothing)", flags + ("summary_empty",)
            if out.reply == "":
                flags += ("reply_empty",)
            results.append(WindowAnalysis(scores=out.probabilities, summary=summary, model_id=self.model_id,
                                          prompt_version=self.prompt_version, flags=flags,
                                          reply_draft=out.reply or None))
        return results

    def classify(self, windows: Sequence[ChatWindow]) -> list[tuple[float, float, float]]:
        """Calibrated label probabilities only: no decoding."""
        return [out.probabilities for out in self.decoder.run(windows, label_only=True)]

    def label_logits(self, windows: Sequence[ChatWindow]) -> np.ndarray:
        """The label tokens' raw logits (n, 3): what a calibration is fitted on."""
        return np.array([out.label_logits for out in self.decoder.run(windows, label_only=True)])

    def get_stats(self) -> dict:
        return {"compiles": list(self.decoder.compiles), "batches": self.batches,
                "generated_tokens": self.generated_tokens}
