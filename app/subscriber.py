"""Streaming-pull subscribers that keep running through Pub/Sub outages and report how they are.

Each `StreamSubscriber` owns one thread that opens a streaming pull and waits on its
future. The client library already retries transient errors inside the stream; when the
future ends with an error anyway (server gone for long, subscription missing) the thread
opens a new client and stream after a growing pause. While idle it probes the
subscription, so "reconnecting" is reported even while the library retries quietly.

A message is acked only after its row is committed; when the database fails it is nacked
(after a pause, so a dead database is not hammered) and Pub/Sub delivers it again, up to
the subscription's dead-letter policy (`chatlens.config.PubSubLayout.max_delivery_attempts`),
which then moves it aside: nothing is redelivered forever. While storing keeps failing
(`DEGRADED_AFTER` failures in a row, the last one recent) the subscriber reports itself
degraded, and /readyz with it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from app.crud.ingest import Outcome
from app.models import utcnow
from chatlens.contracts import MAX_PAYLOAD_BYTES

log = logging.getLogger(__name__)

Handler = Callable[..., Outcome]  # (data, *, message_id, attributes) -> Outcome
INITIAL_BACKOFF = 0.5
FAILED_MESSAGE_PAUSE = 1.0
DEGRADED_AFTER = 3
"""Failed outcomes in a row after which a subscriber is degraded (until one succeeds) ..."""
DEGRADED_FOR_SECONDS = 60.0
"""... or until this long after the last failure (nothing left to retry: Pub/Sub gave up on it)."""
MAX_RECEIVE_BYTES = MAX_PAYLOAD_BYTES + 4 * 1024 * 1024
"""gRPC receive limit of the channel to a local server: gRPC's default of 4 MiB would refuse any
larger message (Pub/Sub allows 10 MB, plus attributes and framing) and the stream would be
reopened, quietly, again and again, without the message ever being stored."""


@dataclass
class SubscriberStatus:
    """A snapshot of one subscriber, for /readyz, /metrics and the page's status light."""

    name: str
    subscription: str
    state: str = "starting"  # starting | running | reconnecting | stopped
    since: datetime = field(default_factory=utcnow)
    last_message_at: datetime | None = None
    last_error: str | None = None
    reconnects: int = 0
    received: int = 0
    outcomes: dict[str, int] = field(default_factory=lambda: {o.value: 0 for o in Outcome} | {"failed": 0})
    lag_seconds_last: float | None = None
    lag_seconds_sum: float = 0.0
    failing: int = 0  # failed outcomes since the last one that was not
    last_failed_at: datetime | None = None

    def degraded(self, now: datetime | None = None) -> bool:
        """Storing keeps failing: the last DEGRADED_AFTER outcomes failed, the last one recently."""
        if self.failing < DEGRADED_AFTER or self.last_failed_at is None:
            return False
        return ((now or utcnow()) - self.last_failed_at).total_seconds() < DEGRADED_FOR_SECONDS

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "subscription": self.subscription, "state": self.state,
            "since": self.since.isoformat(),
            "last_message_at": self.last_message_at.isoformat() if self.last_message_at else None,
            "last_error": self.last_error, "reconnects": self.reconnects, "received": self.received,
            "outcomes": dict(self.outcomes), "lag_seconds_last": self.lag_seconds_last,
            "failing": self.failing, "degraded": self.degraded(),
        }


def make_client_factory(emulator_host: str | None) -> Callable[[], Any]:
    """Build SubscriberClients for Google Cloud (ADC) or, given host:port, a local server."""

    def factory() -> Any:
        from google.cloud import pubsub_v1

        if not emulator_host:
            return pubsub_v1.SubscriberClient()
        import grpc
        from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

        channel = grpc.insecure_channel(emulator_host, options=[
            ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
            ("grpc.max_send_message_length", MAX_RECEIVE_BYTES),
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.min_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", 2000),
        ])
        return pubsub_v1.SubscriberClient(
            transport=SubscriberGrpcTransport(channel=channel, host=emulator_host),
            client_options={"api_endpoint": emulator_host},
        )

    return factory


