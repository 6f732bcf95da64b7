"""Deadline batching for the model stage, under typed keys (see BatchChats)."""

from __future__ import annotations

import bisect
import uuid

import apache_beam as beam
from apache_beam import typehints

LENGTH_BUCKET_BOUNDARIES = (256, 1024, 4096, 16384)  # characters of chat text

BATCH_KEY = typehints.Tuple[str, int]
"""(worker, length bucket): typed, so Beam picks a deterministic coder for the state key."""


def length_bucket(chat) -> int:
    """Which LENGTH_BUCKET_BOUNDARIES bucket a chat's text falls in."""
    return bisect.bisect_right(LENGTH_BUCKET_BOUNDARIES, chat.text_chars)


class _KeyByWorkerAndLength(beam.DoFn):
    """(worker, length bucket) keys: a worker's chats of similar length batch together."""

    def setup(self):
        self.worker = uuid.uuid4().hex

    def process(self, element):
        _route, (_origin, chat) = element
        yield (self.worker, length_bucket(chat)), element


class BatchChats(beam.PTransform):
    """Streaming batches for the model: up to `size` chats of similar length from one worker, or
    what has waited `max_wait_secs`; RunInference takes each as one batch (the stage's handler
    is `prebatched`).

    Beam's own deadline batching (`BatchElements(max_batch_duration_secs=...)`) keys its state by
    an untyped tuple, whose coder is not deterministic (Beam warns; on Dataflow state can be
    mis-routed); these keys are typed, so their coder is deterministic.
    """

    def __init__(self, size: int, max_wait_secs: float):
        super().__init__()
        self._size = size
        self._max_wait_secs = max_wait_secs

    def expand(self, chats):
        key = typehints.Tuple[BATCH_KEY, typehints.Any]
        return (chats
                | "Key" >> beam.ParDo(_KeyByWorkerAndLength()).with_output_types(key)
                | "Group" >> beam.GroupIntoBatches(self._size, max_buffering_duration_secs=self._max_wait_secs)
                | "Batches" >> beam.Values())
