"""Analyse a file of ChatWindows (JSON lines) into ChatInsights, without Pub/Sub.

The same transforms and model handler as `chatlens pipeline`, as a batch Beam pipeline
on the BundleBasedDirectRunner: every valid line becomes one ChatInsight in OUT (in
input order); every invalid one a DeadLetter in OUT.deadletter.jsonl (attributes
`file` and `line` say where it came from). Repeated (chat_id, window_id) pairs are
analysed once. A progress bar shows on stderr and a summary line ends the run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from pipeline.model.backends.base import SHARED_OPTIONS, ModelOptions, Option
from pipeline.options import PipelineConfig, add_option_rows

FILE_BATCH = Option("--max-batch-size", "chats a model call takes: a tuned model decodes 8 side by side, the rest "
                    "joining as others finish (no chat waits for a deadline here, so larger calls serve more a "
                    "second)", 32, int)

MODEL_ROWS = tuple(FILE_BATCH if row.dest == "max_batch_size" else row for row in SHARED_OPTIONS
                   if row.dest in ("model", "adapter", "model_cache", "prompt_variant", "max_batch_size", "reply_for",
                                 "reply_library", "weights"))
"""The pipeline's model options that `chatlens analyze` takes (its batches form within a file, in
one process: no batch deadline, no model copies; larger batches by default, `FILE_BATCH`)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("input", type=Path, metavar="IN.jsonl", help="ChatWindows, one JSON object per line")
    parser.add_argument("-o", "--output", type=Path, metavar="OUT.jsonl",
                        help="where the ChatInsights go (default: IN.insights.jsonl); dead letters go to "
                             "OUT.deadletter.jsonl")
    add_option_rows(parser.add_argument_group("model options (as `chatlens pipeline`'s)"), MODEL_ROWS)
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def output_paths(input_path: Path, output: Path | None) -> tuple[Path, Path]:
    """(insights file, dead-letter file) for `chatlens analyze IN [-o OUT]`."""
    base = input_path.name[: -len(".jsonl")] if input_path.name.endswith(".jsonl") else input_path.name
    out = output or input_path.with_name(f"{base}.insights.jsonl")
    stem = out.name[: -len(".jsonl")] if out.name.endswith(".jsonl") else out.name
    return out, out.with_name(f"{stem}.deadletter.jsonl")


def run(args: argparse.Namespace) -> int:
    from chatlens.config import get_settings

    settings = get_settings()
    if not args.input.is_file():
        print(f"chatlens analyze: {args.input}: no such file", file=sys.stderr)
        return 2
    out, dead_out = output_paths(args.input, args.output)
    model = ModelOptions.from_values(args, model=args.model or settings.model,
                                     model_cache=args.model_cache or str(settings.cache), max_batch_duration_secs=0,
                                     reply_library=args.reply_library or settings.reply_library)
    config = PipelineConfig(project=settings.project, mode="windows", model_sharing="process",
                            **{f.name: getattr(model, f.name) for f in dataclasses.fields(model)})
    started = time.monotonic()
    summary = analyze_file(args.input, out, dead_out, config, progress=not args.no_progress)
    elapsed = time.monotonic() - started
    sentiments = ", ".join(f"{summary[name]} {name}" for name in ("negative", "neutral", "positive"))
    print(
        f"{summary['lines']} line(s) from {args.input}: {summary['insights']} insight(s) ({sentiments}; "
        f"{summary['replies']} reply draft(s)) -> {out}; {summary['dead_letters']} dead letter(s) -> {dead_out}; "
        f"{summary['duplicates']} duplicate(s) skipped; {elapsed:.1f} s",
        file=sys.stderr,
    )
    return 0


def analyze_file(input_path: Path, out: Path, dead_out: Path, config: PipelineConfig, *,
                 progress: bool = True) -> Counter:
    """Run the batch pipeline over `input_path`; returns counts (lines, insights, dead_letters, ...)."""
    import apache_beam as beam

    from pipeline.options import beam_options
    from pipeline.metrics import STATS
    from pipeline.transforms.analyze import AnalyzeChats
    from pipeline.transforms.records import DEAD_LETTER, Envelope

    STATS.reset()

    lines = [(number, line.rstrip(b"\r\n")) for number, line in enumerate(input_path.read_bytes().splitlines(True), 1)]
    lines = [(number, line) for number, line in lines if line.strip()]
    name = str(input_path)

    def envelope(numbered):
        number, data = numbered
        return Envelope(data=data, attributes={"file": name, "line": str(number)}, source_id=f"line:{number}")

    def tagged(kind):
        def line_of(output):
            number = int(output.source_ids[0].split(":", 1)[1]) if output.source_ids else 0
            return f"{number}\t{kind}\t{output.data.decode('utf-8')}"
        return line_of

    with tempfile.TemporaryDirectory(prefix="chatlens-analyze-") as scratch:
        pipeline = beam.Pipeline(options=beam_options(config, [], streaming=False))
        outputs = (
            pipeline
            | "Lines" >> beam.Create(lines, reshuffle=False)
            | "Envelope" >> beam.Map(envelope)
            | "AnalyzeChats" >> AnalyzeChats(config)
        )
        results = (
            (outputs["insights"] | "Insight" >> beam.Map(tagged("insight")),
             outputs[DEAD_LETTER] | "DeadLetter" >> beam.Map(tagged("dead_letter")))
            | beam.Flatten()
            | beam.io.WriteToText(str(Path(scratch) / "results"), shard_name_template="", num_shards=1)
        )
        del results
        result = pipeline.run()
        _follow(result, len(lines), progress)
        counts = Counter(lines=len(lines))
        records = []
        scratch_file = Path(scratch) / "results"
        if scratch_file.exists():
            for row in scratch_file.read_text(encoding="utf-8").splitlines():
                number, kind, data = row.split("\t", 2)
                records.append((int(number), kind, data))
    records.sort(key=lambda r: (r[0], r[1]))
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as insights, dead_out.open("w", encoding="utf-8") as dead:
        for _, kind, data in records:
            if kind == "insight":
                insights.write(data + "\n")
                counts["insights"] += 1
                insight = json.loads(data)
                counts[{-1: "negative", 0: "neutral", 1: "positive"}[insight["sentiment"]]] += 1
                counts["replies"] += bool(insight.get("reply_draft"))
            else:
                dead.write(data + "\n")
                counts["dead_letters"] += 1
    counts["duplicates"] = len(lines) - counts["insights"] - counts["dead_letters"]
    return counts


def _follow(result, total: int, progress: bool) -> None:
    """Wait for the pipeline, with a progress bar fed by its chatlens counters."""
    done = threading.Event()
    failure: list[BaseException] = []

    def wait():
        try:
            result.wait_until_finish()
        except BaseException as error:  # noqa: BLE001 - re-raised in the caller's thread
            failure.append(error)
        finally:
            done.set()

    threading.Thread(target=wait, daemon=True, name="chatlens-analyze-wait").start()
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="chat", desc="analyze", file=sys.stderr, dynamic_ncols=True)
    from pipeline.metrics import STATS

    while not done.wait(0.5):
        if bar is None:
            continue
        counts = STATS.counts()  # Beam's metrics lag on the direct runner; these are in-process
        finished = sum(v for k, v in counts.items()
                       if k in ("insights", "duplicates_dropped") or k.startswith("dead_letters_"))
        bar.update(max(0, min(finished, total) - bar.n))
    if bar is not None:
        bar.update(total - bar.n if not failure else 0)
        bar.close()
    if failure:
        raise failure[0]
