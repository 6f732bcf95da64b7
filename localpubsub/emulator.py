"""Run a local Pub/Sub server (gRPC, google.pubsub.v1) for development and tests.

Clients reach it with PUBSUB_EMULATOR_HOST=HOST:PORT, like Google's emulator; state
lives in memory and is lost on exit. SIGTERM or Ctrl-C stops it cleanly: open
StreamingPull calls end with UNAVAILABLE, so subscribers reconnect to the next one.

`--check [HOST:PORT]` serves nothing: it waits until a server answers ListTopics
there (exit 0) or `--timeout` passes (exit 1), as a readiness probe for scripts.
Use `-vv` to log every RPC.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

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


def run(args: argparse.Namespace) -> int:
    if args.check is not None:
        return check(args.check or f"{args.host}:{args.port}", args.timeout)
    return serve(args.host, args.port, stream_max_age=args.stream_max_age or None)


def serve(host: str, port: int, *, stream_max_age: float | None = None) -> int:
    """Serve until SIGTERM or SIGINT."""
    from localpubsub.server import EmulatorServer

    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)}
    server = EmulatorServer(host, port, stream_max_age=stream_max_age)
    try:
        try:
            server.start()
        except OSError as error:
            print(f"pubsub-emulator: {error}", file=sys.stderr)
            return 1
        print(f"Pub/Sub emulator listening on {server.address} (export PUBSUB_EMULATOR_HOST={server.address})", flush=True)
        stop.wait()
        print("Pub/Sub emulator stopping", flush=True)
        server.stop()
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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
