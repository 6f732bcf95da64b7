"""One pass per chat for a Gemma tuned on `chat_format`: prefill once, then label, summary, reply.

A call's chats decode `decoding_rows` at a time, side by side (continuous batching: a chat that
is done leaves its row and a waiting one joins in its place, `loop_rows.py`). For the chats that join:
1. the prompts are prefilled once, in groups of similar lengths (`buckets.prefill_groups`: one
   long chat gets a prefill of its own rather than padding every row to its length, and shapes
   whose programs are compiled are preferred to loading another). Every
   prompt starts with the same preamble (BOS and the template's text before the chat, 63 of a
   typical prompt's ~190 tokens in format 2): its keys and values are computed once per model
   state and copied into each group's cache, which prefills only the rest of each prompt,
   right-padded, then moves each row to end where the group's width does (`step.right_aligned`:
   the cache a left-padded prefill of the whole prompts writes) and writes it into its row of the
   decoding loop's cache; the label probabilities are the
   three label tokens' logits at the prompt's end through the adapter's calibration
   (`pipeline/model/decoding/calibration.py`), and the label is their argmax; each row is fed its
   label token and the summary cue;
2. each row decodes its summary greedily, from its own position on;
3. a row whose reply is wanted (`reply_for`: always, or where its label came out negative)
   is fed the reply cue as soon as its summary ends and decodes the reply on the same cache;
   other rows stop there; a reply also stops once its text is surely past the cut staff see
   (`REPLY_CHARS`: `text.visible_characters`), the same draft in fewer steps.
Numbers in a summary or reply are the chat's own (`pipeline/model/decoding/grounding.py`: a mask on
each step's logits). A row advances one position per step until it is done, so its sequence has no
gaps and is exactly what it was trained on. The vocabulary projection runs only where a token is read: the
last prompt position and one position per decoding step; there, with an answer vocabulary in the
adapter's manifest, on the rows of the tokens the model may write (`answer_vocabulary.py`)."""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from chatlens.contracts import MAX_REPLY_CHARS, MAX_SUMMARY_CHARS, ChatWindow
from pipeline.model.decoding import grounding
from pipeline.model.decoding.buckets import (
    BATCH_BUCKETS,
    LENGTH_BUCKETS,
    PREFILL_OVERHEAD_TOKENS,
    RELOAD_TOKENS,
    bucket,
    padded_rows,
    prefill_groups,
)
from pipeline.model.decoding.answer_vocabulary import AnswerVocabulary
from pipeline.model.decoding.calibration import LabelCalibration
from pipeline.model.decoding.loop_rows import DONE, REPLY, REPLY_CUE, SUMMARY, LoopRows
from pipeline.model.decoding.extractive import extractive_summary
from pipeline.model.decoding.macros import choose, written
from pipeline.model.decoding.offer import AGENT_ANSWERED, DRAFT_WITHHELD, SUMMARY_UNSURE
from pipeline.model.decoding.programs import Programs
from pipeline.model.decoding.state import detokenize, model_state, stateless_scope, token_ids
from pipeline.model.decoding.step import (
    empty_cache,
    empty_decoding_cache,
    forward_cached,
    forward_one,
    project,
    right_aligned,
    ring_layer_cache,
    shift_positions,
    stacked,
    step_weights,
    take_rows,
    to_head_major,
    unstacked,
    vocabulary_logits,
    vocabulary_table,
)
from pipeline.model.decoding.text import PAST_CUT_MARGIN, clean_completion, visible_characters
from pipeline.model.environment import release_freed_memory
from pipeline.model.loading.reply_library import ReplyLibraryFile
from pipeline.model.training.adapters import AdapterServing
from pipeline.model.training.format import (
    MAX_PROMPT_TOKENS,
    REPLY_CHARS,
    REPLY_TOKENS,
    SUMMARY_CHARS,
    SUMMARY_TOKENS,
    Vocabulary,
)
from pipeline.model.types import WindowAnalysis, reply_policies, sentiment_of, wants_reply

log = logging.getLogger(__name__)

LOOP_COMPILER_OPTIONS = {"xla_cpu_copy_insertion_use_region_analysis": True}
"""XLA (CPU) otherwise copies every layer's cache twice a step: it cannot tell that the decoding
loop's read of the cache is done before the in-place write of the new key and value. With region
analysis it can (8 rows, ~700 positions: 105 -> 80 ms a step, the same tokens)."""

