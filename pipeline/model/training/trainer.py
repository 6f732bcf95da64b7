"""Tuning a keras-hub Gemma on the corpus, with a jitted JAX step: LoRA (`LoraTrainer`, the default)
or the transformer blocks in full with the embedding frozen (`BlockTrainer`, more capacity).

keras-hub's `fit` goes through the causal-LM preprocessor, whose tf.data tracing fails with
the tokenizer rebuilt from GGUF; so sequences are tokenized in Python (`chat_format`) and
batches are plain arrays. Two things keep a step cheap on a CPU:
- the vocabulary projection (the tied 262,144-token embedding, most of the model's compute)
  runs only at the positions that carry loss, gathered flat across the batch before projecting
  (a batch's answers, about 90 tokens a chat, not rows x the widest answer);
- batches hold sequences of one length bucket, so padding is small and XLA compiles one
  program per (batch, length, answer width) shape.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import keras
import numpy as np

from pipeline.model.decoding.buckets import LENGTH_BUCKETS, bucket
from pipeline.model.decoding.state import stateless_scope
from pipeline.model.training import DEFAULT_LORA_TARGETS
from pipeline.model.training.adapters import load_adapter
from pipeline.model.training.format import TrainingSequence

log = logging.getLogger(__name__)

# Training shapes: a few length buckets, each with a fixed row count and a fixed answer budget,
# so a whole tune compiles one XLA program per bucket. Answers (label + summary + reply) are
# about 30% of a sequence's tokens and never pass about 220: the budget is per batch, and a
# batch whose answers would overflow it is closed early.
TRAIN_BUCKETS = (256, 320, 384, 512, 768, 1280)
ANSWER_SHARE = 0.3
MAX_ANSWER_TOKENS = 384
MAX_BATCH = 32


class Batch(NamedTuple):
    """Right-padded inputs plus every loss-carrying position of the batch, flattened.

    The vocabulary projection runs only at (rows, cols): a batch's answers, not rows x widest answer.
    """

    token_ids: np.ndarray  # (B, L) int32
    padding_mask: np.ndarray  # (B, L) bool
    rows: np.ndarray  # (N,) int32: which sequence each loss position is in
    cols: np.ndarray  # (N,) int32: where in it
    targets: np.ndarray  # (N,) int32: the token expected there
    weights: np.ndarray  # (N,) float32: 1 for real targets, 0 for padding
    label_cols: np.ndarray  # (B,) int32: each sequence's first loss position (its sentiment label)


def answer_budget(rows: int, length: int) -> int:
    """Loss positions a batch of `rows` x `length` tokens may carry (a fixed shape per bucket)."""
    return max(MAX_ANSWER_TOKENS, -(-int(rows * length * ANSWER_SHARE) // 128) * 128)


def answer_tokens(sequence: TrainingSequence) -> int:
    return sum(sequence.loss_mask)


def pack(sequences: Sequence[TrainingSequence], buckets: Sequence[int] = LENGTH_BUCKETS,
         rows: int | None = None, budget: int | None = None) -> Batch:
    """Right-padded arrays; `rows` and `budget` fix the batch size and answer width (fewer XLA programs)."""
    length = bucket(max(map(len, sequences)), buckets)
    batch = rows or len(sequences)
    where = [(i, j) for i, s in enumerate(sequences) for j, learnt in enumerate(s.loss_mask) if learnt]
    width = budget or len(where)
    if len(where) > width:
        raise ValueError(f"{len(where)} answer tokens exceed the batch's budget of {width}")
    token_ids = np.zeros((batch, length), "int32")
    mask = np.zeros((batch, length), bool)
    flat = np.zeros((3, width), "int32")
    weights = np.zeros(width, "float32")
    label_cols = np.zeros(batch, "int32")
    for i, s in enumerate(sequences):
        token_ids[i, : len(s)] = s.token_ids
        mask[i, : len(s)] = True
        label_cols[i] = s.loss_mask.index(True) if any(s.loss_mask) else 0
    for k, (i, j) in enumerate(where):
        flat[:, k] = (i, j, sequences[i].targets[j])
    weights[: len(where)] = 1.0
    return Batch(token_ids, mask, flat[0], flat[1], flat[2], weights, label_cols)


def length_batches(sequences: Sequence[TrainingSequence], batch_tokens: int, seed: int, max_batch: int = 16,
                   buckets: Sequence[int] = LENGTH_BUCKETS) -> list[list[int]]:
    """Indices grouped by length bucket, at most `batch_tokens` padded tokens and `answer_budget`
    answer tokens a batch, in shuffled order."""
    rng = random.Random(seed)
    by_bucket: dict[int, list[int]] = {}
    for i, s in enumerate(sequences):
        by_bucket.setdefault(bucket(len(s), buckets), []).append(i)
    batches = []
    for length, members in sorted(by_bucket.items()):
        rng.shuffle(members)
        size = max(1, min(max_batch, batch_tokens // length))
        budget, current, used = answer_budget(size, length), [], 0
        for i in members:
            n = answer_tokens(sequences[i])
            if current and (len(current) == size or used + n > budget):
                batches.append(current)
                current, used = [], 0
            current.append(i)
            used += n
        batches.append(current)
    rng.shuffle(batches)
    return batches


class Trainer:
    """A Gemma backbone with some weights trainable (`_make_trainable`), an AdamW optimizer and jitted
    train and loss steps. It needs the backbone alone (no tokenizer): sequences arrive as token ids."""

    KIND = ""  # names the trained arrays in a checkpoint

    def __init__(self, backbone, learning_rate: float, total_steps: int, seed: int, warmup_steps: int | None = None):
        keras.utils.set_random_seed(seed)
        self.backbone = backbone
        self._make_trainable(backbone)
        warmup = warmup_steps if warmup_steps is not None else max(1, total_steps // 20)
        schedule = keras.optimizers.schedules.CosineDecay(
            0.0, decay_steps=max(1, total_steps - warmup), warmup_target=learning_rate, warmup_steps=warmup)
        self.optimizer = keras.optimizers.AdamW(learning_rate=schedule, weight_decay=0.01, clipnorm=1.0)
        self.optimizer.build(self.backbone.trainable_variables)
        self.trainable = [v.value for v in self.backbone.trainable_variables]
        self.frozen = [v.value for v in self.backbone.non_trainable_variables]
        self.optimizer_state = [v.value for v in self.optimizer.variables]
        self._step = jax.jit(self._train_step)
        self._loss = jax.jit(self._batch_loss)

    def _make_trainable(self, backbone) -> None:
        raise NotImplementedError

    # ---- the model as a pure function -----------------------------------------------------------
    def _nll(self, trainable, frozen, batch: Batch):
        with stateless_scope(self.backbone, (trainable, frozen)):
            hidden = self.backbone({"token_ids": batch.token_ids, "padding_mask": batch.padding_mask})
            gathered = hidden[batch.rows, batch.cols]  # (N, hidden): the answer positions only
            logits = self.backbone.token_embedding(gathered[None], reverse=True)[0]
        logits = logits.astype("float32")
        # log p(target) = logit(target) - logsumexp(logits): no (N, vocab) log-probabilities kept.
        picked = jnp.take_along_axis(logits, batch.targets[:, None], axis=-1)[:, 0]
        nll = jax.nn.logsumexp(logits, axis=-1) - picked
        return (nll * batch.weights).sum(), batch.weights.sum()

    def _batch_loss(self, trainable, frozen, batch: Batch):
        total, count = self._nll(trainable, frozen, batch)
        return total / jnp.maximum(count, 1.0)

    def _train_step(self, trainable, frozen, optimizer_state, batch: Batch):
        loss, grads = jax.value_and_grad(self._batch_loss)(trainable, frozen, batch)
        trainable, optimizer_state = self.optimizer.stateless_apply(optimizer_state, grads, trainable)
        return loss, trainable, optimizer_state

    # ---- what the command calls -----------------------------------------------------------------
    def step(self, batch: Batch) -> float:
        loss, self.trainable, self.optimizer_state = self._step(self.trainable, self.frozen, self.optimizer_state,
                                                                _arrays(batch))
        return float(loss)

    def loss(self, batches: Iterator[Batch]) -> float:
        """Mean loss per answer token over `batches` (no update)."""
        total, count = 0.0, 0.0
        for batch in batches:
            mean = float(self._loss(self.trainable, self.frozen, _arrays(batch)))
            n = float(batch.weights.sum())
            total, count = total + mean * n, count + n
        return total / count if count else float("nan")

    def sync(self) -> None:
        """Write the trained values back into the Keras variables (before saving or decoding)."""
        for variable, value in zip(self.backbone.trainable_variables, self.trainable):
            variable.assign(value)

    def state(self) -> dict[str, np.ndarray]:
        arrays = {f"{self.KIND}/{i}": np.asarray(v) for i, v in enumerate(self.trainable)}
        arrays.update({f"optimizer/{i}": np.asarray(v) for i, v in enumerate(self.optimizer_state)})
        return arrays

    def restore(self, arrays: dict[str, np.ndarray]) -> None:
        self.trainable = [jnp.asarray(arrays[f"{self.KIND}/{i}"]) for i in range(len(self.trainable))]
        self.optimizer_state = [jnp.asarray(arrays[f"optimizer/{i}"]) for i in range(len(self.optimizer_state))]
        self.sync()


class LoraTrainer(Trainer):
    """LoRA of `rank` on the layers named `targets`; everything else frozen."""

    KIND = "lora"

    def __init__(self, backbone, rank: int, learning_rate: float, total_steps: int, seed: int,
                 warmup_steps: int | None = None, targets: Sequence[str] = DEFAULT_LORA_TARGETS):
        self.rank, self.targets = rank, tuple(targets)
        super().__init__(backbone, learning_rate, total_steps, seed, warmup_steps)

    def _make_trainable(self, backbone) -> None:
        backbone.enable_lora(self.rank, target_layer_names=list(self.targets))

    def start_from(self, adapter: str) -> None:
        """Begin at a saved adapter's LoRA weights (same rank) instead of a fresh LoRA; layers it
        lacks (targets this run adds) start fresh, changing nothing until trained."""
        load_adapter(self.backbone, adapter)
        self.trainable = [v.value for v in self.backbone.trainable_variables]


class BlockTrainer(Trainer):
    """Every weight of the transformer blocks and norms trained in full; the token embedding (the
    262,144-token vocabulary, also the output layer) frozen. About 100M weights against LoRA's few
    million: more capacity, and a whole model to save (`save_to_preset`), not an adapter."""

    KIND = "blocks"

    def _make_trainable(self, backbone) -> None:
        backbone.token_embedding.trainable = False


def _arrays(batch: Batch) -> Batch:
    return Batch(*(jnp.asarray(x) for x in batch))


def steps_per_epoch(sequences: Sequence[TrainingSequence], batch_tokens: int, seed: int,
                    buckets: Sequence[int] = TRAIN_BUCKETS) -> int:
    """How many batches `epoch_batches` yields, without packing them."""
    return len(length_batches(sequences, batch_tokens, seed, MAX_BATCH, buckets))


def epoch_batches(sequences: Sequence[TrainingSequence], batch_tokens: int, seed: int,
                  buckets: Sequence[int] = TRAIN_BUCKETS) -> Iterator[tuple[list[int], Batch]]:
    """One epoch of (indices, batch) in the order `seed` gives: the one batching tune and sweep share.
    Fewer `buckets` mean fewer XLA programs and more padding (what an accelerator prefers)."""
    for indices in length_batches(sequences, batch_tokens, seed, MAX_BATCH, buckets):
        length = bucket(len(sequences[indices[0]]), buckets)
        rows = max(1, min(MAX_BATCH, batch_tokens // length))
        yield indices, pack([sequences[i] for i in indices], buckets, rows, answer_budget(rows, length))

