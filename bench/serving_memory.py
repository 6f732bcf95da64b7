"""Where serving the default model's memory goes: RSS after each stage of loading and analysing.

Loads the model the way the Beam handler does (`backends/gemma/engine.load_engine`), analyses a
few dev chats twice (the first run compiles or reads XLA's cache), and prints the machine
(`helpers.machine`: CPU, cores, vector extensions, memory), then one line per stage:
the RSS after it and the peak during it (Linux's VmHWM, reset before each stage), then the live
JAX arrays by dtype, whether TensorFlow or the trainer were imported, and the analyses as JSON
(to compare two versions' outputs).

    .venv/bin/python bench/serving_memory.py [--chats 4] [--batch-size N] [--model gemma3-270m]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.helpers import describe, machine  # noqa: E402 - after the path is set
from pipeline.model.environment import status_mib, use_default_env  # noqa: E402

use_default_env()


def reset_peak() -> None:
    """Start VmHWM again from the current RSS, so that each stage reports its own peak."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chats", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=None,
                        help="chats per call of the engine (default: all of them in one call)")
    parser.add_argument("--model", default="gemma3-270m")
    parser.add_argument("--data", type=Path, default=ROOT / "data" / "dev.jsonl")
    args = parser.parse_args()
    stages, host = [], machine()
    print(f"machine: {describe(host)}", flush=True)

    def stage(name: str, run):
        reset_peak()
        started = time.perf_counter()
        result = run()
        stages.append({"stage": name, "rss_mib": round(status_mib("VmRSS")), "peak_mib": round(status_mib("VmHWM")),
                       "seconds": round(time.perf_counter() - started, 1)})
        print(f"{name:<28} rss {stages[-1]['rss_mib']:>6} MiB  peak {stages[-1]['peak_mib']:>6} MiB  "
              f"{stages[-1]['seconds']:>6.1f} s", flush=True)
        return result

    from pipeline.corpus import load_examples

    chats = [e.window for e in load_examples(args.data)][: args.chats]
    stage("start", lambda: None)
    from pipeline.model.loading.keras_import import import_keras_hub

    stage("import keras-hub", lambda: import_keras_hub(tensorflow=False))  # as serving imports it
    from pipeline.model.backends.base import ModelOptions
    from pipeline.model.backends.gemma.engine import load_engine

    engine = stage("load engine", lambda: load_engine(ModelOptions(model=args.model)))
    size = args.batch_size or len(chats)

    def analyze():
        return [a for start in range(0, len(chats), size) for a in engine.analyze(chats[start : start + size], "all")]

    first = stage(f"analyze {len(chats)} (first)", analyze)
    second = stage(f"analyze {len(chats)} (again)", analyze)
    assert first == second, "the second run differs from the first"

    import jax

    arrays = Counter()
    for array in jax.live_arrays():
        arrays[str(array.dtype)] += array.nbytes
    report = {
        "machine": host,
        "stages": stages,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "live_jax_arrays_mib": {dtype: round(n / 2**20) for dtype, n in sorted(arrays.items())},
        "compiled_programs_held": len(getattr(getattr(engine, "decoder", None), "programs", ())),
        "tensorflow_imported": "tensorflow" in sys.modules and sys.modules["tensorflow"] is not None,
        "trainer_imported": "pipeline.model.training.trainer" in sys.modules,
        "analyses": [{"scores": a.scores, "summary": a.summary, "reply": a.reply_draft, "flags": a.flags}
                     for a in first],
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
