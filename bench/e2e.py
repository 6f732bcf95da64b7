"""Benchmark: the local streaming stack end to end, with Gemma and with a no-op model stage.

Starts the in-process Pub/Sub server (localpubsub.server.EmulatorServer) on a free port,
creates the topics and subscriptions, starts `chatlens pipeline` in a subprocess on the
BundleBasedDirectRunner, and consumes the results topic with a streaming-pull subscriber.
Nothing is faked: the chats are the bundled demo chats (each published copy gets its own
chat_id, so the dedup stage never drops one), published with the real PublisherClient.

For each model stage (`--model-stage gemma`, then `--model-stage noop`):

1. warm-up: publish one chat and wait for its insight (model loaded, first programs
   compiled), then a small burst; none of it counts in the figures.
2. main phase: publish ChatWindows at `--rate` per second for `--duration` seconds;
   latency = insight received - publish call, per chat; throughput = outcomes received
   during the phase / its length; backlog = published - outcomes, sampled every 0.25 s
   (the table shows it at mid-phase and at the end); then wait for the rest (drain).
3. sustained-rate search: short phases at the `--rates` (`--noop-rates`) above the main
   rate, going up until one is not sustained (below it, going down, when the main rate
   is not). A rate is sustained when the backlog does not grow over the phase (mean
   backlog of its last quarter - mean of its second quarter <= max(2, 10% of what the
   second half published)), ends within rate x `--latency-budget` (at least 2) and
   every chat is answered within the drain timeout.

The noop stage is the same pipeline with the model call replaced by the cheapest one
possible (pipeline/model/backends/noop/handler.py: same RunInference batching and shared-model proxy,
a fixed neutral analysis back at once), so noop latency is the pipeline's own overhead
and gemma - noop is the model. Prints a table, the overhead, then one line of JSON.

    .venv/bin/python bench/e2e.py            # about 10 minutes on a 2-core CPU
    .venv/bin/python bench/e2e.py --quick    # about 3-4 minutes, fewer and shorter phases
    .venv/bin/python bench/e2e.py --stages noop --noop-rates 5,10,20

Latency percentiles with few chats are coarse (with n < 100, p99 is the maximum); a
chat still unanswered when the drain times out counts with its age so far (censored,
a lower bound) rather than being left out.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.helpers import apply_quick, comma_choices, fmt, percentile, say  # noqa: E402 - after the path is set
from pipeline.model.backends import BACKENDS  # noqa: E402 - light: no Beam, no JAX

PROJECT = "chatlens-bench"
SAMPLE_EVERY = 0.25  # seconds between backlog samples
PHASE_KEYS = ("rate_per_s", "duration_s", "published", "throughput_per_s", "p50_s", "p95_s", "backlog_mid",
              "backlog_end", "backlog_growth", "drain_s", "censored", "sustained")  # per phase, in the JSON
STAGES = tuple(BACKENDS)
"""--stages: every model backend `chatlens pipeline --model-stage` takes, from the registry, so a new
backend can be benchmarked as it lands (its own options go in --pipeline-args)."""


# ---- figures -------------------------------------------------------------------------------
@dataclass
class Phase:
    stage: str
    kind: str  # "main" or "search"
    rate: float
    duration: float
    published: int = 0
    insights: int = 0
    dead_letters: int = 0
    duplicates: int = 0
    in_window: int = 0  # outcomes received while publishing
    backlog_mid: int = 0
    backlog_end: int = 0
    samples: list[tuple[float, int]] = field(default_factory=list)  # (seconds into the phase, backlog)
    drain_s: float | None = None  # from the end of publishing to the last outcome
    censored: int = 0  # never answered within the drain timeout
    latencies: list[float] = field(default_factory=list)
    publish_lag_s: float = 0.0  # how far publishing fell behind its schedule, at most
    sustained: bool = False
    latency_budget: float = 30.0

    @property
    def throughput(self) -> float:
        return self.in_window / self.duration

    def figures(self) -> dict:
        def r(x, n=3):
            return None if x is None else round(x, n)

        return {
            "rate_per_s": self.rate, "duration_s": self.duration, "published": self.published,
            "insights": self.insights, "dead_letters": self.dead_letters, "duplicates": self.duplicates,
            "throughput_per_s": r(self.throughput, 4),
            "p50_s": r(percentile(self.latencies, 50)), "p95_s": r(percentile(self.latencies, 95)),
            "p99_s": r(percentile(self.latencies, 99)), "max_s": r(max(self.latencies, default=None)),
            "backlog_mid": self.backlog_mid, "backlog_end": self.backlog_end,
            "backlog_growth": r(self.backlog_growth(), 2), "drain_s": r(self.drain_s, 1),
            "censored": self.censored, "sustained": self.sustained,
        }

    def _mean_backlog(self, lo: float, hi: float) -> float | None:
        values = [b for t, b in self.samples if lo * self.duration <= t <= hi * self.duration]
        return sum(values) / len(values) if values else None

    def backlog_growth(self) -> float | None:
        """Mean backlog over the last quarter of the phase minus that over its second quarter.

        Means, not two point samples: with batching, the backlog at one instant swings by a
        batch. A pipeline that keeps up has a flat backlog (about rate x latency); one that
        does not grows by (rate - capacity) x half the phase.
        """
        early, late = self._mean_backlog(0.25, 0.5), self._mean_backlog(0.75, 1.0)
        return None if early is None or late is None else late - early

    def judge(self) -> bool:
        growth = self.backlog_growth()
        if growth is None:
            growth = self.backlog_end - self.backlog_mid
        growth_ok = growth <= max(2.0, 0.1 * self.rate * self.duration / 2)
        backlog_ok = self.backlog_end <= max(2, math.ceil(self.rate * self.latency_budget))
        self.sustained = growth_ok and backlog_ok and self.censored == 0 and self.publish_lag_s < 1.0
        return self.sustained


# ---- the results topic -------------------------------------------------------------------
class Outcomes:
    """Streaming-pull subscribers on the insights and dead-letter subscriptions: arrival time per chat_id."""

    def __init__(self, project: str):
        from google.cloud import pubsub_v1

        from chatlens.config import LAYOUT, subscription_path

        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self.first: dict[str, tuple[float, str]] = {}  # chat_id -> (monotonic arrival, "insight"|"dead")
        self.repeats: dict[str, int] = {}
        self.model_ids: dict[str, int] = {}
        self._client = pubsub_v1.SubscriberClient()
        flow = pubsub_v1.types.FlowControl(max_messages=2000)
        self._futures = [
            self._client.subscribe(subscription_path(project, LAYOUT.insights_subscription),
                                   lambda m: self._receive(m, "insight"), flow_control=flow),
            self._client.subscribe(subscription_path(project, LAYOUT.deadletter_subscription),
                                   lambda m: self._receive(m, "dead"), flow_control=flow),
        ]

    def _receive(self, message, kind: str) -> None:
        now = time.monotonic()
        chat_id = message.attributes.get("chat_id", "")
        model_id = None
        if kind == "insight":
            try:
                model_id = json.loads(message.data).get("model_id")
            except ValueError:
                pass
        message.ack()
        with self._changed:
            if chat_id in self.first:
                self.repeats[chat_id] = self.repeats.get(chat_id, 0) + 1
            else:
                self.first[chat_id] = (now, kind)
            if model_id:
                self.model_ids[model_id] = self.model_ids.get(model_id, 0) + 1
            self._changed.notify_all()

    def done(self, chat_ids) -> int:
        with self._lock:
            return sum(1 for c in chat_ids if c in self.first)

    def wait_all(self, chat_ids: list[str], deadline: float, alive) -> bool:
        with self._changed:
            while True:
                if all(c in self.first for c in chat_ids):
                    return True
                left = deadline - time.monotonic()
                if left <= 0 or not alive():
                    return False
                self._changed.wait(min(left, 1.0))

    def get(self, chat_id: str) -> tuple[float, str] | None:
        with self._lock:
            return self.first.get(chat_id)

    def received_between(self, chat_ids, start: float, end: float) -> int:
        with self._lock:
            return sum(1 for c in chat_ids if c in self.first and start <= self.first[c][0] <= end)

    def close(self) -> None:
        for future in self._futures:
            future.cancel()
            try:
                future.result(timeout=10)
            except Exception:  # noqa: BLE001 - cancelled
                pass
        self._client.close()


# ---- the pipeline process ------------------------------------------------------------------
class Pipeline:
    """`chatlens pipeline --model-stage STAGE` in its own session, TMPDIR and log file."""

    def __init__(self, stage: str, emulator: str, workdir: Path, args: argparse.Namespace):
        self.stage = stage
        self.log_path = workdir / f"pipeline-{stage}.log"
        chatlens = Path(sys.executable).with_name("chatlens")
        command = [str(chatlens)] if chatlens.exists() else [sys.executable, "-m", "cli"]
        self.command = [*command, "pipeline", "--project", PROJECT, "--status-every", "5",
                        "--model-stage", stage, "--max-batch-size", str(args.max_batch_size),
                        "--max-batch-duration-secs", str(args.max_batch_duration_secs)]
        if args.model:
            self.command += ["--model", args.model]
        if args.model_cache:
            self.command += ["--model-cache", args.model_cache]
        self.command += shlex.split(args.pipeline_args or "")
        private_tmp = workdir / f"tmp-{stage}"
        private_tmp.mkdir()
        self.env = {
            **os.environ,
            "PUBSUB_EMULATOR_HOST": emulator,
            "PYTHONUNBUFFERED": "1",
            # Beam's shared-model server finds its peers by files in the temp dir: a private
            # one keeps this pipeline's model to itself (other pipelines on this machine
            # would otherwise share it, and the measurement with it).
            "TMPDIR": str(private_tmp),
        }
        self.process: subprocess.Popen | None = None
        self.started_at = 0.0

    def start(self) -> Pipeline:
        with self.log_path.open("ab") as log:
            log.write(f"===== {' '.join(self.command)}\n".encode())
            log.flush()
            self.started_at = time.monotonic()
            self.process = subprocess.Popen(self.command, cwd=ROOT, env=self.env, stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> int | None:
        if self.process is None:
            return None
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # leftovers: the shared-model server process
        except ProcessLookupError:
            pass
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            pass
        return self.process.returncode

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


# ---- publishing ----------------------------------------------------------------------------
class Chats:
    """Demo ChatWindows in a fixed shuffled order; each copy published gets a unique chat_id."""

    def __init__(self, path: Path, seed: int):
        from chatlens.simulate import load_chats

        self.windows = load_chats(path)
        random.Random(seed).shuffle(self.windows)
        self._counter = itertools.count()

    def take(self, tag: str) -> tuple[str, bytes]:
        from chatlens.contracts import to_json_bytes

        n = next(self._counter)
        window = self.windows[n % len(self.windows)]
        chat_id = f"{window.chat_id}-{tag}{n}"
        messages = [m.model_copy(update={"chat_id": chat_id}) for m in window.messages]
        return chat_id, to_json_bytes(window.model_copy(update={"chat_id": chat_id, "messages": messages}))


class Publisher:
    def __init__(self, project: str):
        from google.cloud import pubsub_v1

        from chatlens.config import LAYOUT, topic_path

        self._client = pubsub_v1.PublisherClient()
        self._topic = topic_path(project, LAYOUT.windows_topic)
        self.sent_at: dict[str, float] = {}
        self._futures = []

    def publish(self, chat_id: str, data: bytes) -> None:
        self.sent_at[chat_id] = time.monotonic()
        self._futures.append(self._client.publish(self._topic, data, chat_id=chat_id))

    def confirm(self) -> None:
        futures, self._futures = self._futures, []
        for future in futures:
            future.result(timeout=60)

    def close(self) -> None:
        self.confirm()
        self._client.transport.close()


# ---- one stage -----------------------------------------------------------------------------
class StageRun:
    def __init__(self, stage: str, args: argparse.Namespace, workdir: Path):
        self.stage = stage
        self.args = args
        self.workdir = workdir
        self.phases: list[Phase] = []
        self.ready_s: float | None = None
        self.warmup_s: float | None = None
        self.model_ids: dict[str, int] = {}
        self.repeats = 0
        self.keep_logs = False  # set when something went unanswered

    def run(self) -> StageRun:
        from localpubsub.admin import ensure_layout
        from localpubsub.server import EmulatorServer

        args = self.args
        server = EmulatorServer("localhost", 0).start()  # a fresh server per stage: no leftovers
        pipeline = outcomes = publisher = None
        previous_host = os.environ.get("PUBSUB_EMULATOR_HOST")
        try:
            os.environ["PUBSUB_EMULATOR_HOST"] = server.address
            ensure_layout(PROJECT)
            outcomes = Outcomes(PROJECT)
            publisher = Publisher(PROJECT)
            chats = Chats(args.data, args.seed)  # the same chats in the same order for each stage
            pipeline = Pipeline(self.stage, server.address, self.workdir, args).start()
            say(f"[{self.stage}] started `{' '.join(pipeline.command[1:])}` (log {pipeline.log_path})")
            self._warm_up(pipeline, outcomes, publisher, chats)
            self._phases(pipeline, outcomes, publisher, chats)
            self.model_ids = dict(outcomes.model_ids)
            self.repeats = sum(outcomes.repeats.values())
        except BaseException:
            if pipeline is not None:
                say(f"----- tail of {pipeline.log_path} -----\n{pipeline.log_tail()}")
            raise
        finally:
            if pipeline is not None:
                code = pipeline.stop()
                say(f"[{self.stage}] pipeline stopped (exit {code})")
            if publisher is not None:
                try:
                    publisher.close()
                except Exception as error:  # noqa: BLE001 - the server may be going away
                    say(f"[{self.stage}] publisher close: {error}")
            if outcomes is not None:
                outcomes.close()
            server.stop()
            if previous_host is None:
                os.environ.pop("PUBSUB_EMULATOR_HOST", None)
            else:
                os.environ["PUBSUB_EMULATOR_HOST"] = previous_host
        return self

    def _warm_up(self, pipeline: Pipeline, outcomes: Outcomes, publisher: Publisher, chats: Chats) -> None:
        """First insight = ready (model loaded); then a burst so that batch shapes compile outside the figures."""
        args = self.args
        deadline = time.monotonic() + args.ready_timeout
        first = [chats.take("warm")]
        for chat_id, data in first:
            publisher.publish(chat_id, data)
        publisher.confirm()
        if not outcomes.wait_all([c for c, _ in first], deadline, pipeline.alive):
            raise RuntimeError(f"[{self.stage}] no insight within {args.ready_timeout:.0f} s of the start "
                               f"(pipeline {'running' if pipeline.alive() else 'exited'})")
        self.ready_s = time.monotonic() - pipeline.started_at
        say(f"[{self.stage}] ready: first insight {self.ready_s:.0f} s after the start")
        burst = [chats.take("warm") for _ in range(max(0, args.warmup - 1))]
        if burst:
            started = time.monotonic()
            for chat_id, data in burst:
                publisher.publish(chat_id, data)
            publisher.confirm()
            if not outcomes.wait_all([c for c, _ in burst], time.monotonic() + args.ready_timeout, pipeline.alive):
                raise RuntimeError(f"[{self.stage}] warm-up burst of {len(burst)} not answered")
            self.warmup_s = time.monotonic() - started
            say(f"[{self.stage}] warm-up burst of {len(burst)} answered in {self.warmup_s:.1f} s")

    def _phases(self, pipeline: Pipeline, outcomes: Outcomes, publisher: Publisher, chats: Chats) -> None:
        args = self.args
        rates = sorted(set(args.noop_rates if self.stage == "noop" else args.rates))
        main = self._phase("main", args.rate, args.duration, pipeline, outcomes, publisher, chats)
        if args.no_search:
            return
        if main.sustained:
            ladder = [r for r in rates if r > args.rate]
        else:
            ladder = [r for r in reversed(rates) if r < args.rate]
        for rate in ladder:
            phase = self._phase("search", rate, args.step_duration, pipeline, outcomes, publisher, chats)
            if phase.sustained != main.sustained:
                break  # going up: the first rate it cannot keep; going down: the first it can

    def _phase(self, kind: str, rate: float, duration: float, pipeline: Pipeline, outcomes: Outcomes,
               publisher: Publisher, chats: Chats) -> Phase:
        args = self.args
        phase = Phase(self.stage, kind, rate, duration, latency_budget=args.latency_budget)
        tag = f"{self.stage[0]}{len(self.phases)}x"
        ids: list[str] = []
        start = time.monotonic()
        end = start + duration
        stop_sampling = threading.Event()

        def sample() -> None:  # the backlog (published - answered) every SAMPLE_EVERY seconds
            while not stop_sampling.is_set():
                now = time.monotonic()
                published = list(ids)
                phase.samples.append((now - start, len(published) - outcomes.done(published)))
                stop_sampling.wait(SAMPLE_EVERY)

        sampler = threading.Thread(target=sample, name="backlog-sampler", daemon=True)
        sampler.start()
        count = max(1, int(round(rate * duration)))
        try:
            for i in range(count):
                due = start + i / rate
                while (now := time.monotonic()) < due:
                    time.sleep(min(due - now, 0.05))
                phase.publish_lag_s = max(phase.publish_lag_s, time.monotonic() - due)
                chat_id, data = chats.take(tag)
                publisher.publish(chat_id, data)
                ids.append(chat_id)
                if not pipeline.alive():
                    raise RuntimeError(f"[{self.stage}] the pipeline exited during the phase")
            while (now := time.monotonic()) < end:
                time.sleep(min(0.05, end - now))
        finally:
            stop_sampling.set()
            sampler.join()
        phase.backlog_end = len(ids) - outcomes.done(ids)
        phase.samples.append((duration, phase.backlog_end))
        phase.backlog_mid = min(phase.samples, key=lambda s: abs(s[0] - duration / 2))[1]
        phase.in_window = outcomes.received_between(ids, start, end)
        publisher.confirm()
        drain_timeout = args.drain_timeout if kind == "main" else min(args.drain_timeout, args.step_drain_timeout)
        outcomes.wait_all(ids, end + drain_timeout, pipeline.alive)
        if not pipeline.alive():
            raise RuntimeError(f"[{self.stage}] the pipeline exited")
        now = time.monotonic()
        last = start
        phase.published = len(ids)
        for chat_id in ids:
            got = outcomes.get(chat_id)
            if got is None:
                phase.censored += 1
                phase.latencies.append(now - publisher.sent_at[chat_id])  # a lower bound
                continue
            arrived, what = got
            last = max(last, arrived)
            if what == "insight":
                phase.insights += 1
                phase.latencies.append(arrived - publisher.sent_at[chat_id])
            else:
                phase.dead_letters += 1
        phase.duplicates = sum(outcomes.repeats.get(c, 0) for c in ids)
        phase.drain_s = max(0.0, last - end) if not phase.censored else None
        phase.judge()
        self.phases.append(phase)
        f = phase.figures()
        say(f"[{self.stage}] {kind} {rate:g}/s x {duration:g} s: {phase.published} published, "
            f"{phase.insights} insights, {phase.dead_letters} dead, {phase.censored} unanswered; "
            f"p50 {fmt(f['p50_s'])} s p95 {fmt(f['p95_s'])} s; backlog {phase.backlog_mid}->{phase.backlog_end} "
            f"(growth {fmt(f['backlog_growth'], 1)}); "
            f"{'sustained' if phase.sustained else 'NOT sustained'}")
        if phase.censored:
            say(f"[{self.stage}] {phase.censored} chat(s) unanswered {drain_timeout:g} s after the phase: overload, "
                f"or the pipeline stalled (its log is kept: {pipeline.log_path})")
            self.keep_logs = True
            # what is still queued would distort the next phase: wait while answers still come (up to the
            # drain time again); a stalled pipeline answers nothing, and waiting longer would not help
            deadline, quiet = time.monotonic() + drain_timeout, max(30.0, args.latency_budget)
            done = outcomes.done(ids)
            while time.monotonic() < deadline and done < len(ids):
                if outcomes.wait_all(ids, min(deadline, time.monotonic() + quiet), pipeline.alive):
                    break
                now_done = outcomes.done(ids)
                if now_done == done:
                    say(f"[{self.stage}] nothing answered for {quiet:g} s: stalled, going on")
                    break
                done = now_done
        return phase

    # ---- summary ----
    @property
    def main(self) -> Phase | None:
        return next((p for p in self.phases if p.kind == "main"), None)

    def sustained_rate(self) -> tuple[float | None, bool]:
        """Highest rate sustained, and whether it is only a lower bound (every rate tried was sustained)."""
        kept = [p.rate for p in self.phases if p.sustained]
        if not kept:
            return None, False
        return max(kept), all(p.sustained for p in self.phases)

    def summary(self) -> dict:
        main = self.main
        figures = main.figures() if main else {}
        rate, lower_bound = self.sustained_rate()
        return {
            "throughput_per_s": figures.get("throughput_per_s"),
            "p50_s": figures.get("p50_s"), "p95_s": figures.get("p95_s"), "p99_s": figures.get("p99_s"),
            "max_s": figures.get("max_s"), "n": figures.get("published"), "censored": figures.get("censored"),
            "sustained_rate_per_s": rate, "sustained_rate_is_lower_bound": lower_bound,
            "ready_s": None if self.ready_s is None else round(self.ready_s, 1),
            "model_ids": self.model_ids, "duplicates": self.repeats,
            "phases": [{"kind": p.kind, **{k: v for k, v in p.figures().items() if k in PHASE_KEYS}}
                       for p in self.phases],
        }


# ---- output --------------------------------------------------------------------------------
def table(runs: list[StageRun]) -> str:
    header = (f"{'stage':<6} {'phase':<6} {'rate/s':>7} {'secs':>5} {'sent':>5} {'done':>5} {'dead':>4} "
              f"{'thru/s':>7} {'p50 s':>7} {'p95 s':>7} {'p99 s':>7} {'max s':>7} {'backlog':>9} {'growth':>6} "
              f"{'drain s':>7}  sustained")
    lines = [header, "-" * len(header)]
    for run in runs:
        for p in run.phases:
            f = p.figures()
            lines.append(
                f"{p.stage:<6} {p.kind:<6} {p.rate:>7g} {p.duration:>5g} {p.published:>5} "
                f"{p.insights + p.dead_letters:>5} {p.dead_letters:>4} {fmt(f['throughput_per_s'], 3):>7} "
                f"{fmt(f['p50_s']):>7} {fmt(f['p95_s']):>7} {fmt(f['p99_s']):>7} {fmt(f['max_s']):>7} "
                f"{f'{p.backlog_mid}->{p.backlog_end}':>9} {fmt(f['backlog_growth'], 1):>6} "
                f"{fmt(f['drain_s'], 1):>7}  "
                f"{'yes' if p.sustained else 'NO'}{f' ({p.censored} unanswered)' if p.censored else ''}")
    return "\n".join(lines)


def overhead(runs: dict[str, StageRun]) -> dict:
    if "gemma" not in runs or "noop" not in runs:
        return {}
    g, n = runs["gemma"].summary(), runs["noop"].summary()
    result: dict = {}
    for q in ("p50_s", "p95_s"):
        if g[q] and n[q] is not None:
            result[f"pipeline_share_of_{q[:3]}"] = round(n[q] / g[q], 4)
            result[f"model_{q[:3]}_s"] = round(g[q] - n[q], 3)
    if g["sustained_rate_per_s"] and n["sustained_rate_per_s"]:
        result["capacity_ratio_noop_over_gemma"] = round(n["sustained_rate_per_s"] / g["sustained_rate_per_s"], 2)
        bounds = (n["sustained_rate_is_lower_bound"], g["sustained_rate_is_lower_bound"])
        result["capacity_ratio_is"] = {(False, False): "estimate", (True, False): "lower_bound",
                                       (False, True): "upper_bound", (True, True): "unknown"}[bounds]
    return result


# ---- main ----------------------------------------------------------------------------------
def rates_list(text: str) -> list[float]:
    values = [float(x) for x in text.split(",") if x.strip()]
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError("need positive rates, comma-separated")
    return values


QUICK = {"duration": 40.0, "rates": [0.25], "noop_rates": [2.0, 8.0], "step_duration": 24.0, "warmup": 3,
         "drain_timeout": 90.0, "step_drain_timeout": 45.0}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from chatlens.simulate import DEMO_CHATS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=0.1,
                        help="main phase: chats published per second, every stage (default %(default)s)")
    parser.add_argument("--duration", type=float, default=80.0,
                        help="main phase: seconds of publishing (default %(default)s)")
    parser.add_argument("--rates", type=rates_list, default=[0.2, 0.3, 0.45, 0.7],
                        help="every stage but noop (gemma): rates (chats/s) for the sustained-rate search "
                             "(default 0.2,0.3,0.45,0.7)")
    parser.add_argument("--noop-rates", type=rates_list, default=[1.0, 2.0, 4.0, 8.0, 16.0],
                        help="noop: rates for its sustained-rate search (default 1,2,4,8,16)")
    parser.add_argument("--step-duration", type=float, default=40.0,
                        help="seconds of publishing per search phase (default %(default)s)")
    parser.add_argument("--latency-budget", type=float, default=30.0,
                        help="seconds: a sustained rate ends its phase with at most rate x this many chats "
                             "unanswered (default %(default)s)")
    parser.add_argument("--stages", default="gemma,noop",
                        help=f"which model stages (--model-stage) to run, in order, from {', '.join(STAGES)}; "
                             "a stage's own options go in --pipeline-args (default %(default)s)")
    parser.add_argument("--no-search", action="store_true", help="main phase only, no sustained-rate search")
    parser.add_argument("--warmup", type=int, default=5,
                        help="warm-up chats before the figures: 1, then a burst of the rest (default %(default)s)")
    parser.add_argument("--ready-timeout", type=float, default=900.0,
                        help="most seconds to wait for the first insight (model load) (default %(default)s)")
    parser.add_argument("--drain-timeout", type=float, default=180.0,
                        help="most seconds to wait after a main phase for its last outcome (default %(default)s)")
    parser.add_argument("--step-drain-timeout", type=float, default=90.0,
                        help="... after a search phase (default %(default)s)")
    parser.add_argument("--max-batch-size", type=int, default=8, help="pipeline option (default %(default)s)")
    parser.add_argument("--max-batch-duration-secs", type=int, default=1,
                        help="pipeline option (default %(default)s)")
    parser.add_argument("--model", default=None, help="pipeline --model (default: the pipeline's)")
    parser.add_argument("--model-cache", default=os.environ.get("CHATLENS_CACHE"),
                        help="pipeline --model-cache (default: CHATLENS_CACHE, else the pipeline's default)")
    parser.add_argument("--pipeline-args", default="", help="more `chatlens pipeline` arguments, one string")
    parser.add_argument("--data", type=Path, default=DEMO_CHATS, help="ChatWindows to publish (JSON Lines)")
    parser.add_argument("--seed", type=int, default=7, help="order of the chats (default %(default)s)")
    parser.add_argument("--keep-logs", type=Path, default=None, metavar="DIR",
                        help="copy the pipelines' logs here (deleted otherwise, unless a run fails or a chat "
                             "goes unanswered)")
    parser.add_argument("--quick", action="store_true",
                        help=f"shorter: main phase {QUICK['duration']:g} s, gemma search at "
                             f"{','.join(map(str, QUICK['rates']))}/s, noop at "
                             f"{','.join(map(str, QUICK['noop_rates']))}/s, {QUICK['step_duration']:g} s each")
    args = parser.parse_args(argv)
    apply_quick(args, argv, QUICK)
    args.stages = comma_choices(parser, "--stages", args.stages, STAGES)
    if args.rate <= 0 or args.duration <= 0 or args.step_duration <= 0:
        parser.error("--rate, --duration and --step-duration must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="chatlens-e2e-bench-"))
    started = time.monotonic()
    runs: dict[str, StageRun] = {}
    failed = False
    try:
        for stage in args.stages:
            runs[stage] = StageRun(stage, args, workdir).run()
    except KeyboardInterrupt:
        failed = True
        say("interrupted")
    except Exception as error:  # noqa: BLE001 - reported with the log kept
        failed = True
        say(f"failed: {error}")
    finally:
        keep = failed or any(run.keep_logs for run in runs.values())
        if args.keep_logs:
            args.keep_logs.mkdir(parents=True, exist_ok=True)
            for log in workdir.glob("pipeline-*.log"):
                shutil.copy(log, args.keep_logs / log.name)
        if keep and not args.keep_logs:
            say(f"pipeline logs kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    if not runs:
        return 1

    print(table(list(runs.values())))
    print()
    for stage, run in runs.items():
        s = run.summary()
        rate = s["sustained_rate_per_s"]
        if rate is None:
            sustained = "none of the rates tried"
        else:
            sustained = f"{'>= ' if s['sustained_rate_is_lower_bound'] else ''}{rate:g}/s"
        print(f"{stage:<6} ready in {fmt(s['ready_s'], 0)} s; at {args.rate:g}/s for {args.duration:g} s "
              f"({s['n']} chats): throughput {fmt(s['throughput_per_s'], 3)}/s, latency p50 {fmt(s['p50_s'])} s, "
              f"p95 {fmt(s['p95_s'])} s, p99 {fmt(s['p99_s'])} s; sustains {sustained} without the backlog growing")
    extra = overhead(runs)
    if extra:
        g, n = runs["gemma"].summary(), runs["noop"].summary()
        print(f"overhead: the pipeline without the model (noop) takes p50 {fmt(n['p50_s'])} s of gemma's "
              f"{fmt(g['p50_s'])} s ({100 * extra.get('pipeline_share_of_p50', 0):.1f}%); the model stage adds "
              f"~{fmt(extra.get('model_p50_s'))} s per chat at p50"
              + (f"; sustained rate noop/gemma {extra['capacity_ratio_noop_over_gemma']:g}x "
                 f"({extra['capacity_ratio_is'].replace('_', ' ')})"
                 if "capacity_ratio_noop_over_gemma" in extra else ""))
    summary = {
        "bench": "e2e", "rate_per_s": args.rate, "duration_s": args.duration, "quick": args.quick,
        "cpus": os.cpu_count(), "runner": "BundleBasedDirectRunner", "wall_s": round(time.monotonic() - started),
        **{stage: run.summary() for stage, run in runs.items()},
        "overhead": extra, "complete": not failed,
    }
    print(json.dumps(summary))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
