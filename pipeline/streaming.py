"""Run the streaming pipeline: Pub/Sub chats in, Gemma insights and dead letters out.

Reads ChatWindows (--mode windows) or ChatMessages (--mode messages, sessionised per
chat; publish the last message of a chat with the attribute closed=true to analyse it
at once) from a subscription, validates them against the contracts, drops redelivered
windows, analyses each with Gemma (sentiment, summary, and a reply draft for the chats
--reply-for selects), and publishes ChatInsights to the results topic and everything
that failed, with the reason, to the dead-letter topic.

Runs locally on BundleBasedDirectRunner by default (set PUBSUB_EMULATOR_HOST for the
local Pub/Sub server). Any argument not listed here is a Beam option and goes to
PipelineOptions as it is, e.g.:

  chatlens pipeline --runner DataflowRunner --project my-project --region europe-west1 \\
      --temp_location gs://my-bucket/tmp --sdk_container_image IMAGE \\
      --accelerator 'type:nvidia-l4;count:1;install-nvidia-driver'

SIGTERM or Ctrl-C stops it; what was read but not yet published is handed back to
Pub/Sub for redelivery (local runners acknowledge a message only after its insight
or dead letter is published).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading

from chatlens.stop_signals import StopSignals
from pipeline.options import PipelineConfig, add_pipeline_arguments, beam_options

log = logging.getLogger("chatlens.pipeline")

# How long a stop waits for the bundle in flight (a model batch can take minutes on a CPU)
# before handing its messages back anyway; they are redelivered, so nothing is lost.
STOP_GRACE_S = 10.0


# ---- argparse wiring ---------------------------------------------------------------------
def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_pipeline_arguments(parser)
    parser.add_argument("--status-every", type=float, default=15.0, metavar="SECS",
                        help="log a progress line to stderr this often (default 15; 0: never)")
    accept_beam_arguments(parser)


def accept_beam_arguments(parser: argparse.ArgumentParser) -> None:
    """Let `parser` collect the arguments it does not know into `args.beam_args`.

    The chatlens command parses with `parse_args`, which rejects unknown arguments; Beam
    options (--region, --temp_location, ...) are unknown to it by design. Subparsers call
    `parse_known_args`, so this parser keeps the leftovers for Beam instead of returning them.
    """
    parser.allow_abbrev = False  # `--proj` must not silently become `--project`
    parse_known_args = parser.parse_known_args

    def keep_unknown(args=None, namespace=None):
        namespace, unknown = parse_known_args(args, namespace)
        namespace.beam_args = list(getattr(namespace, "beam_args", None) or []) + unknown
        return namespace, []

    parser.parse_known_args = keep_unknown  # type: ignore[method-assign]


# ---- the command ---------------------------------------------------------------------------
def run(args: argparse.Namespace) -> int:
    try:
        config = PipelineConfig.from_args(args)
    except ValueError as error:
        print(f"chatlens pipeline: {error}", file=sys.stderr)
        return 2
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not logging.getLogger().isEnabledFor(logging.INFO):
        # progress lines, model loads and model switches show without -v
        for logger in (log, logging.getLogger("pipeline.model")):
            logger.setLevel(logging.INFO)
            if not logger.handlers:
                handler = logging.StreamHandler(sys.stderr)
                handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
                logger.addHandler(handler)
                logger.propagate = False
    code = run_pipeline(config, getattr(args, "beam_args", []), status_every=args.status_every)
    if config.local:
        # The DirectRunner's worker threads may be inside a bundle (a model call) and do not
        # stop on cancel(); what they were doing is handed back to Pub/Sub already.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def run_pipeline(config: PipelineConfig, beam_args: list[str], status_every: float = 15.0) -> int:
    import apache_beam as beam

    from pipeline.graph import build
    from pipeline.io.leases import LEASES
    from pipeline.io.pubsub_read import install_local_reader

    LEASES.lease_seconds = config.lease_secs
    if config.acks_after_publish:
        install_local_reader()
    options = beam_options(config, beam_args, streaming=True)
    pipeline = beam.Pipeline(options=options)
    build(pipeline, config)
    log.info("starting: mode=%s runner=%s subscription=%s results=%s deadletter=%s model=%s emulator=%s",
             config.mode, config.runner, config.subscription_path, config.results_topic_path,
             config.deadletter_topic_path, config.model, os.environ.get("PUBSUB_EMULATOR_HOST", "-"))
    finished = threading.Event()
    failure: list[BaseException] = []

    def wait():
        try:
            result.wait_until_finish()
        except BaseException as error:  # noqa: BLE001 - reported below
            failure.append(error)
        finally:
            finished.set()

    with StopSignals() as stop:
        result = pipeline.run()
        if not config.local:
            log.info("submitted to %s; state %s", config.runner, result.state)
            return 0
        threading.Thread(target=wait, name="chatlens-pipeline-wait", daemon=True).start()
        log.info("running; SIGTERM or Ctrl-C stops")
        last_status = ""
        while not stop.wait(status_every or None, until=finished):
            status = progress_line(result)
            if status != last_status:
                log.info("progress: %s", status)
                last_status = status
    if failure:
        log.error("pipeline failed: %s", failure[0])
    status = progress_line(result)
    if not _cancel(result, STOP_GRACE_S):
        log.info("a bundle still running after %.0f s is abandoned; its messages go back too", STOP_GRACE_S)
    returned = LEASES.release_all()
    log.info("stopping (%s): %s; %d unsettled message(s) handed back for redelivery",
             stop.name or "pipeline ended", status, returned)
    return 1 if failure else 0


def _cancel(result, grace_s: float) -> bool:
    """Stop scheduling bundles, waiting at most `grace_s` for the running one; True if it ended.

    The DirectRunner's cancel() joins its worker, which is inside a model call until the batch
    is done; the caller hands every unsettled message back either way.
    """

    def cancel():
        try:
            result.cancel()
        except Exception as error:  # noqa: BLE001 - already finished or failed
            log.debug("cancel: %s", error)

    stopper = threading.Thread(target=cancel, name="chatlens-pipeline-cancel", daemon=True)
    stopper.start()
    stopper.join(grace_s)
    return not stopper.is_alive()


def progress_line(result=None) -> str:
    """The chatlens counters and the lag, e.g. 'insights=20 dead_letters_validate=4 ... lag_ms_mean=5120'.

    Read from the in-process totals (pipeline.metrics.STATS): on the local runners
    Beam's own metrics only reflect each step's first bundle while streaming.
    """
    from pipeline.io.leases import LEASES
    from pipeline.metrics import STATS

    totals = STATS.counts()
    lag = STATS.distribution("insight_lag_ms")
    if lag:
        totals["lag_ms_mean"], totals["lag_ms_max"] = lag[1], lag[3]
    totals["in_flight"] = len(LEASES)
    return " ".join(f"{name}={value}" for name, value in sorted(totals.items()))
