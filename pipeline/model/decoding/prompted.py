"""PromptedEngine: batched sentiment scoring and text generation with one loaded, untuned Gemma.

This object is what a Beam worker shares between threads and processes (backends/gemma/handler.py).
Its public methods take and return plain picklable values, because with
`share_model_across_processes` Beam calls them through a proxy in another process.

Speed comes from three things: every call works on a whole batch; batch size and sequence
length are padded to a few buckets so XLA compiles a bounded number of programs (each one
logged, at most `programs.MAX_PROGRAMS` held at once); sentiment is one forward pass that scores the label tokens instead of
generating and parsing text; and generation right-aligns the prompts so that every row
decodes only its own new tokens.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import jax
import jax.numpy as jnp
import numpy as np

from chatlens.contracts import MAX_REPLY_CHARS, MAX_SUMMARY_CHARS, ChatWindow
from pipeline.model.decoding.buckets import length_groups, padded_rows
from pipeline.model.decoding.programs import MAX_PROGRAMS, Programs
from pipeline.model.decoding.state import detokenize, model_state, stateless_scope, token_ids
from pipeline.model.decoding.step import empty_cache
from pipeline.model.decoding.text import clean_completion, is_degenerate
from pipeline.model.types import Task, WindowAnalysis, reply_policies, wants_reply
from pipeline.prompts import PromptSet, fit_transcript, transcript_lines

log = logging.getLogger(__name__)

# Prompts run together differ by at most this many tokens: one long chat would otherwise pad
# a whole batch to its length (prefill cost grows with padded tokens, not with real ones).
LENGTH_SPREAD = 128


@dataclass(frozen=True)
class EngineConfig:
    """Knobs of the engine; the defaults suit the 270M model on a small CPU."""

    max_prompt_tokens: int = 1024
    summary_tokens: int = 80
    reply_tokens: int = 120
    repetition_penalty: float = 1.3
    # Contextual calibration divides label probabilities by bias**strength. 1.0 is the
    # paper's full correction; on the labelled set (tests/data) 0.5 gave the best macro-F1
    # for the 270M model, which over-corrects towards "neutral" at 1.0.
    calibration_strength: float = 0.5


@dataclass(frozen=True)
class Generated:
    text: str
    tokens: int
    degenerate: bool = False
    retried: bool = False


@dataclass
class EngineStats:
    """Counters the benchmark and the Beam metrics read."""

    compiles: list[str] = field(default_factory=list)
    batches: int = 0
    generate_calls: int = 0
    generated_tokens: int = 0


class PromptedEngine:
    """A loaded keras-hub Gemma causal LM (not tuned by ChatLens) with ChatLens's batched tasks on
    top, prompted once per output. A model tuned by ChatLens gets `one_pass.OnePassEngine`;
    `backends/gemma/engine.py` picks."""

    def __init__(self, causal_lm, model_id: str, prompts: PromptSet, config: EngineConfig = EngineConfig(),
                 max_programs: int = MAX_PROGRAMS):
        self.lm = causal_lm
        self.model_id = model_id
        self.prompts = prompts
        self.prompt_version = prompts.version
        self.config = config
        self.stats = EngineStats()
        self.tokenizer = causal_lm.preprocessor.tokenizer
        self._lock = threading.Lock()
        self._shapes: set[tuple] = set()
        self._label_ids = self._single_token_ids(prompts.labels)
        self._stop_ids = {task: self._stop_token_ids(stops) for task, stops in prompts.stop.items()}
        template = prompts.templates[Task.SENTIMENT]
        self._head_text = template[: template.index("{transcript}")]
        self._head = None  # attention cache of the shared prompt head, built on first use
        self.programs = Programs(max_programs)  # the compiled programs held (`programs.py`)
        self._prefill_fn, self._score_fn = self._build_score_fns()
        self._generate_fn = self._build_generate_fn()
        self._overhead_tokens = {task: len(self._encode(prompts.overhead(task))) for task in prompts.templates}
        self._calibration = self._content_free_bias()

    # ---- tokens -------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        return token_ids(self.tokenizer, text)

    def _encode(self, text: str) -> list[int]:
        """Token ids of a whole prompt: BOS first, as Gemma was trained."""
        return [self.tokenizer.start_token_id, *self.tokenize(text)]

    def _decode(self, ids: Sequence[int]) -> str:
        return detokenize(self.tokenizer, ids)

    def _single_token_ids(self, labels: Sequence[str]) -> list[int]:
        ids = [self._encode(label)[1:] for label in labels]
        first = [token_ids[0] for token_ids in ids]
        if len(set(first)) != len(first):
            raise ValueError(f"labels {labels} must start with distinct tokens")
        return first

    def _stop_token_ids(self, stops: Sequence[str]) -> tuple[int, ...]:
        ids = {self.tokenizer.end_token_id}
        for name in ("<end_of_turn>",):
            try:
                ids.add(int(self.tokenizer.token_to_id(name)))
            except (KeyError, ValueError):
                pass
        # A vocabulary entry made of a stop string repeated ("\n\n", "...") stops too.
        for stop in stops:
            for piece in (stop, stop * 2, stop * 3):
                token_ids = self._encode(piece)[1:]
                if len(token_ids) == 1:
                    ids.add(token_ids[0])
        return tuple(sorted(ids))

    def fitted_transcript(self, task: str, window: ChatWindow) -> tuple[str, bool]:
        """The chat as prompt text, cut from its oldest messages to fit the task's context."""
        budget = self.config.max_prompt_tokens - self._max_new_tokens(task)
        overhead = self._overhead_tokens[task]

        def fits(transcript: str) -> bool:
            return overhead + len(self.tokenize(transcript)) <= budget

        return fit_transcript(transcript_lines(window.messages), fits)

    def prompt_for(self, task: str, window: ChatWindow) -> tuple[str, bool]:
        """The prompt for one task and whether older messages were cut to fit."""
        transcript, truncated = self.fitted_transcript(task, window)
        return self.prompts.render(task, transcript), truncated

    def _max_new_tokens(self, task: str) -> int:
        return {Task.SENTIMENT: 1, Task.SUMMARY: self.config.summary_tokens, Task.REPLY: self.config.reply_tokens}[task]

    # ---- compiled programs -------------------------------------------------------------
    def _note_shape(self, kind: str, batch: int, length: int) -> None:
        key = (kind, batch, length)
        if key not in self._shapes:
            self._shapes.add(key)
            self.stats.compiles.append(f"{kind} batch={batch} length={length}")
            log.info("XLA compile #%d: %s batch=%d length=%d", len(self._shapes), kind, batch, length)

    def _scope(self, state):
        return stateless_scope(self.lm, state)

    def _build_score_fns(self):
        """Two jitted programs: prefill a shared prompt head once, then score many chats on it.

        Every sentiment prompt starts with the same few-shot examples; their attention cache
        is computed once and broadcast over the batch, so each chat costs only its own tokens.
        """
        lm, backbone = self.lm, self.lm.backbone

        @self.programs.jit
        def prefill(state, token_ids):
            empty = empty_cache(backbone, *token_ids.shape, lm.compute_dtype)
            with self._scope(state):
                _, _, cache = lm.call_with_cache(token_ids, empty, 0)
            return cache

        @self.programs.jit
        def score(state, head_cache, token_ids, last_index, label_ids):
            batch, length = token_ids.shape
            head_length = head_cache[0][0].shape[1]

            def extend(x):
                x = jnp.broadcast_to(x, (batch, *x.shape[1:]))
                return jnp.concatenate([x, jnp.zeros((batch, length, *x.shape[2:]), x.dtype)], axis=1)

            cache = tuple((extend(k), extend(v)) for k, v in head_cache)
            with self._scope(state):
                _, hidden, _ = lm.call_with_cache(token_ids, cache, head_length)
                last = jnp.take_along_axis(hidden, last_index[:, None, None], axis=1)[:, 0, :]
                logits = backbone.token_embedding(last, reverse=True)
            return jax.nn.log_softmax(logits.astype("float32"), axis=-1)[:, label_ids]

        return prefill, score

    def _state(self):
        return model_state(self.lm)

    def _label_probabilities(self, transcripts: Sequence[str]) -> np.ndarray:
        """P(label | sentiment prompt) renormalised over the three labels: one pass per length group."""
        if self._head is None:
            head_ids = np.array([self._encode(self._head_text)], dtype="int32")
            self._note_shape("prefill", *head_ids.shape)
            self._head = self._prefill_fn(self._state(), head_ids)
        rows = [self.tokenize(self.prompts.render(Task.SENTIMENT, t)[len(self._head_text):]) for t in transcripts]
        log_probs = np.zeros((len(rows), len(self._label_ids)), dtype="float32")
        for group in length_groups([len(r) for r in rows], max_spread=LENGTH_SPREAD):
            token_ids, _ = padded_rows([rows[i] for i in group])
            self._note_shape("score", *token_ids.shape)
            last = np.array([len(rows[i]) - 1 for i in group] + [0] * (len(token_ids) - len(group)), dtype="int32")
            scored = self._score_fn(self._state(), self._head, token_ids, last, np.array(self._label_ids, dtype="int32"))
            log_probs[group] = np.asarray(scored)[: len(group)]
        probs = np.exp(log_probs - log_probs.max(axis=1, keepdims=True))
        return probs / probs.sum(axis=1, keepdims=True)

    def _content_free_bias(self) -> np.ndarray:
        """Contextual calibration: the label bias of the prompt on content-free transcripts."""
        bias = self._label_probabilities(self.prompts.calibration).mean(axis=0)
        log.info("sentiment calibration bias (neg, neu, pos): %s", np.round(bias, 3).tolist())
        return bias

    def _build_generate_fn(self):
        """Greedy decoding of left-padded prompts: one prefill, then one step per new token.

        keras-hub's own generate needs right padding, so every row decodes from the shortest
        prompt's end and longer rows spend steps re-reading their prompts. With prompts
        right-aligned, all rows start together and the loop runs `max_new` steps at most,
        fewer once every row has produced a stop token. Padding is masked out of attention;
        Gemma's rotary positions are relative, so a row's shift does not change its output.
        `penalised` divides the logits of tokens already generated by the repetition penalty.
        """
        lm, backbone = self.lm, self.lm.backbone
        penalty = self.config.repetition_penalty

        @functools.partial(self.programs.jit, static_argnames=("max_new", "penalised"))
        def generate(state, token_ids, key_mask, stop_ids, max_new, penalised):
            batch, length = token_ids.shape
            start = length - max_new
            cache = empty_cache(backbone, batch, length, lm.compute_dtype)
            with self._scope(state):
                # the prompt's last position alone through the vocabulary: all of them would be
                # batch x length x 262,144 float32 logits (8 x 256: 2.1 GB) to read one row each
                _, hidden, cache = lm.call_with_cache(token_ids[:, :start], cache, 0, padding_mask=key_mask)
                logits = backbone.token_embedding(hidden[:, -1:, :], reverse=True)
            rows = jnp.arange(batch)

            def step(carry):
                index, tokens, cache, logits, seen, done = carry
                logits = logits.astype("float32")
                if penalised:
                    logits = jnp.where(seen, jnp.where(logits > 0, logits / penalty, logits * penalty), logits)
                chosen = jnp.argmax(logits, axis=-1).astype("int32")
                tokens = jax.lax.dynamic_update_slice(tokens, chosen[:, None], (0, index))
                done = done | jnp.isin(chosen, stop_ids)
                with self._scope(state):
                    logits, _, cache = lm.call_with_cache(chosen[:, None], cache, index, padding_mask=key_mask)
                return index + 1, tokens, cache, logits[:, -1], seen.at[rows, chosen].set(True), done

            def running(carry):
                index, *_, done = carry
                return (index < length) & ~jnp.all(done)

            seen = jnp.zeros((batch, logits.shape[-1]), bool)
            carry = (start, token_ids, cache, logits[:, -1], seen, jnp.zeros((batch,), bool))
            return jax.lax.while_loop(running, step, carry)[1][:, start:]

        return generate

    def _generate_group(self, rows: list[list[int]], max_new: int, stop_ids: tuple[int, ...], penalised: bool
                        ) -> list[list[int]]:
        token_ids, mask = padded_rows(rows, extra=max_new, left=True)
        self._note_shape("generate-penalised" if penalised else "generate", *token_ids.shape)
        self.stats.generate_calls += 1
        out = np.asarray(self._generate_fn(self._state(), token_ids, mask, np.array(stop_ids, dtype="int32"),
                                           max_new=max_new, penalised=penalised))
        results = []
        for new in out[: len(rows)].tolist():
            ends = [j for j, token in enumerate(new) if token in stop_ids]
            results.append(new[: ends[0]] if ends else new)
        return results

    def _generate_tokens(self, rows: list[list[int]], max_new: int, stop_ids: tuple[int, ...], penalised: bool
                         ) -> list[list[int]]:
        """Generate for all rows in as few calls as their length spread allows."""
        results: list[list[int]] = [[] for _ in rows]
        for group in length_groups([len(r) for r in rows], max_spread=LENGTH_SPREAD):
            for index, new in zip(group, self._generate_group([rows[i] for i in group], max_new, stop_ids, penalised)):
                results[index] = new
        return results

    def generate(self, prompts: Sequence[str], max_new_tokens: int, stop_ids: tuple[int, ...]) -> list[Generated]:
        """Greedy generation; outputs caught in a repetition loop are retried once, penalised."""
        rows = [self._encode(p) for p in prompts]
        tokens = self._generate_tokens(rows, max_new_tokens, stop_ids, penalised=False)
        texts = [self._decode(t) for t in tokens]
        looping = [i for i, (t, text) in enumerate(zip(tokens, texts)) if is_degenerate(t, text)]
        retried: dict[int, Generated] = {}
        if looping:
            again = self._generate_tokens([rows[i] for i in looping], max_new_tokens, stop_ids, penalised=True)
            for i, new in zip(looping, again):
                text = self._decode(new)
                retried[i] = Generated(text, len(new), degenerate=is_degenerate(new, text), retried=True)
        results = [retried.get(i, Generated(text, len(t))) for i, (t, text) in enumerate(zip(tokens, texts))]
        self.stats.generated_tokens += sum(r.tokens for r in results)
        return results

    # ---- ChatLens tasks ----------------------------------------------------------------
    def _answers(self, task: str, prompts: Sequence[str]) -> list[Generated]:
        """Generated answers with the template's forced opening put back in front."""
        prefix = self.prompts.answer_prefix[task]
        return [replace(g, text=prefix + g.text) for g in
                self.generate(prompts, self._max_new_tokens(task), self._stop_ids[task])]

    def sentiment(self, windows: Sequence[ChatWindow]) -> np.ndarray:
        transcripts = [self.fitted_transcript(Task.SENTIMENT, w)[0] for w in windows]
        calibrated = self._label_probabilities(transcripts) / self._calibration ** self.config.calibration_strength
        return calibrated / calibrated.sum(axis=1, keepdims=True)

    def classify(self, windows: Sequence[ChatWindow]) -> list[tuple[float, float, float]]:
        """Calibrated sentiment probabilities only (no generation): what `chatlens eval` measures."""
        with self._lock:
            return [tuple(float(s) for s in row) for row in self.sentiment(windows)]  # type: ignore[misc]

    def analyze(self, windows: Sequence[ChatWindow], reply_for: str | Sequence[str] = "none") -> list[WindowAnalysis]:
        """Sentiment (one scoring pass) and summary (one batched generation) for each window, then
        reply drafts (one more generation) where `reply_for` (one policy, or one per window) selects."""
        analyses = self._analyze(windows)
        policies = reply_policies(reply_for, len(windows))
        wanted = [i for i, (a, policy) in enumerate(zip(analyses, policies)) if wants_reply(policy, a.sentiment)]
        for i, (draft, flags) in zip(wanted, self.draft_replies([windows[i] for i in wanted]) if wanted else ()):
            analyses[i] = replace(analyses[i], reply_draft=draft, flags=analyses[i].flags + flags)
        return analyses

    def _analyze(self, windows: Sequence[ChatWindow]) -> list[WindowAnalysis]:
        with self._lock:
            started = time.perf_counter()
            scores = self.sentiment(windows)
            prompts, truncated = zip(*(self.prompt_for(Task.SUMMARY, w) for w in windows))
            summaries = self._answers(Task.SUMMARY, prompts)
            self.stats.batches += 1
            log.debug("analyzed %d windows in %.2fs", len(windows), time.perf_counter() - started)
        results = []
        for window_scores, summary, cut in zip(scores, summaries, truncated):
            flags = _flags(summary, Task.SUMMARY) + (("context_truncated",) if cut else ())
            if summary.tokens:
                text = clean_completion(summary.text, MAX_SUMMARY_CHARS)
            else:
                text, flags = "(no summary: the model returned nothing)", flags + ("summary_empty",)
            results.append(
                WindowAnalysis(
                    scores=tuple(float(s) for s in window_scores),  # type: ignore[arg-type]
                    summary=text,
                    model_id=self.model_id,
                    prompt_version=self.prompt_version,
                    flags=flags,
                )
            )
        return results

    def draft_replies(self, windows: Sequence[ChatWindow]) -> list[tuple[str | None, tuple[str, ...]]]:
        """An apology reply draft per window (None when the model produced nothing usable)."""
        with self._lock:
            prompts = [self.prompt_for(Task.REPLY, w)[0] for w in windows]
            replies = self._answers(Task.REPLY, prompts)
            self.stats.batches += 1
        drafts = []
        for reply in replies:
            if reply.tokens:
                drafts.append((clean_completion(reply.text, MAX_REPLY_CHARS), _flags(reply, Task.REPLY)))
            else:
                drafts.append((None, _flags(reply, Task.REPLY) + ("reply_empty",)))
        return drafts

    def get_stats(self) -> dict:
        return {"compiles": list(self.stats.compiles), "batches": self.stats.batches,
                "generate_calls": self.stats.generate_calls, "generated_tokens": self.stats.generated_tokens}


def _flags(generated: Generated, task: str) -> tuple[str, ...]:
    flags = ()
    if generated.retried:
        flags += (f"{task}_retried",)
    if generated.degenerate:
        flags += (f"{task}_degenerate",)
    return flags