ONE_PASS_PROGRAMS = 8
"""Compiled programs a one-pass decoder holds: a batch needs its prefills (1-3 groups) and one
decoding loop. 32 eval chats, 8 a call, second pass, on a 2-core AMX Xeon, with the prefill's layers
under one scan (`step.forward_cached`): 4 held 55.7 s, 1,488 MiB after the pass and 2,001 at peak;
8 held 34.3 s, 1,664 and 2,067; all 9 met 35.1 s, 1,696 and 2,119 (before the scan, 4 held took
55-63 s at 1,626 and 2,245). A worker settles its prefill groups on the shapes it holds
(`buckets.prefill_groups`, `Program.holds`) and runs one loop program per batch bucket (`decoding_width`)."""

LOOP_CHATS = BATCH_BUCKETS[-1]
"""Chats one decoding loop serves at most, joining as others finish (a call's next ones get a loop
of their own): the loop's position grows by each chat's tokens, and a bound keeps it well inside
Gemma 3's trained context (at most 64 x 339 steps past the 1,028 of the widest prompt)."""

DECODING_ROWS = 8
"""Chats a call decodes side by side (a batch bucket); more wait and join as rows finish. On this
2-core Xeon (32 eval chats): see the README's speed section."""

PREFILL_ROWS = 4
"""Prompts one prefill takes at most while chats join a decoding loop: a prefill's working memory
grows with its rows (8 of 384 tokens of Gemma 3 270M: 119 MiB beside the loop's cache), its time
a token does not."""

NO_MACRO = "no_macro"  # the flag of a chat whose language has no macro that fits: no draft
FROM_LIBRARY = "reply_from_library"  # the flag of a draft that is a library macro


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
    summary_confidence: float | None = None  # the geometric mean probability of its tokens (`token_confidence`)
    reply_confidence: float | None = None


def token_confidence(log_probabilities: Sequence[float]) -> float | None:
    """How sure the model was of a text it wrote: the geometric mean of its tokens' probabilities
    (exp of their mean log-probability), in (0, 1]; None for no tokens. A model that hesitates
    between wordings, or guesses at a fact the chat does not settle, has lower probabilities on
    those tokens."""
    return float(np.exp(np.mean(log_probabilities))) if len(log_probabilities) else None


