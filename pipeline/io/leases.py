"""Leases on the input messages a local pipeline has read but not yet settled."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

log = logging.getLogger(__name__)

LEASE_SECONDS = 60
LEASE_RENEW_EVERY = 15.0


class Leases:
    """Input messages read but not yet settled, kept leased until their outcome is published.

    Beam's DirectRunner acknowledges Pub/Sub messages as soon as it pulls them, so a stop
    would lose whatever was in flight. `LocalPubSubRead` pulls without acknowledging and
    registers each message here; `PublishFn` acknowledges the source messages of an
    insight or dead letter only after Pub/Sub confirmed the publish. Until then a thread
    renews the leases. On shutdown, `release_all` hands unsettled messages back
    (deadline 0) so that the next run gets them at once: at-least-once delivery.
    On other runners nothing is registered and `settle` does nothing: the runner
    acknowledges once its checkpoint holds the message.
    """

    def __init__(self, lease_seconds: int = LEASE_SECONDS):
        self.lease_seconds = lease_seconds
        self._lock = threading.Lock()
        self._held: dict[str, tuple[str, str]] = {}  # Pub/Sub message id -> (subscription, ack id)
        self._client = None
        self._renewer: threading.Thread | None = None
        self._stopped = threading.Event()

    def _subscriber(self):
        with self._lock:
            if self._client is None:
                from google.cloud import pubsub_v1

                self._client = pubsub_v1.SubscriberClient()
            return self._client

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def hold(self, subscription: str, received: Iterable[tuple[str, str]]) -> None:
        """Lease (message id, ack id) pairs just pulled from `subscription`."""
        received = list(received)
        if not received:
            return
        if self._stopped.is_set():  # pulled while stopping: straight back to Pub/Sub
            self._modify(subscription, [ack_id for _, ack_id in received], 0)
            return
        with self._lock:
            for message_id, ack_id in received:
                self._held[message_id] = (subscription, ack_id)
        self._modify(subscription, [ack_id for _, ack_id in received], self.lease_seconds)
        self._start_renewer()

    def settle(self, message_ids: Iterable[str]) -> int:
        """Acknowledge these messages (ids not held are ignored); returns how many were held."""
        by_subscription: dict[str, list[str]] = {}
        message_ids = list(message_ids)
        with self._lock:
            for message_id in message_ids:
                held = self._held.pop(message_id, None)
                if held:
                    by_subscription.setdefault(held[0], []).append(held[1])
        log.debug("settling %s: %d held", message_ids, sum(map(len, by_subscription.values())))
        for subscription, ack_ids in by_subscription.items():
            for start in range(0, len(ack_ids), 1000):
                try:
                    self._subscriber().acknowledge(subscription=subscription, ack_ids=ack_ids[start:start + 1000])
                except Exception as error:  # noqa: BLE001 - the outcome is out; failing the bundle would resend it
                    log.warning("could not acknowledge %d message(s) (%s): Pub/Sub redelivers them and their "
                                "outcomes are published again", len(ack_ids[start:start + 1000]), error)
        return sum(map(len, by_subscription.values()))

    def release_all(self) -> int:
        """Hand every unsettled message back to Pub/Sub for immediate redelivery."""
        self._stopped.set()
        with self._lock:
            held, self._held = self._held, {}
        by_subscription: dict[str, list[str]] = {}
        for subscription, ack_id in held.values():
            by_subscription.setdefault(subscription, []).append(ack_id)
        for subscription, ack_ids in by_subscription.items():
            self._modify(subscription, ack_ids, 0)
        return len(held)

    def _modify(self, subscription: str, ack_ids: list[str], seconds: int) -> None:
        for start in range(0, len(ack_ids), 1000):
            try:
                self._subscriber().modify_ack_deadline(
                    subscription=subscription, ack_ids=ack_ids[start:start + 1000], ack_deadline_seconds=seconds)
            except Exception as error:  # noqa: BLE001 - an expired lease is redelivered anyway
                log.warning("could not set the ack deadline of %d message(s): %s", len(ack_ids), error)

    def _start_renewer(self) -> None:
        with self._lock:
            if self._renewer is not None:
                return
            self._renewer = threading.Thread(target=self._renew, name="chatlens-lease-renewer", daemon=True)
        self._renewer.start()

    def _renew(self) -> None:
        while not self._stopped.wait(min(LEASE_RENEW_EVERY, self.lease_seconds / 4)):
            with self._lock:
                held = list(self._held.values())
            by_subscription: dict[str, list[str]] = {}
            for subscription, ack_id in held:
                by_subscription.setdefault(subscription, []).append(ack_id)
            for subscription, ack_ids in by_subscription.items():
                self._modify(subscription, ack_ids, self.lease_seconds)


LEASES = Leases()
"""Process-wide on purpose: a local runner runs the read, the publish and the stop in one
process, and they meet only here (Beam constructs the read evaluator and the DoFns itself)."""
