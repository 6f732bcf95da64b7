"""The streaming ChatLens graph: Pub/Sub in, AnalyzeChats, Pub/Sub out. Wiring only."""

from __future__ import annotations

from typing import Any

import apache_beam as beam

from pipeline.io.publish import PublishFn, settle
from pipeline.io.pubsub_read import read_from_pubsub
from pipeline.options import PipelineConfig
from pipeline.transforms.analyze import AnalyzeChats
from pipeline.transforms.records import DEAD_LETTER, SETTLED, Envelope


def build(pipeline, config: PipelineConfig) -> dict[str, Any]:
    """Add the streaming ChatLens graph to `pipeline`; returns its named PCollections.

    With `config.acks_after_publish` the read is `LocalPubSubRead`: run the pipeline after
    `pipeline.io.pubsub_read.install_local_reader()`.
    """
    envelopes = (
        pipeline
        | "ReadFromPubSub" >> read_from_pubsub(
            config.subscription_path, timestamp_attribute=config.timestamp_attribute,
            local=config.acks_after_publish,
            max_outstanding=config.max_outstanding)
        | "Envelope" >> beam.Map(lambda message, ts=beam.DoFn.TimestampParam: Envelope.from_pubsub(message, ts))
    )
    outputs = envelopes | "AnalyzeChats" >> AnalyzeChats(config)
    _ = outputs["insights"] | "PublishInsights" >> beam.ParDo(PublishFn(config.results_topic_path, "insights"))
    _ = outputs[DEAD_LETTER] | "PublishDeadLetters" >> beam.ParDo(
        PublishFn(config.deadletter_topic_path, "dead_letters"))
    _ = outputs[SETTLED] | "SettleDuplicates" >> beam.Map(settle)
    return {"envelopes": envelopes, **outputs}