class StreamSubscriber:
    """One subscription, one thread, one handler; `start()`, `stop()`, `status()`."""

    def __init__(self, name: str, subscription: str, handler: Handler,
                 client_factory: Callable[[], Any], *, max_messages: int = 200, workers: int = 4,
                 lease_seconds: int = 10, probe_seconds: float = 10.0, max_backoff: float = 30.0,
                 on_stored: Callable[[], None] | None = None) -> None:
        self._handler = handler
        self._client_factory = client_factory
        self._max_messages = max_messages
        self._lease_seconds = lease_seconds
        self._workers = workers
        self._probe_seconds = probe_seconds
        self._max_backoff = max_backoff
        self._on_stored = on_stored or (lambda: None)
        self._status = SubscriberStatus(name=name, subscription=subscription)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._future: Any = None
        self._thread: threading.Thread | None = None
        self._probe_supported = True
        self._probe_ok = True

    # -- life cycle ---------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"subscriber-{self._status.name}",
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop pulling, let in-flight messages finish (commit, then ack), nack the rest."""
        self._stopping.set()
        with self._lock:
            future = self._future
        if future is not None:
            future.cancel()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("subscriber %s did not stop within %.0fs", self._status.name, timeout)
        self._set_state("stopped")

    def status(self) -> SubscriberStatus:
        with self._lock:
            copy = SubscriberStatus(**{k: getattr(self._status, k) for k in self._status.__dataclass_fields__})
            copy.outcomes = dict(self._status.outcomes)
            return copy

    @property
    def running(self) -> bool:
        return self.status().state == "running"

    # -- internals ------------------------------------------------------------------------

    def _set_state(self, state: str, error: BaseException | str | None = None) -> None:
        with self._lock:
            if self._status.state != state:
                self._status.state = state
                self._status.since = utcnow()
            if error is not None:
                self._status.last_error = str(error)[:500] or type(error).__name__
            elif state == "running":
                self._status.last_error = None

    def _run(self) -> None:
        from google.cloud.pubsub_v1 import types
        from google.cloud.pubsub_v1.subscriber.scheduler import ThreadScheduler

        delay = INITIAL_BACKOFF
        while not self._stopping.is_set():
            client = None
            try:
                client = self._client_factory()
                executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=self._workers, thread_name_prefix=f"store-{self._status.name}")
                future = client.subscribe(
                    self._status.subscription, self._callback,
                    flow_control=types.FlowControl(max_messages=self._max_messages,
                                                   max_duration_per_lease_extension=self._lease_seconds),
                    scheduler=ThreadScheduler(executor=executor),
                    await_callbacks_on_shutdown=True,
                )
                with self._lock:
                    self._future = future
                if self._stopping.is_set():
                    future.cancel()
                self._set_state("running")
                while True:
                    try:
                        future.result(timeout=self._probe_seconds)
                        break  # cancelled by stop()
                    except concurrent.futures.TimeoutError:
                        self._probe(client)
                        if self._probe_ok:
                            delay = INITIAL_BACKOFF
            except Exception as error:  # noqa: BLE001 - any end of the stream means: open it again
                if self._stopping.is_set():
                    break
                with self._lock:
                    self._status.reconnects += 1
                self._set_state("reconnecting", error)
                log.warning("subscriber %s: stream ended (%s); reopening in %.1fs",
                            self._status.name, error, delay)
                self._stopping.wait(delay)
                delay = min(delay * 2, self._max_backoff)
            finally:
                with self._lock:
                    self._future = None
                if client is not None:
                    try:
                        client.close()
                    except Exception:  # noqa: BLE001 - closing a broken channel may complain
                        pass

    def _probe(self, client: Any) -> None:
        """While idle, ask Pub/Sub about the subscription: the only way to see a silent outage."""
        status = self.status()
        if not self._probe_supported or self._stopping.is_set():
            return
        if status.last_message_at and (utcnow() - status.last_message_at).total_seconds() < self._probe_seconds:
            return
        from google.api_core import exceptions

        try:
            client.get_subscription(request={"subscription": self._status.subscription},
                                    retry=None, timeout=min(5.0, self._probe_seconds))
            self._probe_ok = True
            self._set_state("running")
        except (exceptions.PermissionDenied, exceptions.MethodNotImplemented) as error:
            log.info("subscriber %s: cannot probe (%s); relying on the stream", self._status.name, error)
            self._probe_supported = False
        except Exception as error:  # noqa: BLE001 - unreachable, not found, timeout: all "not running"
            self._probe_ok = False
            self._set_state("reconnecting", error)

    def _callback(self, message: Any) -> None:
        received_at = utcnow()
        try:
            outcome = self._handler(message.data, message_id=message.message_id,
                                    attributes=dict(message.attributes))
        except Exception as error:  # noqa: BLE001 - database trouble: let Pub/Sub redeliver
            log.exception("subscriber %s: could not store message %s", self._status.name, message.message_id)
            with self._lock:
                self._status.outcomes["failed"] += 1
                self._status.failing += 1
                self._status.last_failed_at = utcnow()
                self._status.last_error = f"storing failed: {error}"[:500]
            self._stopping.wait(FAILED_MESSAGE_PAUSE)
            message.nack()
            return
        message.ack()
        lag = max(0.0, (received_at - message.publish_time).total_seconds()) if message.publish_time else None
        with self._lock:
            status = self._status
            status.received += 1
            status.outcomes[outcome.value] += 1
            status.failing = 0
            status.last_message_at = received_at
            if lag is not None:
                status.lag_seconds_last = lag
                status.lag_seconds_sum += lag
            if status.state != "running":
                status.state, status.since, status.last_error = "running", received_at, None
        self._probe_ok = True
        if outcome != Outcome.duplicate:
            self._on_stored()