class OnePassDecoder:
    """Label probabilities, summary and reply from one prefill per chat, batched."""

    def __init__(self, causal_lm, *, max_prompt_tokens: int = MAX_PROMPT_TOKENS,
                 summary_tokens: int = SUMMARY_TOKENS, reply_tokens: int = REPLY_TOKENS,
                 calibration: LabelCalibration = LabelCalibration(), step_dtype: str = "bfloat16",
                 ground_numbers: bool = True, prompt_format: int = 1, max_programs: int = ONE_PASS_PROGRAMS,
                 answer_vocabulary: AnswerVocabulary | None = None, decoding_rows: int = DECODING_ROWS):
        self.lm = causal_lm
        self.backbone = causal_lm.backbone
        tokenizer = causal_lm.preprocessor.tokenizer
        self.tokenizer = tokenizer
        self.vocabulary = Vocabulary.of(self._tokenize, tokenizer.start_token_id, tokenizer.end_token_id, prompt_format)
        self.max_prompt_tokens = max_prompt_tokens
        self.decoding_rows = bucket(decoding_rows, BATCH_BUCKETS)
        self.summary_tokens = summary_tokens
        self.reply_tokens = reply_tokens
        self.calibration = calibration
        # Numbers in a summary or reply only from the chat (pipeline/model/decoding/grounding.py).
        self.ground_numbers = ground_numbers
        pieces = tokenizer.get_vocabulary()
        self._token_codes = grounding.token_codes(pieces) if ground_numbers else None
        self._visible = visible_characters(pieces)
        # The tokens a row may write (`answer_vocabulary.py`; None: all), and those it always may.
        self.answer_vocabulary = answer_vocabulary
        v = self.vocabulary
        self._always = {v.summary_end, v.eos, *v.reply_cue, *v.summary_cue, *v.labels} | (
            set(grounding.symbol_ids(self._token_codes).tolist()) - {-1} if ground_numbers else set())
        self.prefill_overhead = PREFILL_OVERHEAD_TOKENS  # see buckets.prefill_groups
        self.reload_cost = RELOAD_TOKENS  # a prefill shape not compiled, in tokens (see the same)
        self.compiles: list[str] = []
        self._lock = threading.Lock()
        self.programs = Programs(max_programs)  # the compiled programs held (`programs.py`)
        self.preamble = self.vocabulary.preamble()  # its keys and values computed once per model state
        self._preamble_cache, self._prefill, self._decode_loop = self._build()
        self._preamble: tuple = ((), None)  # (the state they came from, its preamble's cache)
        self.step_dtype = step_dtype
        self._prepared: tuple = ((), None)  # (the state they came from, its step weights)

    @property
    def decoding_steps(self) -> int:
        """The decoding loop's bound: the summary, its stop, the reply cue and the reply, with room to
        finish a number open at each length limit. The same whether or not a row may reply (the loop
        ends when every row is done): one loop program, not two."""
        steps = self.summary_tokens + 1 + len(self.vocabulary.reply_cue) + self.reply_tokens
        return steps + (2 * grounding.MAX_CHARACTERS if self.ground_numbers else 0)

    @property
    def decoding_width(self) -> int:
        """The positions a row's prompt may take in the decoding loop's cache, whatever the batch's
        prompts: the longest prompt's length bucket, its label and the summary cue (a row's tokens
        take `decoding_steps` more). One loop program per batch bucket, not one per length bucket
        too (each ~80 MiB held for Gemma 3 270M)."""
        return bucket(self.max_prompt_tokens, LENGTH_BUCKETS) + self.head

    @property
    def head(self) -> int:
        """The positions after a prompt before its first decoded token: its label and the summary cue."""
        return 1 + len(self.vocabulary.summary_cue)

    @property
    def loop_width(self) -> int:
        """The positions a row of the decoding loop takes at most: its prompt and its tokens (the
        global layers' ring, `step.slot_positions`)."""
        return self.decoding_width + self.decoding_steps

    def _tokenize(self, text: str) -> list[int]:
        return token_ids(self.tokenizer, text)

    def _decode(self, ids: Sequence[int]) -> str:
        return detokenize(self.tokenizer, ids)

    def _state(self):
        return model_state(self.lm)

    def _scope(self, state):
        return stateless_scope(self.lm, state)

    def _in_scope(self, state, function, *args):
        with self._scope(state):
            return function(*args)

    def _once_per_state(self, held: str, state, make):
        """`make()`, kept in attribute `held` as (the state's arrays, its result) and made again only
        for another state: the shipped model's never changes; a tune's changes after each step."""
        arrays = [*state[0], *state[1]]
        before, made = getattr(self, held)
        if len(before) != len(arrays) or any(a is not b for a, b in zip(before, arrays)):
            made = make()
            setattr(self, held, (arrays, made))
        return made

    def _weights(self, state):
        """The decoding step's weights (`step.step_weights`) for this state; made eagerly, not jitted:
        kernels already in the step's dtype are the state's own arrays."""
        return self._once_per_state("_prepared", state,
                                    lambda: self._in_scope(state, step_weights, self.backbone, self.step_dtype))

    def _preamble_for(self, state, rows: Sequence[Sequence[int]]):
        """The cached preamble for these prompts and where their rest starts: the preamble's keys
        and values (`preamble_cache`) where every prompt starts with it and goes on past it; else
        none (P = 0), the prompts whole."""
        size = len(self.preamble)
        if not all(len(row) > size and tuple(row[:size]) == self.preamble for row in rows):
            return stacked(empty_cache(self.backbone, 1, 0, self.lm.compute_dtype)), 0
        self._note(f"one-pass preamble length={size}")
        return self._once_per_state("_preamble", state, lambda: self._preamble_cache(
            state, jnp.array([self.preamble], "int32"))), size

    def _logits(self, hidden):
        """The vocabulary's logits, float32. keras-hub's own projection in a float32 model; in a
        lower-precision one (served in the step's dtype) accumulated in float32 as the step does,
        not rounded to the model's dtype (bfloat16 logits would move the labels' probabilities)."""
        embedding = self.backbone.token_embedding
        if self.lm.compute_dtype == "float32":
            return embedding(hidden, reverse=True).astype("float32")
        return vocabulary_logits(embedding, project(hidden, vocabulary_table(embedding)))

    def _build(self):
        """The two XLA programs: a prefill per group of similar prompt lengths, and the decoding
        loop over the whole batch."""
        v = self.vocabulary
        backbone = self.backbone
        labels = jnp.array(v.labels, "int32")
        cue = jnp.array(v.summary_cue, "int32")
        reply_cue = jnp.array(v.reply_cue, "int32")
        summary_stops = jnp.array([v.summary_end, v.eos], "int32")
        reply_stops = jnp.array([v.eos, v.summary_end], "int32")
        max_summary, max_reply = self.summary_tokens, self.reply_tokens
        visible, reply_past_cut = jnp.asarray(self._visible), REPLY_CHARS + PAST_CUT_MARGIN

        @self.programs.jit
        def preamble_cache(state, preamble_ids):
            """The keys and values of the preamble every prompt starts with (1, P), as a stacked cache."""
            cache = stacked(empty_cache(backbone, 1, preamble_ids.shape[1], self.lm.compute_dtype))
            with self._scope(state):
                return forward_cached(backbone, preamble_ids, cache, 0, jnp.ones(preamble_ids.shape, bool))[1]

        @functools.partial(self.programs.jit, static_argnames=("label_only",), donate_argnames=("cache",))
        def prefill(state, preamble, rest_ids, rest_mask, label_bias, cache, rows, position, label_only):
            """The label logits and the first summary token's logits of one group of prompts: its
            prompts' shared preamble as cached (`preamble_cache`, P positions, none where P is 0), then
            each prompt's rest, right-padded (`rest_mask`). Each row's keys and values, moved to end
            where the group's width does (as if left-padded) and then at `position` (the loop's, where
            the group joins it: keys rotated on), are written into row `rows[i]` of the decoding loop's
            `cache` (donated, returned; a row past it, a padding row, writes nothing). `label_only`:
            the label logits alone (no cache)."""
            batch, rest = rest_ids.shape
            start = preamble[0].shape[2]
            length = start + rest
            loop_cache, cache = cache, tuple(part.at[:, :, :start].set(known) for part, known in zip(
                stacked(empty_cache(backbone, batch, length + 1 + cue.shape[0], self.lm.compute_dtype)), preamble))
            head_mask = jnp.ones((batch, 1 + cue.shape[0]), bool)
            mask = jnp.concatenate([jnp.ones((batch, start), bool), rest_mask, head_mask], axis=1)
            ends = jnp.sum(rest_mask, axis=1)
            with self._scope(state):
                hidden, cache = forward_cached(backbone, rest_ids, cache, start, mask)
                last = jnp.take_along_axis(hidden, (ends - 1)[:, None, None], axis=1)
                label_logits = self._logits(last)[:, 0, :][:, labels]
                if label_only:
                    return label_logits, None, None
                chosen = labels[jnp.argmax(label_logits + label_bias, axis=-1)]
                head = jnp.concatenate([chosen[:, None], jnp.broadcast_to(cue, (batch, cue.shape[0]))], axis=1)
            padding = rest - ends
            cache = right_aligned(backbone, cache, padding, length)
            mask = jnp.concatenate([jnp.arange(length)[None, :] >= padding[:, None], head_mask], axis=1)

            def feed_head(cache):
                with self._scope(state):
                    hidden, cache = forward_cached(backbone, head, cache, length, mask)
                    return self._logits(hidden[:, -1:, :])[:, 0, :], cache

            # The label and cue run through the layers as a computation of their own: the branch of a
            # conditional always taken (the head's own positions are in `mask`). XLA's CPU backend
            # widens bfloat16 kernels to float32 for its products, and in one computation it shared
            # each widened kernel between the prompt's run and this one, holding all 18 layers'
            # (~390 MiB for Gemma 3 270M) through the prefill. Apart, each run widens and frees them
            # layer by layer: the same values, a prefill's working memory 385 -> 6 MiB (one chat of
            # 128 tokens) and 414 -> 52 MiB (8 of 256), in the same time (measured here).
            logits, cache = jax.lax.cond(jnp.any(mask), feed_head,
                                         lambda cache: (jnp.zeros((batch, backbone.vocabulary_size), "float32"), cache),
                                         cache)
            cache = to_head_major(unstacked(shift_positions(backbone, cache, position - cache[0].shape[2])))
            return label_logits, logits, self._joined(loop_cache, rows, cache, position)

        ground = self.ground_numbers
        codes = jnp.asarray(self._token_codes) if ground else None
        symbols = jnp.asarray(grounding.symbol_ids(self._token_codes)) if ground else None

        @functools.partial(self.programs.jit, static_argnames=("steps",), donate_argnames=("cache",),
                           compiler_options=LOOP_COMPILER_OPTIONS)
        def decode(state, weights, cache, logits, carried, first, position, wants_reply, numbers, candidates, refill,
                   steps):
            """Greedy summary then reply tokens for each row (`loop_rows.LoopRows`), every row written
            at `position` on (each reading its own positions, from `first[row]` on), each token's phase
            and its log-probability under the model (before the number mask: what the model itself
            believed), `steps` at most a row; with `ground_numbers`, writing only the numbers in
            `numbers` (`grounding.number_table`). Runs until every row is done, or `refill` rows are
            (chats waiting to join them). Returns the rows' state (`carried`), their next logits, the
            cache and the position reached. The cache is donated and carried in its own buffers, not
            a copy (8 rows of 384 positions of Gemma 3 270M: 138 -> 62 MiB of working memory).
            `candidates`: the token ids the rows may write, sorted, and which of them are real
            (`answer_vocabulary.py`); the step projects on their rows of the vocabulary alone
            (`logits` are theirs)."""
            rows = jnp.arange(first.shape[0])
            ids, real = candidates
            if ids.shape[0] < weights["vocabulary"].shape[0]:  # else every token, in order: nothing to pick
                weights = dict(weights, vocabulary=take_rows(weights["vocabulary"], ids))
            some_codes = codes[ids] if ground else None
            some_symbols = jnp.where(symbols >= 0, jnp.searchsorted(ids, symbols), -1) if ground else None

            def step(loop):
                cache, logits, carried, position = loop
                phase, count, shown, cue_at, written, number = (
                    carried[name] for name in ("phase", "count", "shown", "cue_at", "written", "number"))
                logits = jnp.where(real, logits, -jnp.inf)
                log_probabilities = jax.nn.log_softmax(logits, axis=-1)
                may_stop = True
                if ground:
                    logits = number.mask(logits, numbers, some_codes, some_symbols)
                    may_stop = number.may_end(numbers)  # at the length limit, an open number is finished first
                greedy = ids[jnp.argmax(logits, axis=-1)]
                token = jnp.select(
                    [phase == REPLY_CUE, (phase == SUMMARY) & (count >= max_summary) & may_stop,
                     (phase == REPLY) & ((count >= max_reply) & may_stop | (shown >= reply_past_cut))],
                    [reply_cue[jnp.minimum(cue_at, reply_cue.shape[0] - 1)], v.summary_end, v.eos], greedy)
                at = jnp.where(phase != DONE, written, steps)  # a row that is done writes nothing
                at_column = jnp.searchsorted(ids, token)[:, None]  # the token's column: its id where every token is one
                believed = jnp.take_along_axis(log_probabilities, at_column, axis=1)[:, 0]
                if ground:
                    number = number.advance(token, numbers, codes)
                after_summary = jnp.where(wants_reply & (token == v.summary_end), REPLY_CUE, DONE)
                next_phase = jnp.select(
                    [phase == SUMMARY, phase == REPLY_CUE, phase == REPLY],
                    [jnp.where(jnp.isin(token, summary_stops), after_summary, SUMMARY),
                     jnp.where(cue_at + 1 >= reply_cue.shape[0], REPLY, REPLY_CUE),
                     jnp.where(jnp.isin(token, reply_stops), DONE, REPLY)], DONE)
                next_phase = jnp.where(written + 1 >= steps, DONE, next_phase)  # a row's bound
                with self._scope(state):
                    logits, cache = forward_one(backbone, weights, token[:, None], cache, position, first)
                carried = dict(
                    carried, phase=next_phase, number=number,
                    count=jnp.where(next_phase != phase, 0, count + 1),
                    shown=jnp.where(next_phase != phase, 0, shown + visible[token]),  # the text's characters
                    cue_at=jnp.where(phase == REPLY_CUE, cue_at + 1, 0),
                    written=written + (phase != DONE),
                    tokens=carried["tokens"].at[rows, at].set(token, mode="drop"),
                    phases=carried["phases"].at[rows, at].set(phase, mode="drop"),
                    believed=carried["believed"].at[rows, at].set(believed, mode="drop"))
                return cache, logits, carried, position + 1

            def running(loop):
                done = loop[2]["phase"] == DONE
                return ~jnp.all(done) & (jnp.sum(done) < refill)

            cache, logits, carried, position = jax.lax.while_loop(running, step, (cache, logits, carried, position))
            return carried, logits, cache, position

        return preamble_cache, prefill, decode

    def run(self, windows: Sequence[ChatWindow], reply_for: Sequence[str] | None = None,
            label_only: bool = False) -> list[ChatOutput]:
        """One pass per chat; `reply_for[i]` says when chat i gets a reply: 'negative' (when its
        label comes out negative), 'all' or 'none' (the default). `label_only` stops after the
        label (no summary, no reply): what classifying and fitting a calibration need."""
        wants = reply_policies(reply_for if reply_for is not None else "none", len(windows))
        prompts, cut = zip(*(self.vocabulary.prompt(w, self.max_prompt_tokens) for w in windows)) if windows else ((), ())
        outputs: list[dict] = []
        with self._lock:
            for start in range(0, len(windows), LOOP_CHATS):
                rows = slice(start, start + LOOP_CHATS)
                outputs += self._labels(prompts[rows]) if label_only else self._run_batch(prompts[rows], wants[rows])
                release_freed_memory()  # the loop's working memory, not kept until the next one
        return [ChatOutput(truncated=c, **out) for c, out in zip(cut, outputs)]

    def _run_batch(self, prompts: Sequence[list[int]], wants: Sequence[str]) -> list[dict]:
        """Every chat through `decoding_rows` rows side by side (`loop_rows.py`): the shortest
        prompts join first, the rest as rows finish (prompts of similar lengths join together, fewer
        padded tokens), each group prefilled into its rows (`_join`); the loop runs until its rows
        are done or half of them are free while chats wait."""
        state = self._state()
        steps = self.decoding_steps
        size = min(bucket(len(prompts), BATCH_BUCKETS), self.decoding_rows)
        texts = [self._decode(prompt) for prompt in prompts]
        candidates = self._candidates(prompts, texts)
        numbers = grounding.number_table(texts) if self.ground_numbers else None
        waiting = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        # the first chats' prompts end where the longest's does (its length bucket, label and summary cue)
        start = bucket(len(prompts[waiting[:size][-1]]), LENGTH_BUCKETS) + self.head
        rows = LoopRows.empty(size, steps, self.ground_numbers, position=start)
        cache = empty_decoding_cache(self.backbone, size, self.loop_width, self.lm.compute_dtype)
        logits = jnp.zeros((size, candidates[0].shape[0]), "float32")
        results: list[dict] = [{} for _ in prompts]
        weights = self._weights(state)
        self._note(f"one-pass decode batch={size} width={self.decoding_width} steps={steps}")
        while True:
            free = rows.free()
            joining, waiting = waiting[: len(free)], waiting[len(free):]
            if joining:
                cache, logits = self._join(state, [prompts[i] for i in joining], joining, free, rows, cache, logits,
                                           candidates[0], wants, numbers, results)
            if not rows.busy():
                return results
            refill = min(len(waiting), max(1, size // 2)) if waiting else size + 1
            carried, logits, cache, position = self._decode_loop(
                state, weights, cache, logits, rows.carried, rows.first, np.int32(rows.position), rows.wants_reply,
                rows.numbers, candidates, np.int32(refill), steps=steps)
            rows.carried, rows.position = jax.tree.map(np.asarray, carried), int(position)
            for row, chat in rows.finished():
                results[chat].update(self._outputs(*rows.written(row)))

    def _join(self, state, prompts, chats, free, rows: LoopRows, cache, logits, candidate_ids, wants, numbers,
              results) -> tuple:
        """Chats `chats` (their `prompts`) join the loop in rows `free`: prefilled in groups of
        similar lengths (`prefill_groups`) into those rows of the loop's cache, their label
        probabilities in `results`, their first logits in `logits`. Returns the cache and logits."""
        bias = np.asarray(self.calibration.bias, "float32")
        places = iter(free)
        for group in self._groups(state, prompts, bias, cache, max_batch=PREFILL_ROWS):
            preamble, ids, mask = self._group_inputs(state, [prompts[i] for i in group], label_only=False)
            targets = np.full(ids.shape[0], rows.chat.shape[0], "int32")  # padding rows: past the cache
            targets[: len(group)] = [next(places) for _ in group]
            label_logits, first, cache = self._prefill(state, preamble, ids, mask, bias, cache, targets,
                                                       np.int32(rows.position), label_only=False)
            label_logits = np.asarray(label_logits)[: len(group)]
            first = first[: len(group)]
            if candidate_ids.shape[0] < first.shape[1]:
                first = first[:, candidate_ids]
            logits = logits.at[targets[: len(group)]].set(first)
            negative = np.argmax(label_logits + bias, axis=-1) == 0  # the label fed in the prefill
            for i, row, raw, probabilities, is_negative in zip(
                    group, targets, label_logits, self.calibration.probabilities(label_logits), negative):
                chat = chats[i]
                results[chat] = self._label_result(probabilities, raw)
                rows.join(row, chat, rows.position - self.head - len(prompts[i]),
                          wants[chat] == "all" or (wants[chat] == "negative" and bool(is_negative)),
                          None if numbers is None else numbers[chat])
        release_freed_memory()  # the prefills' working memory
        return cache, logits

    def _labels(self, prompts: Sequence[list[int]]) -> list[dict]:
        """Label probabilities alone, prefilled in groups of similar lengths (`prefill_groups`)."""
        bias = np.asarray(self.calibration.bias, "float32")
        state = self._state()
        results: list[dict] = [{} for _ in prompts]
        for group in self._groups(state, prompts, bias):
            preamble, ids, mask = self._group_inputs(state, [prompts[i] for i in group], label_only=True)
            label_logits = np.asarray(self._prefill(state, preamble, ids, mask, bias, None, None, None,
                                                    label_only=True)[0])
            for i, raw, probabilities in zip(group, label_logits, self.calibration.probabilities(label_logits)):
                results[i] = self._label_result(probabilities, raw)
        return results

    def _groups(self, state, prompts, bias, cache=None, max_batch: int = BATCH_BUCKETS[-1]) -> list[list[int]]:
        """`prefill_groups` of these prompts, preferring shapes whose prefill is compiled (with the
        prompts' preamble; writing into a decoding loop's `cache`, or the labels alone without one)."""
        preamble, start = self._preamble_for(state, prompts)

        def held(batch: int, width: int) -> bool:
            rest = jax.ShapeDtypeStruct((batch, width - start), "int32")
            loop = (None,) * 3 if cache is None else (cache, jax.ShapeDtypeStruct((batch,), "int32"), np.int32(0))
            return self._prefill.holds(state, preamble, rest, jax.ShapeDtypeStruct(rest.shape, bool), bias, *loop,
                                       label_only=cache is None)

        return prefill_groups([len(p) for p in prompts], self.prefill_overhead, held, self.reload_cost,
                              max_batch=max_batch)

    def _group_inputs(self, state, prompts, label_only: bool) -> tuple:
        """A prefill group's preamble as cached (`_preamble_for`) and its prompts' rests right-padded to
        its length bucket (ids, mask)."""
        preamble, start = self._preamble_for(state, prompts)
        width = bucket(max(map(len, prompts)), LENGTH_BUCKETS)  # the group's prompts end here
        ids, mask = padded_rows([row[start:] for row in prompts], length=width - start)
        self._note(f"one-pass prefill batch={ids.shape[0]} length={width}{' label' if label_only else ''}"
                   f"{' whole' if not start else ''}")
        return preamble, ids, mask

    @staticmethod
    def _label_result(probabilities, label_logits) -> dict:
        return {"probabilities": tuple(float(x) for x in probabilities),
                "label_logits": tuple(float(x) for x in label_logits),
                "summary": "", "reply": None, "summary_tokens": 0, "reply_tokens": 0}

    def _outputs(self, tokens, phases, believed) -> dict:
        """A finished row's summary and reply (None where it was not cued), their token counts and
        confidences."""
        summary = [t for t, p in zip(tokens, phases) if p == SUMMARY]
        reply = [t for t, p in zip(tokens, phases) if p == REPLY]
        has_reply = any(p == REPLY_CUE for p in phases)
        return {"summary": self._finish(summary, "summary"),
                "reply": self._finish(reply, "reply") if has_reply else None,
                "summary_tokens": len(self._content(summary)), "reply_tokens": len(self._content(reply)),
                "summary_confidence": self._confidence(tokens, phases, believed, SUMMARY),
                "reply_confidence": self._confidence(tokens, phases, believed, REPLY) if has_reply else None}

    def _candidates(self, prompts: Sequence[Sequence[int]], texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """The token ids this call's chats may write, sorted, and which of them are real
        (`answer_vocabulary.py`): every token without an answer vocabulary, or where the call's
        would not fit its sizes."""
        if self.answer_vocabulary is not None:
            found = self.answer_vocabulary.candidates(self._tokenize, prompts, texts, self._always,
                                                      self.backbone.vocabulary_size)
            if found is not None:
                return found
        size = self.backbone.vocabulary_size
        return np.arange(size, dtype="int32"), np.ones(size, bool)

    def _confidence(self, tokens, phases, believed, phase: int) -> float | None:
        """`token_confidence` over one output's own words (its stop tokens left out)."""
        stops = (self.vocabulary.summary_end, self.vocabulary.eos)
        return token_confidence([b for t, p, b in zip(tokens, phases, believed) if p == phase and t not in stops])

    def _joined(self, cache, rows, group, position):
        """The decoding loop's cache with a prefilled group's head-major caches (`group`, its rows'
        positions up to `position`) written into its rows `rows` as the loop's rings lay them out
        (`step.ring_layer_cache`; a row past the cache writes nothing); inside the prefill's program."""
        joined = []
        for layer, (k, v), (group_k, group_v) in zip(self.backbone.transformer_layers, cache, group):
            group_k, group_v = ring_layer_cache(layer, group_k, group_v, self.loop_width, position)
            joined.append((k.at[rows].set(group_k, mode="drop"), v.at[rows].set(group_v, mode="drop")))
        return tuple(joined)

    def _note(self, key: str) -> None:
        if key not in self.compiles:
            self.compiles.append(key)
            log.info("XLA compile #%d: %s", len(self.compiles), key)

    def _content(self, tokens: Sequence[int]) -> list[int]:
        return [t for t in tokens if t not in (self.vocabulary.summary_end, self.vocabulary.eos)]

    def _finish(self, tokens: Sequence[int], kind: str) -> str:
        """Generated tokens as staff see them: stops dropped, one clean paragraph ending at the last
        whole sentence within `SUMMARY_CHARS` or `REPLY_CHARS` (pipeline/model/training/format.py)."""
        limits = {"summary": (MAX_SUMMARY_CHARS, SUMMARY_CHARS), "reply": (MAX_REPLY_CHARS, REPLY_CHARS)}[kind]
        return clean_completion(self._decode(self._content(tokens)), *limits)


class OnePassEngine:
    """The engine interface (`analyze`, `classify`) of a model tuned by ChatLens: one pass per chat.

    What the Beam handler shares per machine when the model spec resolves to a tuned model
    (the default `gemma3-270m`); untuned models get the prompted `GemmaEngine`.
    """

    def __init__(self, causal_lm, model_id: str, max_prompt_tokens: int = MAX_PROMPT_TOKENS,
                 serving: AdapterServing = AdapterServing(), reply_library: ReplyLibraryFile | None = None):
        """`serving`: the adapter's calibration, offer policy, prompt format and styles (its manifest);
        `reply_library`: the team's macros for the "macro" reply styles (default: the shipped ones)."""
        self.decoder = OnePassDecoder(causal_lm, max_prompt_tokens=max_prompt_tokens, calibration=serving.calibration,
                                      prompt_format=serving.prompt_format,
                                      answer_vocabulary=serving.answer_vocabulary)
        self.serving = serving
        self.reply_library = reply_library or ReplyLibraryFile()
        self.prompt_version = f"tuned-one-pass-v{serving.prompt_format}" + "".join(
            f"+{style}" for style in (serving.summary_style, serving.reply_style) if style != "model")
        self.model_id = model_id
        self.batches = 0
        self.generated_tokens = 0

    def analyze(self, windows: Sequence[ChatWindow], reply_for: str | Sequence[str] = "none") -> list[WindowAnalysis]:
        """Sentiment, summary and (where `reply_for`, one policy or one per window, selects it) a
        reply draft, from one pass each, served in the adapter's styles. A reply below the offer
        policy's confidence (the model's in its words, or the picker's in its macro) is withheld
        (flag `draft_withheld`, its confidence kept) and a
        summary below it flagged (`summary_unsure`); a chat the policy gives no draft (an agent has
        answered) has none decoded (flag `agent_answered` where it would have had one)."""
        serving = self.serving
        wanted = reply_policies(reply_for, len(windows))
        may_draft = [serving.offer_policy.drafts_for(window) for window in windows]
        outputs = self.decoder.run(windows, [p if may else "none" for p, may in zip(wanted, may_draft)])
        self.batches += 1
        self.generated_tokens += sum(o.summary_tokens + o.reply_tokens for o in outputs)
        library = self.reply_library.current()
        results = []
        for window, out, policy, may in zip(windows, outputs, wanted, may_draft):
            flags = ("context_truncated",) if out.truncated else ()
            if not may and wants_reply(policy, sentiment_of(out.probabilities)):
                flags += (AGENT_ANSWERED,)
            summary = out.summary
            if serving.summary_style == "extractive":  # the decoded summary picks the quotes, never writes them
                summary = extractive_summary(window, sentiment_of(out.probabilities), guide=out.summary or None)
            if not summary:
                summary, flags = "(no summary: the model returned nothing)", flags + ("summary_empty",)
            if out.reply == "":
                flags += ("reply_empty",)
            reply, reply_confidence = out.reply or None, out.reply_confidence
            if out.reply is not None and serving.reply_style != "model":  # the decoded reply picks, never writes
                choice = choose(window, library, out.reply)
                reply = choice and written(window, library, choice.macro, out.reply,
                                           own_opening=serving.reply_style == "macro+opening")
                flags += (FROM_LIBRARY,) if reply else (NO_MACRO,)
                reply_confidence = choice.confidence if choice else None  # the pick's, not the words'
            if reply and not serving.offer_policy.offers_reply(reply_confidence):
                reply, flags = None, flags + (DRAFT_WITHHELD,)
            if not serving.offer_policy.trusts_summary(out.summary_confidence):
                flags += (SUMMARY_UNSURE,)
            results.append(WindowAnalysis(scores=out.probabilities, summary=summary, model_id=self.model_id,
                                          prompt_version=self.prompt_version, flags=flags, reply_draft=reply,
                                          summary_confidence=out.summary_confidence,
                                          reply_confidence=reply_confidence))
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
