"""`EmulatorServer`: the broker behind a gRPC server on one port, with a clean stop."""

from __future__ import annotations

import logging
from concurrent import futures

import grpc

from localpubsub.service import generic_handlers
from localpubsub.state import Broker, WorstCase

log = logging.getLogger("localpubsub.emulator")

_MAX_MESSAGE_BYTES = 32 * 1024 * 1024  # Publish requests may carry up to 10 MB of messages


class EmulatorServer:
    """A Pub/Sub-compatible gRPC server, in this process.

    `port=0` picks a free port; `address` then tells which. `broker` holds the state
    and can be seeded (e.g. `server.broker.create_topic(...)`) before `start()`.
    `worst_case` turns on worst-case delivery (see `state.WorstCase`); `data_dir` keeps
    topics, subscriptions and unacked messages there across restarts (see `storage`).
    Usable as a context manager.
    """

    def __init__(
        self,
        host: str = "localhost",
        port: int = 8085,
        *,
        max_workers: int = 128,
        pull_wait: float = 0.75,
        stream_max_age: float | None = None,
        worst_case: WorstCase | None = None,
        data_dir=None,
    ):
        self.host = host
        self.port = port
        # Every StreamingPull holds a worker thread; keep some for unary calls.
        self.broker = Broker(stream_max_age=stream_max_age, max_streams=max(1, max_workers - 16),
                             worst_case=worst_case, data_dir=data_dir)
        self._max_workers = max_workers
        self._pull_wait = pull_wait
        self._server: grpc.Server | None = None

    @property
    def address(self) -> str:
        """`host:port` for PUBSUB_EMULATOR_HOST (the bound port once started)."""
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{host}:{self.port}"

    def start(self) -> EmulatorServer:
        if self._server is not None:
            raise RuntimeError("EmulatorServer already started")
        if self.broker.closing:
            raise RuntimeError("a stopped EmulatorServer cannot be restarted; create a new one")
        try:
            return self._start()
        except BaseException:
            self.broker.close()  # lets go of its data directory
            raise

    def _start(self) -> EmulatorServer:
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix="pubsub-emulator"),
            handlers=generic_handlers(self.broker, self._pull_wait),
            options=[
                ("grpc.so_reuseport", 0),  # a second emulator on a busy port must fail, not share it
                ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
            ],
        )
        try:
            self.port = server.add_insecure_port(self.address)
        except RuntimeError as error:
            raise OSError(f"cannot listen on {self.address} (is the port in use?): {error}") from error
        self.broker.start()
        server.start()
        self._server = server
        log.info("Pub/Sub emulator listening on %s", self.address)
        return self

    def stop(self, grace: float | None = 5.0) -> None:
        """Stop taking calls, end streams and pulls with UNAVAILABLE (clients reconnect), stop.

        gRPC stops taking calls first: a call that arrives while the server shuts down is
        ended with CANCELLED (grpc/grpc#41785), which the Python subscriber treats as final.
        Ending the streams first would make every subscriber reconnect into that window.
        """
        server, self._server = self._server, None
        if server is None:
            return
        stopped = server.stop(grace)
        self.broker.shutdown()
        stopped.wait()
        self.broker.close()
        if self.broker.worst_case is not None:
            log.info("worst-case delivery: %s", self.worst_case_summary())
        log.info("Pub/Sub emulator on %s stopped", self.address)

    def worst_case_summary(self) -> str:
        stats = self.broker.delivery_stats()
        first = stats["first_deliveries"] or 1
        return (f"{stats['deliveries']} deliveries, {stats['first_deliveries']} first ones, "
                f"{stats['out_of_order']} of them out of order ({100 * stats['out_of_order'] / first:.1f}%), "
                f"{stats['duplicates']} spontaneous redeliveries ({100 * stats['duplicates'] / first:.1f}%)")

    def __enter__(self) -> EmulatorServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
