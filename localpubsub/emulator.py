"""Run a local Pub/Sub server (gRPC, google.pubsub.v1) for development and tests.

Clients reach it with PUBSUB_EMULATOR_HOST=HOST:PORT, like Google's emulator; state
lives in memory and is lost on exit, unless `--data-dir DIR` keeps topics, subscriptions
and unacked messages there for the next start. SIGTERM or Ctrl-C stops it cleanly: open
StreamingPull calls end with UNAVAILABLE, so subscribers reconnect to the next one.

`--worst-case` delivers as badly as at-least-once allows (subscriptions without message
ordering): in a random order, and a share of messages (`--redeliver-share`) twice.

`--check [HOST:PORT]` serves nothing: it waits until a server answers ListTopics
there (exit 0) or `--timeout` passes (exit 1), as a readiness probe for scripts.
Use `-vv` to log every RPC.
"""

from __future__ import annotations

import argparse
import sys

from chatlens.stop_signals import StopSignals

_LIST_TOPICS = "/google.pubsub.v1.Publisher/ListTopics"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="localhost", help="interface to listen on (default localhost; 0.0.0.0: all)")
    parser.add_argument("--port", type=int, default=8085, help="port to listen on (default 8085; 0: any free one)")
    parser.add_argument(
        "--check",
        nargs="?",
        const="",
        metavar="HOST:PORT",
        help="only check that a server answers at HOST:PORT (default: --host:--port), then exit",
    )
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds --check waits for an answer (default 10)")
    parser.add_argument(
        "--stream-max-age",
        type=float,
        default=0.0,
        help="end each StreamingPull with UNAVAILABLE after this many seconds, as the real service does (0: never)",
    )
    parser.add_argument("--data-dir", metavar="DIR",
                        help="keep topics, subscriptions and unacked messages in DIR across restarts (default: memory)")
    parser.add_argument("--worst-case", action="store_true",
                        help="worst-case delivery, as at-least-once allows: subscriptions without message ordering "
                             "get messages out of order, and some twice")
    parser.add_argument("--redeliver-share", type=float, default=0.02, metavar="SHARE",
                        help="with --worst-case, the share of deliveries followed by a second copy (default 0.02)")
    parser.add_argument("--seed", type=int, help="with --worst-case, the random seed (default: a random one, printed)")


def run(args: argparse.Namespace) -> int:
    if args.check is not None:
        return check(args.check or f"{args.host}:{args.port}", args.timeout)
    worst_case = None
    if args.worst_case:
        import random

        from localpubsub.state import WorstCase

        seed = args.seed if args.seed is not None else random.randrange(2**31)
        try:
            worst_case = WorstCase(seed=seed, redeliver_share=args.redeliver_share)
        except ValueError as error:
            print(f"pubsub-emulator: {error}", file=sys.stderr)
            return 2
    return serve(args.host, args.port, stream_max_age=args.stream_max_age or None, worst_case=worst_case,
                 data_dir=args.data_dir)


def serve(host: str, port: int, *, stream_max_age: float | None = None, worst_case=None, data_dir=None) -> int:
    """Serve until SIGTERM or SIGINT."""
    from localpubsub.server import EmulatorServer

    with StopSignals() as stop:
        try:
            server = EmulatorServer(host, port, stream_max_age=stream_max_age, worst_case=worst_case,
                                    data_dir=data_dir)
            server.start()
        except (OSError, ValueError) as error:
            print(f"pubsub-emulator: {error}", file=sys.stderr)
            return 1
        print(f"Pub/Sub emulator listening on {server.address} (export PUBSUB_EMULATOR_HOST={server.address})", flush=True)
        if data_dir is not None:
            print(f"state kept in {data_dir}", flush=True)
        if worst_case is not None:
            print(f"worst-case delivery on (seed {worst_case.seed}, redeliver share {worst_case.redeliver_share:g})",
                  flush=True)
        stop.wait()
        print("Pub/Sub emulator stopping", flush=True)
        server.stop()
        if worst_case is not None:
            print(f"worst-case delivery: {server.worst_case_summary()}", flush=True)
        return 0


def wait_ready(address: str, timeout: float = 10.0) -> None:
    """Return once a Pub/Sub server at `address` answers ListTopics.

    Raises TimeoutError if none answers within `timeout` seconds, ConnectionError if
    something there answers with an error (e.g. not a Pub/Sub server).
    """
    import grpc
    from google.pubsub_v1 import types

    from chatlens.config import DEFAULT_PROJECT

    options = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 500)]
    with grpc.insecure_channel(address, options=options) as channel:
        list_topics = channel.unary_unary(
            _LIST_TOPICS,
            request_serializer=types.ListTopicsRequest.pb().SerializeToString,
            response_deserializer=types.ListTopicsResponse.pb().FromString,
        )
        request = types.ListTopicsRequest.pb()(project=f"projects/{DEFAULT_PROJECT}", page_size=1)
        try:
            list_topics(request, timeout=timeout, wait_for_ready=True)
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise TimeoutError(f"no Pub/Sub server answered at {address} within {timeout:g} s") from None
            raise ConnectionError(f"{address} answered ListTopics with {error.code().name}: {error.details()}") from None


def check(address: str, timeout: float) -> int:
    """The `--check` probe: 0 when ready, 1 (with the reason on stderr) otherwise."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        print(f"pubsub-emulator --check: expected HOST:PORT, got {address!r}", file=sys.stderr)
        return 2
    try:
        wait_ready(address, timeout)
    except (TimeoutError, ConnectionError) as error:
        print(f"pubsub-emulator --check: {error}", file=sys.stderr)
        return 1
    print(f"Pub/Sub emulator ready at {address}")
    return 0


def __getattr__(name: str):
    # The server pulls in grpc and protobuf; load it only when asked, so that
    # `chatlens --help` (which imports every command module) stays fast.
    if name == "EmulatorServer":
        from localpubsub.server import EmulatorServer

        return EmulatorServer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
