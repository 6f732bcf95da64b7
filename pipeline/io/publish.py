"""Publishing Outputs to Pub/Sub, and settling their inputs once Pub/Sub confirmed them."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import apache_beam as beam
from google.api_core import exceptions, retry

from pipeline.io.leases import LEASES
from pipeline.metrics import Counter
from pipeline.transforms.records import Output

log = logging.getLogger(__name__)

PUBLISH_TIMEOUT = 120.0
"""Seconds a bundle waits for Pub/Sub to confirm its messages before it fails (and is retried whole)."""

PUBLISH_RETRY = retry.Retry(
    initial=0.5, maximum=10.0, multiplier=2.0, timeout=PUBLISH_TIMEOUT,
    predicate=retry.if_exception_type(
        exceptions.NotFound, exceptions.ServiceUnavailable, exceptions.DeadlineExceeded,
        exceptions.InternalServerError, exceptions.Aborted, exceptions.Unknown, exceptions.ResourceExhausted))
"""The errors the client's own publish retry retries (less Cancelled), plus NotFound, backing off to
10 s (the client's default waits up to 60 s between tries): a Pub/Sub server that restarted serves no topics until its
layout is made again (the emulator forgets them, an operator re-creates one), and a bundle that gave up
at once would be retried by the runner only a few times before the pipeline fails."""


class PublishFn(beam.DoFn):
    """Publish Outputs to a topic; once Pub/Sub confirmed a bundle's messages, settle their sources."""

    def __init__(self, topic: str, kind: str):
        self._topic = topic
        self._kind = kind
        self._published = Counter(f"published_{kind}")
        self._client = None
        self._pending: list[tuple[Any, Output]] = []

    def setup(self):
        from google.cloud import pubsub_v1

        self._client = pubsub_v1.PublisherClient()

    def start_bundle(self):
        self._pending = []

    def process(self, output: Output):
        self._pending.append((self._client.publish(self._topic, output.data, retry=PUBLISH_RETRY,
                                                  **output.attributes), output))

    def finish_bundle(self):
        pending, self._pending = self._pending, []
        for future, output in pending:
            future.result(timeout=PUBLISH_TIMEOUT)  # raises: the bundle fails and nothing of it is acknowledged
            self._published.inc()
            message = output.message
            log.info("published %s %s %s", self._kind, getattr(message, "chat_id", None),
                     getattr(message, "window_id", None) or getattr(message, "stage", ""))
        LEASES.settle(s for _, output in pending for s in output.source_ids)

    def teardown(self):
        if self._client is not None:
            self._client.transport.close()


def settle(source_ids: Iterable[str]) -> None:
    """Acknowledge inputs that need no output of their own (duplicates)."""
    LEASES.settle(source_ids)
