"""Reading from Pub/Sub: Beam's ReadFromPubSub, or on local runners a twin that acknowledges late.

The twin needs its evaluator in the BundleBasedDirectRunner's registry: call
`install_local_reader()` before running a pipeline built with `read_from_pubsub(local=True)`
(`chatlens pipeline` does). Importing this module changes nothing in Beam.
"""

from __future__ import annotations

import logging
import time

import apache_beam as beam
from apache_beam.utils.timestamp import Timestamp

from pipeline import compat
from pipeline.io.leases import LEASES

log = logging.getLogger(__name__)

PULL_BATCH = 10
PULL_TIMEOUT = 5.0


class LocalPubSubRead(compat.direct_pubsub_read_base()):
    """ReadFromPubSub(with_attributes=True) for local runners that acknowledges late (see Leases).

    The BundleBasedDirectRunner evaluates its Pub/Sub read with Beam's own evaluator, which
    pulls and acknowledges at once. `LeasingPubSubReadEvaluator` pulls the same way, with the
    same timestamps and watermark, but leases instead; `install_local_reader` registers it.
    Both sit on Beam internals, reached through `pipeline.compat` (pinned there).
    """

    def __init__(self, source, max_outstanding: int = 200):
        super().__init__(source)
        self.max_outstanding = max_outstanding


class LeasingPubSubReadEvaluator(compat.direct_pubsub_evaluator_base()):
    def read_messages(self, timestamp_attribute):
        if len(LEASES) >= self.transform.max_outstanding:
            time.sleep(0.2)  # back-pressure: wait for outcomes to be published
            return []
        client = self.subscriber_client()
        try:
            response = client.pull(subscription=self.subscription, max_messages=PULL_BATCH, timeout=PULL_TIMEOUT)
        except Exception as error:  # noqa: BLE001 - DEADLINE_EXCEEDED, UNAVAILABLE: poll again
            log.debug("pull from %s: %s", self.subscription, error)
            time.sleep(0.5)
            return []
        results = []
        for received in response.received_messages:
            message = compat.pubsub_message(received.message)
            timestamp = None
            if timestamp_attribute and timestamp_attribute in message.attributes:
                raw = message.attributes[timestamp_attribute]
                try:
                    timestamp = Timestamp(micros=int(raw) * 1000)
                except ValueError:
                    try:
                        timestamp = Timestamp.from_rfc3339(raw)
                    except ValueError:
                        log.warning("message %s: bad %s attribute %r; using its publish time",
                                    message.message_id, timestamp_attribute, raw)
            if timestamp is None:
                timestamp = Timestamp.from_utc_datetime(received.message.publish_time)
            results.append((timestamp, message))
        LEASES.hold(self.subscription, [(r.message.message_id, r.ack_id) for r in response.received_messages])
        return results


def install_local_reader() -> None:
    """Let the BundleBasedDirectRunner evaluate `LocalPubSubRead` (idempotent).

    Beam's evaluator registry is private and process-wide; registering from here rather
    than at import keeps every other use of Beam in the process untouched.
    """
    compat.register_direct_evaluator(LocalPubSubRead, LeasingPubSubReadEvaluator)


def read_from_pubsub(subscription: str, *, timestamp_attribute: str | None = None, local: bool = False,
                     max_outstanding: int = 200) -> beam.PTransform:
    """ReadFromPubSub with attributes; on local runners its twin that acknowledges after publishing
    (run it after `install_local_reader()`)."""
    read = beam.io.ReadFromPubSub(subscription=subscription, with_attributes=True,
                                  timestamp_attribute=timestamp_attribute)
    return LocalPubSubRead(compat.read_source(read), max_outstanding) if local else read
