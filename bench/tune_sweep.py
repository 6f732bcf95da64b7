"""Tuning sweep on dev (LoRA, or the blocks in full), for a machine with an accelerator but no tokenizer stack.

Two halves, so the GPU side needs only JAX, Keras, keras-hub and gguf (no TensorFlow):
  here:  python bench/tune_sweep.py export --out seqs.npz       (tokenized train and dev, loss masks)
  there: python bench/tune_sweep.py sweep --gguf model.gguf --sequences seqs.npz --out DIR
The sweep tunes each (rank, learning rate) for `--epochs` epochs and records, per epoch, the
train loss, the dev loss and the dev sentiment macro-F1 read from the label token. It saves,
per config, the adapter of its best epoch by dev loss and prints one JSON line with every figure.
A config `blocks:LR` trains the transformer blocks in full instead (`chatlens tune --train blocks`),
the embedding frozen: its figures compare with the adapters', its 400 MB of weights are not saved.
`chatlens tune --rank R --learning-rate LR --epochs E [--lora-targets NAMES]` then reproduces the
chosen run on any machine (same seed, same batches: batch order depends on --batch-tokens, keep it equal).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pipeline.model.environment import use_default_env  # noqa: E402

use_default_env()


def export(args: argparse.Namespace) -> None:
    import numpy as np

    from chatlens.config import get_settings
    from pipeline.corpus import load_split
    from pipeline.model.training.format import LATEST_FORMAT, Vocabulary, training_sequence
    from pipeline.model.loading.sources import load_causal_lm

    lm, _ = load_causal_lm("gemma3-270m-base", cache_dir=get_settings().cache)
    tokenizer = lm.preprocessor.tokenizer
    tokenize = lambda text: tokenizer.tokenize(text).tolist()  # noqa: E731
    vocabulary = Vocabulary.of(tokenize, tokenizer.start_token_id, tokenizer.end_token_id, LATEST_FORMAT)
    arrays = {"labels": np.array(vocabulary.labels), "prompt_format": np.array(LATEST_FORMAT)}
    for split in ("train", "dev"):
        examples = load_split(split)
        seqs = [training_sequence(vocabulary, e.window, e.label, e.summary, e.reply) for e in examples]
        arrays[f"{split}_tokens"] = np.concatenate([s.token_ids for s in seqs]).astype("int32")
        arrays[f"{split}_targets"] = np.concatenate([s.targets for s in seqs]).astype("int32")
        arrays[f"{split}_mask"] = np.concatenate([s.loss_mask for s in seqs]).astype(bool)
        arrays[f"{split}_lengths"] = np.array([len(s) for s in seqs], "int32")
        arrays[f"{split}_gold"] = np.array([e.label for e in examples], "int32")
    np.savez_compressed(args.out, **arrays)
    print(f"wrote {args.out}: {len(arrays['train_lengths'])} train, {len(arrays['dev_lengths'])} dev sequences")


def _sequences(data, split):
    import numpy as np

    from pipeline.model.training.format import TrainingSequence

    ends = np.cumsum(data[f"{split}_lengths"])
    starts = ends - data[f"{split}_lengths"]
    return [TrainingSequence(data[f"{split}_tokens"][a:b].tolist(), data[f"{split}_targets"][a:b].tolist(),
                             data[f"{split}_mask"][a:b].tolist()) for a, b in zip(starts, ends)]


def sweep(args: argparse.Namespace) -> None:
    import gguf
    import jax
    import jax.numpy as jnp
    import numpy as np

    from pipeline.model.decoding.state import stateless_scope
    from pipeline.model.loading.gguf_convert import backbone_from_gguf
    from pipeline.model.training.trainer import BlockTrainer, LoraTrainer, epoch_batches, steps_per_epoch
    from pipeline.scoring import sentiment_scores

    data = dict(np.load(args.sequences))
    train, dev = _sequences(data, "train")[: args.limit], _sequences(data, "dev")[: args.limit]
    gold = data["dev_gold"].tolist()[: args.limit]
    labels = jnp.asarray(data["labels"])

    buckets = args.buckets
    dev_pairs = list(epoch_batches(dev, args.batch_tokens, 0, buckets))
    dev_batches = [batch for _, batch in dev_pairs]
    dev_order = [i for b, _ in dev_pairs for i in b]
    results, best = [], None
    args.out.mkdir(parents=True, exist_ok=True)
    for config in args.configs:
        rank, lr = config.split(":")
        loading = time.perf_counter()
        backbone = backbone_from_gguf(gguf.GGUFReader(args.gguf), progress=False)
        print(json.dumps({"config": config, "load_seconds": round(time.perf_counter() - loading, 1)}), flush=True)
        steps = steps_per_epoch(train, args.batch_tokens, args.seed, buckets) * args.epochs
        if rank == "blocks":
            trainer = BlockTrainer(backbone, float(lr), steps, args.seed)
        else:
            trainer = LoraTrainer(backbone, int(rank), float(lr), steps, args.seed, targets=args.lora_targets)

        @jax.jit
        def label_logits(trainable, frozen, batch):
            with stateless_scope(backbone, (trainable, frozen)):
                hidden = backbone({"token_ids": batch.token_ids, "padding_mask": batch.padding_mask})
                first = hidden[jnp.arange(hidden.shape[0]), batch.label_cols]
                return backbone.token_embedding(first[None], reverse=True)[0][:, labels]

        history, started = [], time.perf_counter()
        for epoch in range(args.epochs):
            losses = [trainer.step(batch) for _, batch in epoch_batches(train, args.batch_tokens, args.seed + epoch,
                                                                          buckets)]
            dev_loss = trainer.loss(iter(dev_batches))
            predicted = []
            for b, batch in dev_pairs:
                rows = len(b)
                logits = np.asarray(label_logits(trainer.trainable, trainer.frozen, jax.tree.map(jnp.asarray, batch)))
                predicted += (logits.argmax(axis=1)[:rows] - 1).tolist()
            truth = [gold[i] for i in dev_order]
            f1 = sentiment_scores(truth, predicted)["macro_f1"]
            history.append({"epoch": epoch + 1, "train_loss": round(float(np.mean(losses)), 4),
                            "dev_loss": round(dev_loss, 4), "dev_macro_f1": f1,
                            "seconds": round(time.perf_counter() - started, 1)})
            print(json.dumps({"config": config, **history[-1]}), flush=True)
            if rank != "blocks" and not any(h["dev_loss"] < dev_loss for h in history[:-1]):
                trainer.sync()  # each config keeps its best epoch's adapter
                backbone.save_lora_weights(str(args.out / f"r{rank}-lr{lr}.lora.h5"))
            if best is None or dev_loss < best[0]:
                best = (dev_loss, config, epoch + 1)
        results.append({"config": config, "history": history})
    print(json.dumps({"results": results, "targets": list(args.lora_targets),
                      "best": {"config": best[1], "epochs": best[2], "dev_loss": best[0]},
                      "device": str(jax.devices()[0])}))


def main() -> None:
    from pipeline.model.training import SHIPPED_LORA_TARGETS
    from pipeline.model.training.trainer import TRAIN_BUCKETS
    from pipeline.tune import layer_names

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    e = sub.add_parser("export")
    e.add_argument("--out", type=Path, required=True)
    s = sub.add_parser("sweep")
    s.add_argument("--gguf", type=Path, required=True)
    s.add_argument("--sequences", type=Path, required=True)
    s.add_argument("--out", type=Path, required=True)
    s.add_argument("--configs", nargs="+", default=["16:5e-4", "16:2e-4", "8:1e-3"], help="rank:learning_rate, or blocks:learning_rate (the blocks in full)")
    s.add_argument("--epochs", type=int, default=3)
    s.add_argument("--lora-targets", type=layer_names, default=",".join(SHIPPED_LORA_TARGETS), metavar="NAMES",
                   help="as `chatlens tune --lora-targets` (default: %(default)s)")
    s.add_argument("--batch-tokens", type=int, default=8192)
    s.add_argument("--seed", type=int, default=1234)
    s.add_argument("--buckets", type=lambda text: tuple(int(n) for n in text.split(",")),
                   default=",".join(map(str, TRAIN_BUCKETS)),
                   help="training length buckets, comma-separated (default: %(default)s; fewer compile faster)")
    s.add_argument("--limit", type=int, help="only the first N train and dev sequences (a smoke test)")
    args = parser.parse_args()
    export(args) if args.command == "export" else sweep(args)


if __name__ == "__main__":
    main()
