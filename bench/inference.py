"""Benchmark: ChatLens's tuned one-pass model against its prompted engine, the public Beam Gemma
pattern and llama.cpp on the same GGUF.

Same chats, the same chats side by side (`--batch-size`) and a call (`--bundle`), one run, up to
four systems:
- `public`: the public pattern (Beam's Gemma notebooks) on the untuned model: `model.generate(prompt)`
  once per element with one prompt asking for JSON sentiment and summary, then a second
  prompt for the apology;
- `prompted`: GemmaModelHandler on `gemma3-270m-base`, the engine untuned models get (sentiment by
  one scoring pass, summaries and replies by batched generation: three prefills per chat);
- `tuned`: GemmaModelHandler on `gemma3-270m`, the default (one pass per chat: label, summary and
  the reply where `--reply-for negative` selects it, on one attention cache; a bundle's chats
  beyond `--batch-size` join its decoding loop as others finish);
- `llamacpp`: what a user would pick to run the 270M model on a CPU: llama.cpp on the bundled
  Q4_K_M GGUF with continuous batching, `--batch-size` chats side by side (bench/llamacpp.py),
  given tuned's prompts and its mean generated tokens a chat, greedy (needs the `llamacpp` extra).

Each system runs in its own subprocess so compile caches and peak RSS are its own. Every system
runs once untimed, then times a second pass: the steady state of a long-running job, which
compiles each of its few shape buckets once (the warm-up's seconds are reported beside). Prints
the machine (`helpers.machine`: CPU, cores, vector extensions, memory), then chats/s, generated
tokens/s, p50/p95 latency a chat (from its bundle's start to its result), XLA compile count, peak
RSS, the speedups and RSS ratios, then one line of JSON with those figures. A system whose process
fails is listed as failed (its log shown above) and the others are still reported; the exit status is 1.
`--batch-size 1` measures one chat alone: the latency of a streaming job at low rates. A
progress bar per system shows on stderr (the loading and the warm-up come before its first step).

    .venv/bin/python bench/inference.py [--chats 32] [--batch-size 8] [--bundle 32] [--systems tuned llamacpp]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.helpers import describe, machine  # noqa: E402 - after the path is set
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
SYSTEMS = {"public": "gemma3-270m-base", "prompted": "gemma3-270m-base", "tuned": "gemma3-270m",
           "llamacpp": "gemma3-270m-base"}  # name -> model (llama.cpp: the bundled GGUF itself)


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


def run_chatlens(chats, model: str, cache: str | None, batch_size: int, bundle: int) -> dict:
    """Calls of `bundle` chats, as Beam hands them to the handler; the one-pass engine decodes
    `batch_size` of them side by side, the rest joining as others finish."""
    from pipeline.model.backends.gemma.handler import GemmaModelHandler

    handler = GemmaModelHandler(model, cache_dir=cache, large_model=False, reply_for="negative")
    engine = handler.load_model()
    decoder = getattr(engine, "decoder", None)  # the one-pass engine's
    if decoder is not None:
        decoder.decoding_rows = batch_size

    def batch_run(batch) -> None:
        list(handler.run_inference(batch, engine))

    batches = [chats[start : start + bundle] for start in range(0, len(chats), bundle)]
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
        progress(min(done * bundle, len(chats)))
    result = {"seconds": time.perf_counter() - started, "warm_up_seconds": warm_up,
              "latencies": [seconds for batch, seconds in zip(batches, latencies) for _ in batch],
              "tokens": engine.get_stats()["generated_tokens"] - tokens_before, "model_id": engine.model_id,
              "compiled_programs": engine.get_stats()["compiles"]}
    if decoder is not None:  # what llama.cpp is given beside it: the same prompts
        result["prompts"] = [decoder.vocabulary.prompt(w, decoder.max_prompt_tokens)[0] for w in chats]
    return result


def run_llamacpp(cache: str | None, batch_size: int, prompts: list[list[int]], tokens_per_chat: int,
                 bundle: int) -> dict:
    """llama.cpp's continuous batching (bench/llamacpp.py) over the same bundles: the tuned
    system's prompts and its mean tokens a chat, `batch_size` chats side by side as ChatLens's
    loop holds them. A chat's latency is from its bundle's start to its last token (a bundle's
    chats arrive together; ChatLens answers them all at its bundle's end)."""
    from bench.llamacpp import LlamaCppServer
    from chatlens.config import get_settings
    from pipeline.model.loading.sources import bundled_gguf

    gguf = bundled_gguf(cache or get_settings().cache)  # where resolve_model assembles it too
    server = LlamaCppServer(str(gguf), slots=batch_size, threads=os.cpu_count() or 1,
                            context=batch_size * (max(map(len, prompts)) + tokens_per_chat + 1))
    budgets = [tokens_per_chat] * len(prompts)
    bundles = [list(range(start, min(start + bundle, len(prompts)))) for start in range(0, len(prompts), bundle)]
    warm_up = time.perf_counter()
    server.serve([prompts[i] for i in bundles[0]], budgets)  # untimed, as ChatLens's warm-up
    warm_up = time.perf_counter() - warm_up
    latencies = []
    started = time.perf_counter()
    for bundle in bundles:
        begun = time.perf_counter()
        server.serve([prompts[i] for i in bundle], budgets,
                     done=lambda chat, seconds: latencies.append(time.perf_counter() - begun))
        progress(len(latencies))
    seconds = time.perf_counter() - started
    server.close()
    return {"seconds": seconds, "warm_up_seconds": warm_up, "latencies": latencies,
            "tokens": tokens_per_chat * len(prompts), "model_id": f"llama.cpp {gguf.name}"}


def child(args: argparse.Namespace) -> None:
    if args.system == "llamacpp":  # nothing of JAX in its process: its peak RSS is llama.cpp's own
        given = json.loads(args.given.read_text())
        compiles = [0]
        chats = given["prompts"]
        result = run_llamacpp(args.cache, args.batch_size, chats, given["tokens_per_chat"], args.bundle)
    else:
        compiles = compile_counter()
        chats = load_chats(args.data, args.chats)
        if args.system == "public":
            result = run_public(chats, SYSTEMS["public"], args.cache)
        else:
            result = run_chatlens(chats, SYSTEMS[args.system], args.cache, args.batch_size, args.bundle)
    latencies = sorted(result.pop("latencies"))
    result.update(
        system=args.system,
        chats=len(chats),
        chats_per_s=len(chats) / result["seconds"],
        tokens_per_s=result["tokens"] / result["seconds"],
        p50_chat_s=statistics.median(latencies),
        p95_chat_s=latencies[min(len(latencies) - 1, int(round(0.95 * (len(latencies) - 1))))],
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
            hint = LLAMACPP_AMX_HINT if system == "llamacpp" and child.returncode == -signal.SIGSEGV else ""
            raise SystemFailed(f"failed (exit {child.returncode}){hint}")
    return result


class SystemFailed(RuntimeError):
    """One system's process failed; its log has been shown."""


LLAMACPP_AMX_HINT = (
    ": on a CPU with AMX, llama.cpp's AMX kernels crash on this Q4_K_M GGUF (ggml-org/llama.cpp#20824); "
    "build llama-cpp-python without them as the README's inference benchmark shows (CMAKE_ARGS=-DGGML_NATIVE=OFF ...)")


COLUMNS = ("chats_per_s", "tokens_per_s", "p50_chat_s", "p95_chat_s", "xla_compiles", "peak_rss_mib")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chats", type=int, default=32, help="chats per system (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=8,
                        help="chats decoded side by side: the tuned engine's decoding rows and llama.cpp's parallel "
                             "slots (default: %(default)s; 1: one chat alone, the latency)")
    parser.add_argument("--bundle", type=int,
                        help="chats per model call, as Beam hands them to the handler (default: --batch-size); "
                             "more than --batch-size join as others finish (continuous batching)")
    parser.add_argument("--cache", default=os.environ.get("CHATLENS_CACHE"), help="model cache directory")
    parser.add_argument("--data", type=Path, default=ROOT / "data/source/eval_chats.jsonl")
    parser.add_argument("--systems", nargs="+", choices=list(SYSTEMS), default=["public", "prompted", "tuned"],
                        help="which systems to run side by side (default: %(default)s; the public pattern takes "
                             "~40 min; llamacpp needs the llamacpp extra and runs after tuned, on its prompts)")
    parser.add_argument("--system", choices=list(SYSTEMS), help=argparse.SUPPRESS)
    parser.add_argument("--given", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.bundle = args.bundle or args.batch_size
    if args.system:
        child(args)
        return 0
    if "llamacpp" in args.systems and "tuned" not in args.systems:
        parser.error("llamacpp runs beside tuned: it is given tuned's prompts and tokens a chat")

    host, results, failures = machine(), {}, {}
    with tempfile.TemporaryDirectory() as scratch:
        given = Path(scratch) / "given.json"
        for system in sorted(args.systems, key=lambda name: name == "llamacpp"):  # llamacpp last: after tuned
            if system == "llamacpp" and "tuned" not in results:
                failures[system] = "not run: it is given tuned's prompts, and tuned failed"
                continue
            command = [sys.executable, __file__, "--system", system, "--chats", str(args.chats), "--batch-size",
                       str(args.batch_size), "--bundle", str(args.bundle), "--data", str(args.data),
                       "--given", str(given)]
            if args.cache:
                command += ["--cache", args.cache]
            try:
                results[system] = run_child(command, system, args.chats)
            except SystemFailed as failure:  # the other systems' figures are still reported
                failures[system] = str(failure)
                continue
            if system == "tuned":
                tuned = results["tuned"]
                given.write_text(json.dumps({"prompts": tuned.pop("prompts"),
                                             "tokens_per_chat": round(tuned["tokens"] / tuned["chats"])}))

    print(f"machine: {describe(host)}")
    print(f"{'system':<10} {'chats/s':>8} {'tokens/s':>9} {'p50 chat s':>11} {'p95 chat s':>11} "
          f"{'compiles':>9} {'peak RSS MiB':>13}")
    for name, r in results.items():
        print(f"{name:<10} {r['chats_per_s']:>8.3f} {r['tokens_per_s']:>9.1f} {r['p50_chat_s']:>11.2f} "
              f"{r['p95_chat_s']:>11.2f} {r['xla_compiles']:>9} {r['peak_rss_mib']:>13.0f}")
    pairs = (("tuned", "prompted"), ("tuned", "public"), ("prompted", "public"), ("tuned", "llamacpp"))
    speedups = {f"{a}_vs_{b}": results[a]["chats_per_s"] / results[b]["chats_per_s"]
                for a, b in pairs if a in results and b in results}
    for name, value in speedups.items():
        print(f"speedup (chats/s) {name.replace('_vs_', ' / ')}: {value:.2f}x")
    ratios = {f"{a}_vs_{b}": results[a]["peak_rss_mib"] / results[b]["peak_rss_mib"]
              for a, b in (("tuned", "prompted"), ("tuned", "llamacpp")) if a in results and b in results}
    for name, value in ratios.items():
        print(f"peak RSS {name.replace('_vs_', ' / ')}: {value:.2f}")
    if "llamacpp" in results:
        latency = results["tuned"]["p50_chat_s"] / results["llamacpp"]["p50_chat_s"]
        print(f"p50 chat latency tuned / llamacpp: {latency:.2f} ({args.batch_size} side by side, "
              f"{args.bundle} a call)")
    for name, reason in failures.items():
        print(f"{name:<10} {reason}")
    summary = {name: {k: r[k] for k in COLUMNS} for name, r in results.items()}
    print(json.dumps({"bench": "inference", "machine": host, "chats": args.chats, "batch_size": args.batch_size,
                      "bundle": args.bundle, **summary, "speedup": {k: round(v, 2) for k, v in speedups.items()},
                      "peak_rss_ratio": {k: round(v, 2) for k, v in ratios.items()}, "failed": failures}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
