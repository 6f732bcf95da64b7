"""Benchmark: ChatLens's tuned one-pass model, its prompted engine and the public Beam Gemma pattern.

Same chats, same batch size, one run, three systems:
- `public`: the public pattern (Beam's Gemma notebooks) on the untuned model: `model.generate(prompt)`
  once per element with one prompt asking for JSON sentiment and summary, then a second
  prompt for the apology;
- `prompted`: GemmaModelHandler on `gemma3-270m-base`, the engine untuned models get (sentiment by
  one scoring pass, summaries and replies by batched generation: three prefills per chat);
- `tuned`: GemmaModelHandler on `gemma3-270m`, the default (one pass per chat: label, summary and
  the reply where `--reply-for negative` selects it, on one attention cache).

Each system runs in its own subprocess so compile caches and peak RSS are its own. The two
ChatLens systems run every batch once untimed, then time a second pass: the steady state of a
long-running job, which compiles each of its few shape buckets once (the warm-up's seconds are
reported beside). Prints chats/s, generated tokens/s, p50/p95 batch latency, XLA compile count,
peak RSS and the speedup, then one line of JSON with those figures. A progress bar per system
shows on stderr (the loading and the warm-up come before its first step).

    .venv/bin/python bench/inference.py [--chats 32] [--batch-size 8]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from pipeline.model.environment import use_default_env  # noqa: E402

use_default_env()

PUBLIC_PROMPT = (
    "Provide the results of doing these two tasks on the chat history provided below for the user {user}\n"
    "task 1 : assess if the tone is happy = 1 , neutral = 0 or angry = -1\n"
    "task 2 : summarize the text with a maximum of 512 characters\n"
    "Output the results as a json with fields [sentiment, summary]\n\n@@@{chat}@@@\nAnswer:"
)
PUBLIC_APOLOGY = "Generate an apology response for the user in this chat text: {chat}\nResponse:"
NEW_TOKENS = 128  # the public pattern's generation budget per call, beyond the longest prompt
SYSTEMS = {"public": "gemma3-270m-base", "prompted": "gemma3-270m-base", "tuned": "gemma3-270m"}  # name -> model


def compile_counter() -> list[int]:
    """Counts XLA backend compiles (every jit program, keras-hub's included)."""
    import jax

    count = [0]

    def listener(event: str, duration: float, **_: object) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            count[0] += 1

    jax.monitoring.register_event_duration_secs_listener(listener)
    return count


def load_chats(path: Path, n: int):
    from pipeline.corpus import load_examples

    chats = [e.window for e in load_examples(path)]
    return [chats[(i * 3) % len(chats)] for i in range(n)]  # spread over labels and domains


def progress(done: int) -> None:
    """Tell the parent process (which draws the progress bar) how many chats are done."""
    print(f"PROGRESS {done}", flush=True)


def run_public(chats, model: str, cache: str | None) -> dict:
    from pipeline.model.decoding.buckets import LENGTH_BUCKETS, bucket
    from pipeline.model.loading.sources import load_causal_lm
    from pipeline.prompts import transcript_lines

    lm, source = load_causal_lm(model, cache_dir=cache)
    tokenizer = lm.preprocessor.tokenizer
    texts = ["\n".join(transcript_lines(w.messages)) for w in chats]
    longest = max(len(tokenizer.tokenize(PUBLIC_PROMPT.format(user=w.customer_id, chat=t)))
                  for w, t in zip(chats, texts))
    max_length = bucket(longest + NEW_TOKENS + 1, LENGTH_BUCKETS)  # one fixed length: one compile

    def analyse(window, text) -> tuple[int, int]:
        out = lm.generate(PUBLIC_PROMPT.format(user=window.customer_id, chat=text), max_length=max_length,
                          strip_prompt=True)
        tokens = len(tokenizer.tokenize(out))
        try:
            sentiment = int(json.loads(out[out.index("{"): out.rindex("}") + 1])["sentiment"])
        except (ValueError, KeyError, TypeError):
            sentiment = -1  # unparseable: a real pipeline must treat it as possibly angry
        if sentiment == -1:
            reply = lm.generate(PUBLIC_APOLOGY.format(chat=text), max_length=max_length, strip_prompt=True)
            tokens += len(tokenizer.tokenize(reply))
        return sentiment, tokens

    analyse(chats[0], texts[0])  # warm-up: compile outside the timed pass
    latencies, tokens = [], 0
    started = time.perf_counter()
    for window, text in zip(chats, texts):
        t0 = time.perf_counter()
        tokens += analyse(window, text)[1]
        latencies.append(time.perf_counter() - t0)
        progress(len(latencies))
    return {"seconds": time.perf_counter() - started, "latencies": latencies, "tokens": tokens,
            "model_id": source.model_id, "max_length": max_length}


def run_chatlens(chats, model: str, cache: str | None, batch_size: int) -> dict:
    from pipeline.model.backends.gemma.handler import GemmaModelHandler

    handler = GemmaModelHandler(model, cache_dir=cache, large_model=False, reply_for="negative")
    engine = handler.load_model()

    def batch_run(batch) -> None:
        list(handler.run_inference(batch, engine))

    batches = [chats[start : start + batch_size] for start in range(0, len(chats), batch_size)]
    # Warm-up: every batch once, untimed, so that each shape's XLA compile falls outside the timed
    # pass: a long-running streaming job compiles each of its few shape buckets once.
    warm_up = time.perf_counter()
    for batch in batches:
        batch_run(batch)
    warm_up = time.perf_counter() - warm_up
    tokens_before = engine.get_stats()["generated_tokens"]
    latencies = []
    started = time.perf_counter()
    for done, batch in enumerate(batches, 1):
        t0 = time.perf_counter()
        batch_run(batch)
        latencies.append(time.perf_counter() - t0)
        progress(min(done * batch_size, len(chats)))
    return {"seconds": time.perf_counter() - started, "warm_up_seconds": warm_up, "latencies": latencies,
            "tokens": engine.get_stats()["generated_tokens"] - tokens_before, "model_id": engine.model_id,
            "compiled_programs": engine.get_stats()["compiles"]}


def child(args: argparse.Namespace) -> None:
    compiles = compile_counter()
    chats = load_chats(args.data, args.chats)
    model = SYSTEMS[args.system]
    if args.system == "public":
        result = run_public(chats, model, args.cache)
    else:
        result = run_chatlens(chats, model, args.cache, args.batch_size)
    latencies = sorted(result.pop("latencies"))
    result.update(
        system=args.system,
        chats=len(chats),
        chats_per_s=len(chats) / result["seconds"],
        tokens_per_s=result["tokens"] / result["seconds"],
        p50_batch_s=statistics.median(latencies),
        p95_batch_s=latencies[min(len(latencies) - 1, int(round(0.95 * (len(latencies) - 1))))],
        xla_compiles=compiles[0],
        peak_rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    )
    print("RESULT " + json.dumps(result), flush=True)


def run_child(command: list[str], system: str, chats: int) -> dict:
    """Run one system in its own process with a progress bar; its log is kept aside and shown on failure."""
    from tqdm import tqdm

    with tempfile.TemporaryFile("w+") as log, tqdm(total=chats, desc=system, unit="chat", file=sys.stderr) as bar:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
        result = None
        for line in child.stdout:
            if line.startswith("PROGRESS "):
                bar.update(int(line.split()[1]) - bar.n)
            elif line.startswith("RESULT "):
                result = json.loads(line[7:])
        if child.wait() != 0 or result is None:
            log.seek(0)
            sys.stderr.write(log.read()[-5000:])
            raise SystemExit(f"{system} failed (exit {child.returncode})")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chats", type=int, default=32, help="chats per system (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=8, help="ChatLens batch size (default: %(default)s)")
    parser.add_argument("--cache", default=os.environ.get("CHATLENS_CACHE"), help="model cache directory")
    parser.add_argument("--data", type=Path, default=ROOT / "data/source/eval_chats.jsonl")
    parser.add_argument("--systems", nargs="+", choices=list(SYSTEMS), default=list(SYSTEMS),
                        help="which systems to run side by side (default: all; the public pattern takes ~40 min)")
    parser.add_argument("--system", choices=list(SYSTEMS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.system:
        child(args)
        return 0

    results = {}
    for system in args.systems:
        command = [sys.executable, __file__, "--system", system, "--chats", str(args.chats),
                   "--batch-size", str(args.batch_size), "--data", str(args.data)]
        if args.cache:
            command += ["--cache", args.cache]
        results[system] = run_child(command, system, args.chats)

    print(f"{'system':<10} {'chats/s':>8} {'tokens/s':>9} {'p50 batch s':>12} {'p95 batch s':>12} "
          f"{'compiles':>9} {'peak RSS MiB':>13}")
    for name, r in results.items():
        print(f"{name:<10} {r['chats_per_s']:>8.3f} {r['tokens_per_s']:>9.1f} {r['p50_batch_s']:>12.2f} "
              f"{r['p95_batch_s']:>12.2f} {r['xla_compiles']:>9} {r['peak_rss_mib']:>13.0f}")
    speedups = {f"{a}_vs_{b}": results[a]["chats_per_s"] / results[b]["chats_per_s"]
                for a, b in (("tuned", "prompted"), ("tuned", "public"), ("prompted", "public"))
                if a in results and b in results}
    for name, value in speedups.items():
        print(f"speedup (chats/s) {name.replace('_vs_', ' / ')}: {value:.2f}x")
    rss = results["tuned"]["peak_rss_mib"] / results["prompted"]["peak_rss_mib"] if {"tuned", "prompted"} <= set(
        results) else None
    if rss:
        print(f"peak RSS tuned / prompted: {rss:.2f}")
    summary = {name: {k: r[k] for k in ("chats_per_s", "tokens_per_s", "p50_batch_s", "p95_batch_s",
                                          "xla_compiles", "peak_rss_mib")} for name, r in results.items()}
    print(json.dumps({"bench": "inference", "chats": args.chats, "batch_size": args.batch_size, **summary,
                      "speedup": {k: round(v, 2) for k, v in speedups.items()}, "peak_rss_ratio": rss and round(rss, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
