"""Deduplication: a window already analysed within the TTL settles its inputs without a new insight."""

from __future__ import annotations

import logging

import apache_beam as beam
from apache_beam import pvalue, typehints
from apache_beam.coders import coders
from apache_beam.transforms import userstate
from apache_beam.utils.timestamp import Duration

from pipeline.metrics import Counter
from pipeline.transforms.records import SETTLED, TaggedWindow

log = logging.getLogger(__name__)


def window_key(tagged: TaggedWindow) -> tuple[str, TaggedWindow]:
    """Keyed by "chat_id/window_id" (ids cannot contain '/'): a string, whose coder is deterministic."""
    return f"{tagged.chat.chat_id}/{tagged.chat.window_id}", tagged


class DeduplicateWindows(beam.PTransform):
    """Drop windows whose (chat_id, window_id) was seen within the last `ttl_secs` of event time.

    A stateful DoFn keyed by `window_key`; an event-time timer at first sight + TTL
    forgets the key. Duplicates go to the `settled` output as the source ids they settle
    (acknowledged without a new result).
    """

    def __init__(self, ttl_secs: int):
        super().__init__()
        self._ttl = ttl_secs

    def expand(self, windows):
        return (
            windows
            | "KeyByWindow" >> beam.Map(window_key).with_output_types(typehints.Tuple[str, typehints.Any])
            | "FirstSeen" >> beam.ParDo(_DedupFn(self._ttl)).with_outputs(SETTLED, main="windows")
        )


class _DedupFn(beam.DoFn):
    SEEN = userstate.ReadModifyWriteStateSpec("seen", coders.BooleanCoder())
    EXPIRY = userstate.TimerSpec("expiry", userstate.TimeDomain.WATERMARK)

    def __init__(self, ttl_secs: int):
        self._ttl = Duration(seconds=ttl_secs)
        self.dropped = Counter("duplicates_dropped")

    def process(self, element, timestamp=beam.DoFn.TimestampParam, seen=beam.DoFn.StateParam(SEEN),
                expiry=beam.DoFn.TimerParam(EXPIRY)):
        _key, tagged = element
        if seen.read():
            self.dropped.inc()
            log.info("dropping duplicate window %s/%s", tagged.chat.chat_id, tagged.chat.window_id)
            yield pvalue.TaggedOutput(SETTLED, tagged.origin.source_ids)
            return
        seen.write(True)
        expiry.set(timestamp + self._ttl)
        yield tagged

    @userstate.on_timer(EXPIRY)
    def forget(self, seen=beam.DoFn.StateParam(SEEN)):
        seen.clear()
