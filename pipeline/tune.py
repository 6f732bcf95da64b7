"""Tune the embedded Gemma on the corpus: writes a LoRA adapter and its manifest, or (`--train
blocks`) a whole tuned model as a preset directory.

Trains on `data/train.jsonl` (plus, with `--from-dashboard`, what staff taught the
dashboard: corrected labels and approved or edited replies), one sequence per chat in the
one-pass format of `pipeline/model/training/format.py`, with loss on the answers only. Each
epoch ends with the loss on `data/dev.jsonl`, and the adapter kept is the one of the epoch with
the lowest dev loss (so `--epochs` is an upper bound chosen on dev). Then the label calibration
(`pipeline/model/decoding/calibration.py`: a per-label bias for dev macro-F1, a temperature for honest
confidence) is fitted on dev, and the run ends with the dev figures of the calibrated adapter
(`chatlens eval`'s metrics). `--recalibrate` skips training: it refits the calibration of the
adapter at `--out` and re-measures its dev figures. An existing adapter at `--out` is replaced only if
no dev figure falls (`--force` replaces it anyway); the run says which figure fell.
A checkpoint is written every `--checkpoint-every` steps; `--resume` continues from it.
`--start-from` begins at an earlier adapter instead of a fresh LoRA, so an adapter can gain
epochs a run at a time (its manifest keeps the earlier runs under `started_from`).
`--train blocks` trains every weight of the transformer blocks in full, the embedding frozen (about
100M weights against LoRA's few million): `--out` is then a directory, written as a keras-hub preset
that `--model DIR` serves as a tuned model, with its manifest in `DIR/manifest.json`.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import logging
import os
import platform
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from pipeline.corpus import DATA_DIR, SECOND_REPLIES, Example, load_split, second_replies, split_path, with_second_replies
from pipeline.model.training import DEFAULT_LORA_TARGETS, SHIPPED_LORA_TARGETS
from pipeline.model.training.adapters import SHIPPED_ADAPTER, AdapterServing, adapter_name, manifest_path
from pipeline.model.types import ModelSpecError

log = logging.getLogger(__name__)

# Dev figures compared before an adapter is replaced; True where higher is better.
GUARDED = {("sentiment", "macro_f1"): True, ("sentiment", "ece"): False, ("summary", "rouge_l"): True,
           ("summary", "grounded"): True, ("reply", "rouge_l"): True, ("reply", "grounded"): True,
           ("reply", "in_language"): True, ("injection", "held"): True}


TRAINED = ("lora", "blocks")
LEARNING_RATE = {"lora": 1e-3, "blocks": 5e-5}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="gemma3-270m-base",
                        help="base model spec to tune (default: %(default)s, the embedded Gemma 3 270M)")
    parser.add_argument("--model-cache", type=Path, help="model cache directory (default: CHATLENS_CACHE)")
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR, help="corpus directory (default: data/)")
    parser.add_argument("--from-dashboard", metavar="DATABASE_URL",
                        help="also learn from staff corrections and approved or edited replies in this dashboard")
    parser.add_argument("--second-replies", choices=("add", "only"),
                        help="learn the second writer's reply to each train chat that has one (data/second_replies.jsonl; "
                             "reply only, the chat's gold label and summary as its context): 'add' to the train chats, "
                             "or 'only' those (e.g. to give an adapter them alone with --start-from)")
    parser.add_argument("--out", type=Path, default=SHIPPED_ADAPTER,
                        help="adapter file to write, ending in .lora.h5; with --train blocks, a directory for the whole model "
                             "(default: the shipped adapter)")
    parser.add_argument("--train", choices=TRAINED, default="lora",
                        help="what is trained: 'lora', an adapter on the --lora-targets layers, or 'blocks', every "
                             "weight of the transformer blocks with the embedding frozen, written as a whole model "
                             "(a preset directory at --out) (default: %(default)s)")
    parser.add_argument("--rank", type=int, default=16, help="LoRA rank (default: %(default)s)")
    parser.add_argument("--lora-targets", type=layer_names, default=",".join(SHIPPED_LORA_TARGETS), metavar="NAMES",
                        help="comma-separated names of the layers LoRA trains, of keras-hub's attention query, key, "
                             "value, attention_output and feed-forward ffw_gating, ffw_gating_2, ffw_linear "
                             "(default: every one, the shipped adapter's recipe)")
    parser.add_argument("--learning-rate", type=float,
                        help="peak learning rate (default: 1e-3 for lora, 5e-5 for blocks)")
    parser.add_argument("--epochs", type=int, default=2,
                        help="most passes over the training data; the epoch with the lowest dev loss is kept "
                             "(default: %(default)s)")
    parser.add_argument("--batch-tokens", type=int, default=4096,
                        help="padded tokens per batch; batches hold chats of similar length (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=1234, help="seed for LoRA init and batch order (default: %(default)s)")
    parser.add_argument("--limit", type=int, help="train on the first N corpus chats only (a quick try)")
    parser.add_argument("--dev-limit", type=int, help="dev loss and figures on the first N dev chats (default: all)")
    parser.add_argument("--checkpoint-dir", type=Path, default=Path(".chatlens-tune"),
                        help="where checkpoints go (default: %(default)s)")
    parser.add_argument("--checkpoint-every", type=int, default=25, help="steps between checkpoints (default: %(default)s)")
    parser.add_argument("--resume", action="store_true", help="continue from the checkpoint in --checkpoint-dir")
    parser.add_argument("--start-from", type=Path, metavar="ADAPTER",
                        help="begin at this adapter's LoRA weights (tuned with the same --rank on the same base) "
                             "instead of a fresh LoRA: more epochs for an adapter, a run at a time")
    parser.add_argument("--force", action="store_true", help="replace the adapter even if a dev figure falls")
    parser.add_argument("--recalibrate", action="store_true",
                        help="no training: refit the label calibration of the adapter at --out on dev and "
                             "re-measure its dev figures (its manifest keeps how it was trained)")


def training_examples(args: argparse.Namespace) -> tuple[list[Example], dict]:
    """The training chats, and what the manifest says of them (files, sha256 of it all, counts)."""
    digest = hashlib.sha256(split_path("train", args.data_dir).read_bytes())
    examples = load_split("train", args.data_dir)[: args.limit]
    files = ["data/train.jsonl"]
    second = []
    if args.second_replies:
        second = with_second_replies(examples, second_replies(args.data_dir))
        digest.update((args.data_dir / SECOND_REPLIES).read_bytes())
        files.append(f"data/{SECOND_REPLIES}")
        log.info("%s %d second replies", "learning only" if args.second_replies == "only" else "adding", len(second))
        examples = second if args.second_replies == "only" else examples + second
    usable = []
    if args.from_dashboard:
        from pipeline.feedback import export_examples

        taught = export_examples(args.from_dashboard)
        usable = [e for e in taught if e.label is not None or e.reply]
        log.info("adding %d examples from the dashboard", len(usable))
        for example in usable:
            digest.update(example.to_json().encode())
        files.append("dashboard")
    data = {"files": files, "sha256": digest.hexdigest(), "chats": len(examples) + len(usable),
            "from_dashboard": len(usable), **({"second_replies": len(second)} if args.second_replies else {})}
    return examples + usable, data


def fell(old: dict, new: dict) -> list[str]:
    """The guarded dev figures that are worse in `new` than in `old`."""
    worse = []
    for (kind, name), higher_is_better in GUARDED.items():
        before, after = old.get(kind, {}).get(name), new.get(kind, {}).get(name)
        if before is None or after is None:
            continue
        if (after < before) if higher_is_better else (after > before):
            worse.append(f"{kind} {name} {before} -> {after}")
    return worse


def run(args: argparse.Namespace) -> int:
    from chatlens.config import get_settings
    from pipeline.model.environment import use_default_env

    use_default_env()  # before keras is imported: the JAX backend
    from pipeline.model.decoding.one_pass import OnePassEngine
    from pipeline.model.loading.sources import load_causal_lm
    from pipeline.model.training.adapters import load_adapter
    from pipeline.model.training.format import LATEST_FORMAT

    name = output_name(args)
    if args.learning_rate is None:
        args.learning_rate = LEARNING_RATE[args.train]
    started = time.perf_counter()
    lm, source = load_causal_lm(args.model, cache_dir=args.model_cache or get_settings().cache)
    # The engine the pipeline will run, over the model being tuned: its format and its dev figures.
    prompt_format = AdapterServing.of(args.out).prompt_format if args.recalibrate else LATEST_FORMAT
    engine = OnePassEngine(lm, f"{source.model_id}+{name}", serving=AdapterServing(prompt_format=prompt_format))
    dev = load_split("dev", args.data_dir)[: args.dev_limit]
    if args.recalibrate:
        manifest = read_manifest(args.out, "--recalibrate")
        load_adapter(lm.backbone, str(args.out))
    else:
        manifest = train(args, lm, engine, dev)
        manifest["base_model"], manifest["base_spec"] = source.model_id, args.model
        manifest.update(served_as(args.out if args.train == "lora" else SHIPPED_ADAPTER))
    manifest["prompt_format"] = prompt_format
    engine.decoder.answer_vocabulary = AdapterServing.from_json(manifest).answer_vocabulary  # as it will be served
    manifest["label_calibration"] = calibrate(engine, dev)
    manifest["dev"] = dev_figures(engine, dev)
    manifest["wall_seconds"] = round(time.perf_counter() - started, 1)  # this run: loading, training, dev figures
    manifest["machine"] = {"platform": platform.platform(), "cpus": os.cpu_count(),
                           "devices": sorted({d.device_kind for d in __import__("jax").devices()})}
    manifest["created_at"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    if args.train == "blocks":
        return publish_model(lm, manifest, args.out, args.force)
    return publish(None if args.recalibrate else lm.backbone, manifest, args.out, args.force)


def output_name(args: argparse.Namespace) -> str:
    """The adapter's or model's name from `--out`, or a clear error where `--out` does not fit `--train`."""
    if args.train == "blocks":
        if args.out == SHIPPED_ADAPTER or args.out.name.endswith(".lora.h5"):
            raise SystemExit("--train blocks writes a whole model: give --out DIR, a directory for its preset")
        if args.start_from or args.recalibrate:
            raise SystemExit("--train blocks: --start-from and --recalibrate are for LoRA adapters")
        return args.out.name
    try:
        return adapter_name(args.out)
    except ModelSpecError as error:
        raise SystemExit(f"--out: {error}") from None


def train(args: argparse.Namespace, lm, engine, dev: list[Example]) -> dict:
    """Tune `lm` in place (the epoch of lowest dev loss kept); what the manifest says of it."""
    import numpy as np
    from tqdm import tqdm

    from pipeline.model.training.format import training_sequence
    from pipeline.model.training.trainer import BlockTrainer, LoraTrainer, epoch_batches, steps_per_epoch

    vocabulary = engine.decoder.vocabulary
    train_set, training_data = training_examples(args)
    encode = lambda e: training_sequence(vocabulary, e.window, e.label, e.summary, e.reply, e.gold)  # noqa: E731
    train_seqs = [encode(e) for e in train_set]
    dev_seqs = [encode(e) for e in dev]
    epoch_steps = steps_per_epoch(train_seqs, args.batch_tokens, args.seed)
    total = epoch_steps * args.epochs
    if args.train == "blocks":
        trainer = BlockTrainer(lm.backbone, args.learning_rate, total, args.seed)
    else:
        trainer = LoraTrainer(lm.backbone, args.rank, args.learning_rate, total, args.seed, targets=args.lora_targets)
    args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = args.checkpoint_dir / "checkpoint.npz"
    best_epoch = args.checkpoint_dir / "best-epoch.npz"  # the adapter of the lowest dev loss so far
    progress = {"step": 0, "history": []}
    if not args.resume:
        best_epoch.unlink(missing_ok=True)  # from an earlier run
    resuming = args.resume and checkpoint.exists()
    started_from = start_from(args, trainer, load=not resuming) if args.start_from else None
    if resuming:
        arrays = dict(np.load(checkpoint))
        progress = json.loads(str(arrays.pop("progress")))
        trainer.restore(arrays)
        print(f"resumed at step {progress['step']} of {total}", file=sys.stderr)

    def save(path: Path, **extra) -> None:
        partial = path.with_suffix(".tmp.npz")
        np.savez(partial, progress=json.dumps(progress), **trainer.state(), **extra)
        partial.replace(path)

    with tqdm(total=total, initial=progress["step"], desc="tune", unit="step", file=sys.stderr) as bar:
        for epoch in range(progress["step"] // epoch_steps, args.epochs):
            batches = epoch_batches(train_seqs, args.batch_tokens, args.seed + epoch)
            done_in_epoch = progress["step"] - epoch * epoch_steps
            # the epoch's losses so far, kept in checkpoints so a resumed epoch reports all of them
            losses = progress.setdefault("epoch_losses", []) if done_in_epoch else []
            progress["epoch_losses"] = losses
            tokens, clock = 0, time.perf_counter()
            for _, batch in itertools.islice(batches, done_in_epoch, None):
                began = time.perf_counter()
                losses.append(trainer.step(batch))
                progress["train_seconds"] = progress.get("train_seconds", 0.0) + time.perf_counter() - began
                tokens += int(batch.padding_mask.sum())
                progress["step"] += 1
                bar.set_postfix(epoch=epoch + 1, loss=f"{np.mean(losses[-20:]):.3f}",
                                tok_s=f"{tokens / (time.perf_counter() - clock):.0f}")
                bar.update()
                if progress["step"] % args.checkpoint_every == 0:
                    save(checkpoint)
            dev_loss = trainer.loss(batch for _, batch in epoch_batches(dev_seqs, args.batch_tokens, 0))
            progress["history"].append({"epoch": epoch + 1, "train_loss": round(float(np.mean(losses)), 4) if losses else None,
                                        "dev_loss": round(dev_loss, 4)})
            progress["epoch_losses"] = []
            print(f"epoch {epoch + 1}: train loss {progress['history'][-1]['train_loss']}, dev loss {dev_loss:.4f}",
                  file=sys.stderr)
            if dev_loss <= min(h["dev_loss"] for h in progress["history"]):
                save(best_epoch)
            save(checkpoint)
    if best_epoch.exists():
        arrays = dict(np.load(best_epoch))
        chosen = json.loads(str(arrays.pop("progress")))["history"][-1]["epoch"]
        trainer.restore(arrays)
    else:  # trained before epochs were chosen on dev: the last one
        chosen = progress["history"][-1]["epoch"]
    print(f"keeping epoch {chosen} (lowest dev loss)", file=sys.stderr)
    trainer.sync()
    return {
        ("adapter" if args.train == "lora" else "model"): args.out.name,
        "training_data": training_data,
        "trained": args.train,
        "hyperparameters": {**({"rank": args.rank, "targets": list(args.lora_targets)} if args.train == "lora" else {}),
                            "learning_rate": args.learning_rate,
                            "epochs": args.epochs, "batch_tokens": args.batch_tokens, "optimizer": "AdamW, cosine decay, 5% warm-up",
                            "max_prompt_tokens": engine.decoder.max_prompt_tokens},
        "seed": args.seed,
        **({"started_from": started_from} if started_from else {}),
        "history": progress["history"],
        "chosen_epoch": chosen,
        "train_seconds": round(progress.get("train_seconds", 0.0), 1),  # optimizer steps, over every --resume
        "answer_vocabulary": answer_vocabulary(engine, train_set).to_json(),
    }


def answer_vocabulary(engine, examples: list[Example]):
    """The tokens of the chats and answers a model learnt from (`decoding/answer_vocabulary.py`):
    with its tokenizer's common pieces and each batch's prompts, what its decoder may write."""
    from pipeline.model.decoding.answer_vocabulary import AnswerVocabulary

    return AnswerVocabulary.of_texts(engine.decoder._tokenize, (
        text for e in examples for text in [*(m.text for m in e.window.messages), e.summary, e.reply] if text))


def served_as(out: Path) -> dict:
    """How a new model's outputs reach staff: the summary and reply styles and the offer policy of
    the adapter it replaces at `out`, else the shipped adapter's. The blind review chose them (quoted
    summaries, library drafts offered only where the pick is sure, none once an agent has answered);
    a tune changes the model, not how its outputs are served. The dev figures stay the decoded
    texts' own, so they compare with the replaced adapter's."""
    source = out if manifest_path(out).exists() else SHIPPED_ADAPTER
    manifest = json.loads(manifest_path(source).read_text())
    chosen = AdapterServing.from_json(manifest)
    print(f"served as: summary_style {chosen.summary_style}, reply_style {chosen.reply_style}, "
          f"offer_policy {chosen.offer_policy.to_json()}", file=sys.stderr)
    return {"summary_style": chosen.summary_style, "reply_style": chosen.reply_style,  # the policy with its reasons
            "offer_policy": manifest.get("offer_policy") or chosen.offer_policy.to_json()}


def layer_names(text: str) -> tuple[str, ...]:
    """`--lora-targets`: comma-separated layer names (argparse applies it to the default too)."""
    return tuple(name.strip() for name in text.split(",") if name.strip())


def read_manifest(adapter: Path, option: str) -> dict:
    """The manifest beside `adapter`, or a clear error naming the `option` that wanted it."""
    try:
        return json.loads(manifest_path(adapter).read_text())
    except ModelSpecError as error:
        raise SystemExit(f"{option}: {error}") from None
    except FileNotFoundError:
        raise SystemExit(f"{option}: no manifest beside {adapter}") from None


def start_from(args: argparse.Namespace, trainer, load: bool) -> dict:
    """Check the adapter of `--start-from` fits this run and load it into the trainer (unless a
    checkpoint will replace it); what the manifest says of it (its own training, so the chain of
    runs behind an adapter stays on record)."""
    earlier = read_manifest(args.start_from, "--start-from")
    if earlier["hyperparameters"]["rank"] != args.rank:
        raise SystemExit(f"--start-from: that adapter has rank {earlier['hyperparameters']['rank']}, "
                         f"this run --rank {args.rank}")
    missing = set(earlier["hyperparameters"].get("targets", DEFAULT_LORA_TARGETS)) - set(args.lora_targets)
    if missing:
        raise SystemExit(f"--start-from: that adapter trains {sorted(missing)}, which --lora-targets leaves out")
    if earlier.get("base_spec") not in (None, args.model):
        raise SystemExit(f"--start-from: that adapter was tuned on {earlier['base_spec']}, this run on {args.model}")
    if load:
        trainer.start_from(str(args.start_from))
    return {key: earlier[key] for key in ("adapter", "adapter_sha256", "training_data", "hyperparameters", "seed",
                                          "history", "chosen_epoch", "train_seconds", "started_from") if key in earlier}


def calibrate(engine, dev: list[Example]) -> dict:
    """Fit the label calibration on dev's label logits and put it in `engine`; its manifest entry."""
    from tqdm import tqdm

    from pipeline.model.decoding import calibration

    logits = []
    with tqdm(total=len(dev), desc="calibrate", unit="chat", file=sys.stderr) as bar:
        for start in range(0, len(dev), 8):
            logits.extend(engine.label_logits([e.window for e in dev[start : start + 8]]))
            bar.update(len(dev[start : start + 8]))
    fitted = calibration.fit(logits, [e.label for e in dev])
    engine.decoder.calibration = fitted
    print(f"label calibration on {len(dev)} dev chats: bias {fitted.bias}, temperature {fitted.temperature}",
          file=sys.stderr)
    return {**fitted.to_json(), "fitted_on": f"dev ({len(dev)} chats)"}


def dev_figures(engine, dev: list[Example]) -> dict:
    """`chatlens eval`'s figures of `engine` on dev."""
    from tqdm import tqdm

    from pipeline.evaluate import EVAL_BATCH_SIZE, engine_predictions, score_system

    with tqdm(total=len(dev), desc="dev figures", unit="chat", file=sys.stderr) as bar:
        predictions = engine_predictions(engine, dev, EVAL_BATCH_SIZE, bar.update)
    figures, _ = score_system(dev, predictions)
    return {"chats": len(dev), **figures}


def dev_fell(current: Path, manifest: dict, what: str) -> bool:
    """True, saying which, where a dev figure of `manifest` is worse than the one at `current` (if any)."""
    worse = fell(json.loads(current.read_text())["dev"], manifest["dev"]) if current.exists() else []
    if worse:
        print(f"not replacing {what}: dev figures fell: " + "; ".join(worse), file=sys.stderr)
    return bool(worse)


def publish(backbone, manifest: dict, out: Path, force: bool) -> int:
    """Write the adapter and manifest, unless a dev figure fell against the current ones.
    Without a `backbone` (`--recalibrate`) the adapter file stays as it is: only the manifest changes."""
    current = manifest_path(out)
    if not force and dev_fell(current, manifest, "the current adapter"):
        return 3
    out.parent.mkdir(parents=True, exist_ok=True)
    if backbone is not None:
        partial = out.with_name("partial-" + out.name)
        backbone.save_lora_weights(str(partial))
        partial.replace(out)
    manifest["adapter_sha256"] = hashlib.sha256(out.read_bytes()).hexdigest()
    current.write_text(json.dumps(manifest, indent=2) + "\n")
    print(f"wrote {out} and {current.name}: dev {json.dumps(manifest['dev'])}", file=sys.stderr)
    return 0


def publish_model(lm, manifest: dict, out: Path, force: bool) -> int:
    """Write a `--train blocks` model as a keras-hub preset at `out` (with the marker that makes
    `--model out` serve it as a tuned model) and its manifest, unless a dev figure fell against the
    model already there."""
    import shutil

    from pipeline.model.loading.sources import MARKER

    current = out / "manifest.json"
    if not force and dev_fell(current, manifest, "the model there"):
        return 3
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    lm.save_to_preset(str(partial))
    serving = AdapterServing.from_json(manifest)
    marker = {"model_id": f"{manifest['base_model']}+{out.name}", "instruction_tuned": False, "tuned": True,
              **serving.to_json()}
    (partial / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
    (partial / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    partial.replace(out)
    print(f"wrote the model {out} (serve it with --model {out}): dev {json.dumps(manifest['dev'])}", file=sys.stderr)
    return 0
