"""The pipeline's transforms on Beam's BundleBasedDirectRunner, fed by TestStream.

Validation, dead letters, sessionisation (early, on-time, late and closed firings),
deduplication and insight building run without a model. The tests marked `slow` run
the model stages with the real GemmaModelHandler and the real Gemma 3 270M.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timedelta, timezone

import apache_beam as beam
import pytest
from apache_beam.testing.test_stream import TestStream as EventStream  # not collected by pytest
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import TimestampedValue
from tests.support.pipeline import (
    ANGRY_FIRST_MESSAGE,
    INJECTION_CHAT,
    RTL_CHAT,
    batch_test_pipeline,
    capture,
    drafted_or_answered,
    e2e_malformed,
    e2e_windows,
    expected_sentiment,
    message_json,
    run_inference_nodes,
    streaming_test_pipeline,
    window_json,
)

from chatlens.contracts import (
    MAX_PAYLOAD_BYTES,
    ChatInsight,
    SENTIMENT_LABELS,
    DeadLetter,
    parse_window,
)
from chatlens.replies import read_library
from pipeline.options import PipelineConfig
from pipeline.transforms.analyze import AnalyzeChats, AnalyzeWindows
from pipeline.transforms.batching import BatchChats
from pipeline.transforms.dead_letters import dead_letter, failed_batch_dead_letters
from pipeline.transforms.dedup import DeduplicateWindows
from pipeline.transforms.insights import build_insight, insight_attributes
from pipeline.transforms.records import DEAD_LETTER, SETTLED, Envelope, Origin
from pipeline.transforms.sessions import Sessionize, window_id_for
from pipeline.transforms.validate import ValidateMessages, ValidateWindows

pytestmark = pytest.mark.timeout(300)

NOW = int(time.time())  # event times near the wall clock: the lateness guard compares with it
T0 = datetime(2026, 11, 20, 9, 0, tzinfo=timezone.utc)


@pytest.fixture(autouse=True)
def _event_times_near_this_tests_start():
    """Each test's event times start from its own start, not the module's import: in a long run (CI's took
    40 minutes) times fixed at import age past the lateness guard and whole sessions are dead-lettered."""
    global NOW
    NOW = int(time.time())


def envelope(data: bytes, source_id: str, **attributes: str) -> Envelope:
    return Envelope(data=data, attributes=attributes, published_at=datetime.now(timezone.utc), source_id=source_id)


def at(seconds: float, value) -> TimestampedValue:
    return TimestampedValue(value, NOW + seconds)


def chat_message(chat_id: str, n: int, text: str = "hello", minutes: float | None = None, sender: str = "customer"
                 ) -> bytes:
    return message_json(chat_id, n, text, T0 + timedelta(minutes=n if minutes is None else minutes), sender,
                        "cust-1" if sender == "customer" else "agent-1")


# ---- validation and dead letters -----------------------------------------------------------
def test_windows_validate_and_malformed_input_goes_to_dead_letters():
    windows, malformed = e2e_windows(), e2e_malformed()
    oversized = window_json("big-001", [("customer", "x" * 7000)] * 10)  # 70 kB of text: over the 64 kB limit
    empty = window_json("empty-001", [("customer", "   "), ("agent", "\n")])
    not_utf8 = b"\xff\xfe{not json"
    bad = [*malformed, oversized, empty, not_utf8]
    stream = EventStream().advance_watermark_to(NOW)
    for i, data in enumerate([*windows, *bad]):
        stream = stream.add_elements([at(i, envelope(data, f"id-{i}", origin="test", n=str(i)))])
    stream = stream.advance_watermark_to_infinity()

    valid, dead = [], []
    with streaming_test_pipeline() as p:
        out = p | stream | ValidateWindows()
        assert_that(out.windows | beam.Map(lambda ow: ow[1].chat_id),
                    equal_to([json.loads(w)["chat_id"] for w in windows]), label="windows")
        capture(out.windows, valid, "valid")
        capture(out[DEAD_LETTER], dead, "dead")

    assert len(valid) == 24 and len(dead) == len(bad) == 7
    for origin, chat in valid:  # the Origin keeps what the insight and any dead letter need
        assert origin.chat_id == chat.chat_id and origin.window_id == chat.window_id
        assert parse_window(origin.payload) == chat and len(origin.source_ids) == 1
    by_payload = {output.message.payload: output for output in dead}
    assert set(by_payload) == set(bad)  # the original bytes, unchanged
    for output in dead:
        letter = output.message
        assert isinstance(letter, DeadLetter) and letter.stage == "validate"
        assert letter.attributes["origin"] == "test"  # the original attributes, unchanged
        assert output.attributes["stage"] == "validate" and len(output.source_ids) == 1
        DeadLetter.model_validate_json(output.data)  # publishable as is
    reasons = {letter.chat_id: letter.error_message for letter in (o.message for o in dead)}
    assert by_payload[malformed[0]].message.error_message.startswith("not JSON")  # no chat_id to claim
    assert "messages: Field required" in reasons["bad-002"]
    assert "at least 1 item" in reasons["bad-003"]
    assert "at most 200 items" in reasons["bad-004"]
    assert "more than the 65536 allowed" in reasons["big-001"]
    assert "no text to analyse" in reasons["empty-001"]
    assert by_payload[not_utf8].message.error_message.startswith("not JSON")
    assert "chat_id" not in by_payload[not_utf8].attributes and by_payload[oversized].attributes["chat_id"] == "big-001"


POISON = [b"[" * 100_000, b'{"chat_id": "p-1", "x": ' + b"[" * 5_000, b"1" * 5_000]
"""Inputs that made the validate step raise (RecursionError, ValueError) instead of dead-lettering:
the bundle failed, and a streaming runner retries a failed bundle forever (issue 32)."""


def test_poison_windows_are_dead_lettered_with_a_reason_and_the_rest_goes_on():
    windows = e2e_windows()[:4]
    stream = EventStream().advance_watermark_to(NOW)
    for i, data in enumerate([windows[0], *POISON[:2], windows[1], POISON[2], *windows[2:]]):
        stream = stream.add_elements([at(i, envelope(data, f"id-{i}"))])
    valid, dead = [], []
    with streaming_test_pipeline() as p:
        out = p | stream.advance_watermark_to_infinity() | ValidateWindows()
        capture(out.windows, valid, "valid", lambda ow: ow[1].chat_id)
        capture(out[DEAD_LETTER], dead, "dead",
                lambda o: (o.message.payload, o.message.chat_id, o.message.error_message))
    assert sorted(valid) == sorted(json.loads(w)["chat_id"] for w in windows)
    reasons = {payload: (chat_id, reason) for payload, chat_id, reason in dead}
    assert set(reasons) == set(POISON)
    assert reasons[POISON[0]] == (None, reasons[POISON[0]][1]) and "nested too deeply" in reasons[POISON[0]][1]
    assert "nested too deeply" in reasons[POISON[1]][1] and "not JSON" in reasons[POISON[2]][1]


def test_poison_messages_are_dead_lettered_and_their_chats_still_fire():
    stream = (
        EventStream().advance_watermark_to(NOW)
        .add_elements([at(1, envelope(chat_message("c1", 1), "p1")), at(2, envelope(POISON[0], "x1"))])
        .add_elements([at(3, envelope(POISON[1], "x2")), at(4, envelope(chat_message("c1", 2, sender="agent"), "p2"))])
        .add_elements([at(5, envelope(POISON[2], "x3"))])
        .advance_watermark_to_infinity()
    )
    fired, dead = sessionize(stream, count=100)
    assert [f[2] for f in fired if f[0] == "c1"][-1] == ids("c1", 1, 2)
    assert sorted(d[3] for d in dead) == [("x1",), ("x2",), ("x3",)]
    assert all(d[1] == "validate" for d in dead) and sum("nested too deeply" in d[2] for d in dead) == 2


def test_oversized_payload_is_dead_lettered_and_still_fits_a_pubsub_message():
    payload = b'{"chat_id": "huge-001", "padding": "' + b"x" * MAX_PAYLOAD_BYTES + b'"}'
    with batch_test_pipeline() as p:
        out = p | beam.Create([envelope(payload, "id-huge")]) | ValidateWindows()
        dead = out[DEAD_LETTER] | beam.Map(lambda o: (o.message.stage, o.message.chat_id,
                                                      o.message.error_message.split(",")[0], len(o.data)))
        assert_that(dead | beam.Map(lambda d: d[:3]),
                    equal_to([("validate", "huge-001", f"payload is {len(payload)} bytes")]))
        assert_that(dead | beam.Map(lambda d: d[3] < MAX_PAYLOAD_BYTES), equal_to([True]), label="fits")
    letter = dead_letter(payload, "validate", "ContractError", "too big", chat_id="huge-001")
    assert "payload cut from" in letter.message.error_message
    assert payload.startswith(letter.message.payload) and len(letter.data) < MAX_PAYLOAD_BYTES


def test_failed_inference_batches_become_one_dead_letter_per_window():
    chat = parse_window(e2e_windows()[0])
    origin = Origin(chat.chat_id, chat.window_id, e2e_windows()[0], {"a": "b"}, datetime.now(timezone.utc), ("m1",))
    try:
        raise MemoryError("out of memory while decoding")
    except MemoryError as error:
        failure = ([("*", (origin, chat)), ("*", (origin, chat))], (type(error), repr(error), ["traceback"]))
    letters = list(failed_batch_dead_letters(failure, "inference"))
    assert len(letters) == 2
    for output in letters:
        assert output.message.stage == "inference" and output.message.error_class == "MemoryError"
        assert "out of memory" in output.message.error_message and output.message.payload == e2e_windows()[0]
        assert output.attributes == {"stage": "inference", "error_class": "MemoryError", "schema_version": "1",
                                     "chat_id": "e2e-001", "source_key": f"m1@{origin.published_at.isoformat()}"}
        assert output.source_ids == ("m1",)


def test_streaming_batches_hold_chats_of_similar_length_up_to_the_size_and_lose_none():
    """BatchChats (the model stage's deadline batching): every chat comes out once, in batches
    of at most `size`, a long chat never batched with short ones."""
    short = [parse_window(w) for w in e2e_windows()[:5]]
    long_chat = short[0].model_copy(update={"chat_id": "long", "messages": [
        m.model_copy(update={"text": m.text * 200}) for m in short[0].messages]})
    chats = [("*", (f"origin-{c.chat_id}", c)) for c in [*short, long_chat]]
    batches = []
    stream = (EventStream().advance_watermark_to(0).add_elements([TimestampedValue(c, 0) for c in chats])
              .advance_processing_time(5).advance_watermark_to_infinity())
    with streaming_test_pipeline() as p:
        capture(p | stream | BatchChats(2, 1), batches, "batches", lambda b: sorted(c[1][1].chat_id for c in b))
    assert sorted(c for batch in batches for c in batch) == sorted(c[1][1].chat_id for c in chats)
    assert all(len(batch) <= 2 for batch in batches) and ["long"] in batches, batches


# ---- messages mode: sessions -----------------------------------------------------------
def sessionize(stream, *, gap=600, count=3, secs=3600, lateness=3600):
    """Validate + Sessionize, capturing (chat_id, window_id, message ids, closed) per firing."""
    fired, dead = [], []
    with streaming_test_pipeline() as p:
        events = p | stream | ValidateMessages(count, gap, lateness)
        sessions = events.events | Sessionize(gap, count, secs, lateness)
        capture(sessions["windows"], fired, "windows",
                lambda ow: (ow[1].chat_id, ow[1].window_id, [m.message_id for m in ow[1].messages], ow[1].closed,
                            ow[0].source_ids, window_id_for(ow[1].messages)))
        capture([events[DEAD_LETTER], sessions[DEAD_LETTER]] | beam.Flatten(), dead, "dead",
                lambda o: (o.message.chat_id, o.message.stage, o.message.error_message, o.source_ids))
    return fired, dead


def ids(chat_id, *numbers):
    return [f"{chat_id}-m{n:02d}" for n in numbers]


def test_sessions_fire_early_as_a_chat_grows_then_on_time_accumulating():
    stream = (
        EventStream().advance_watermark_to(NOW)
        # arrival order differs from sent_at order; message 2 is redelivered
        .add_elements([at(1, envelope(chat_message("c1", 2), "p2")), at(2, envelope(chat_message("c1", 1), "p1"))])
        .add_elements([at(3, envelope(chat_message("c1", 2), "p2-again"))])
        .add_elements([at(4, envelope(chat_message("c1", 4), "p4")), at(5, envelope(chat_message("c1", 3), "p3"))])
        .add_elements([at(6, envelope(chat_message("c2", 1), "q1"))])
        .advance_watermark_to(NOW + 700)  # past both sessions' ends (gap 600)
        .advance_watermark_to_infinity()
    )
    fired, dead = sessionize(stream)
    assert not dead
    c1 = [f for f in fired if f[0] == "c1"]
    # early after 3 elements (two copies of m02 count), again after the next ones, then on time;
    # every firing holds the whole chat so far, sorted by sent_at, without duplicates
    assert [f[2] for f in c1][0] == ids("c1", 1, 2)
    assert c1[-1][2] == ids("c1", 1, 2, 3, 4)
    for _, window_id, message_ids, closed, _sources, recomputed in c1:
        assert message_ids == sorted(set(message_ids)) and not closed
        assert window_id.startswith(f"s20261120T090100Z-n{len(message_ids)}-") and window_id == recomputed
    assert len({f[1] for f in c1}) == len({tuple(f[2]) for f in c1})  # window_id follows content
    assert set(c1[-1][4]) >= {"p1", "p3", "p4"} and set(c1[-1][4]) & {"p2", "p2-again"}
    c2 = [f for f in fired if f[0] == "c2"]
    assert [f[2] for f in c2] == [ids("c2", 1)]  # a one-message chat fires on time


def test_early_firing_after_processing_time():
    stream = (
        EventStream().advance_watermark_to(NOW)
        .add_elements([at(1, envelope(chat_message("c1", 1), "p1"))])
        .advance_processing_time(20)  # early-fire-secs is 10: fires without more messages
        .add_elements([at(2, envelope(chat_message("c1", 2, sender="agent"), "p2"))])
        .advance_processing_time(20)
        .advance_watermark_to_infinity()
    )
    fired, dead = sessionize(stream, count=100, secs=10)
    assert not dead
    assert [f[2] for f in fired][:2] == [ids("c1", 1), ids("c1", 1, 2)]


def test_closed_chat_fires_at_once_and_is_marked_closed():
    stream = (
        EventStream().advance_watermark_to(NOW)
        .add_elements([at(1, envelope(chat_message("c1", 1), "p1"))])
        .add_elements([at(2, envelope(chat_message("c1", 2, sender="agent"), "p2", closed="true"))])
        # no watermark progress, no processing time: only `closed` can fire it now
        .add_elements([at(3, envelope(chat_message("c9", 1), "x1"))])
        .advance_watermark_to_infinity()
    )
    fired, dead = sessionize(stream, count=50, secs=3600)
    assert not dead
    c1 = [f for f in fired if f[0] == "c1"]
    assert c1[0][2] == ids("c1", 1, 2) and c1[0][3] is True  # the closing firing comes first
    assert all(f[2] == ids("c1", 1, 2) and f[3] for f in c1)  # later ones (on time) repeat it: same window_id
    assert len({f[1] for f in c1}) == 1


def test_late_messages_update_the_session_and_too_late_ones_are_dead_lettered():
    stream = (
        EventStream().advance_watermark_to(NOW - 2000)
        .add_elements([at(-2000, envelope(chat_message("c1", 1), "p1")),
                       at(-1990, envelope(chat_message("c1", 2, sender="agent"), "p2"))])
        .advance_watermark_to(NOW - 1000)  # the session [-2000, -1390) is complete: fires on time
        .add_elements([at(-1980, envelope(chat_message("c1", 3), "p3"))])  # late, within the lateness
        .add_elements([at(-9000, envelope(chat_message("c2", 1), "q1"))])  # older than gap + lateness
        .advance_watermark_to_infinity()
    )
    fired, dead = sessionize(stream, count=100, secs=3600, gap=600, lateness=3600)
    c1 = [f[2] for f in fired if f[0] == "c1"]
    assert c1 == [ids("c1", 1, 2), ids("c1", 1, 2, 3)]  # on time, then late with the whole chat
    assert [(d[0], d[1], d[3]) for d in dead] == [("c2", "validate", ("q1",))]
    assert "older than the session gap plus the allowed lateness" in dead[0][2]


def test_empty_and_customerless_sessions_wait_for_text_then_dead_letter():
    stream = (
        EventStream().advance_watermark_to(NOW)
        .add_elements([at(1, envelope(chat_message("c1", 1, text="  "), "p1"))])  # early firing: skipped
        .add_elements([at(2, envelope(chat_message("c1", 2, text="ok now"), "p2"))])
        .add_elements([at(3, envelope(chat_message("c2", 1, text=" \n "), "q1"))])
        .add_elements([at(4, envelope(chat_message("c2", 2, text=""), "q2"))])
        .add_elements([at(5, envelope(chat_message("c3", 1, text="agent only", sender="agent"), "r1"))])
        .advance_watermark_to_infinity()
    )
    fired, dead = sessionize(stream, count=1)
    assert [f[2] for f in fired if f[0] == "c1"][-1] == ids("c1", 1, 2)
    assert not [f for f in fired if f[0] in ("c2", "c3")]
    reasons = {d[0]: d for d in dead}
    assert set(reasons) == {"c2", "c3"}
    assert "no text to analyse" in reasons["c2"][2] and set(reasons["c2"][3]) == {"q1", "q2"}
    assert "no customer message" in reasons["c3"][2]


def test_unicode_rtl_and_injection_text_survive_sessions_unchanged():
    texts = [text for _, text in RTL_CHAT + INJECTION_CHAT]
    stream = EventStream().advance_watermark_to(NOW)
    for n, text in enumerate(texts, 1):
        stream = stream.add_elements([at(n, envelope(chat_message("u1", n, text=text), f"p{n}"))])
    stream = stream.advance_watermark_to_infinity()
    windows = []
    with streaming_test_pipeline() as p:
        events = p | stream | ValidateMessages(100, 600, 3600)
        sessions = events.events | Sessionize(600, 100, 3600, 3600)
        capture(sessions["windows"], windows, "w", lambda ow: ow[1])
    assert [m.text for m in windows[-1].messages] == texts


# ---- deduplication ----------------------------------------------------------------------
def test_redelivered_windows_are_dropped_within_the_ttl_and_settled():
    first, again = e2e_windows()[:2]
    stream = (
        EventStream().advance_watermark_to(NOW)
        .add_elements([at(0, envelope(first, "a")), at(1, envelope(again, "b"))])
        .add_elements([at(2, envelope(first, "a-redelivered"))])  # same chat_id/window_id
        .advance_watermark_to(NOW + 30)
        .add_elements([at(30, envelope(first, "a-again"))])  # still within the 60 s TTL
        .advance_watermark_to(NOW + 200)  # the TTL has passed: forgotten
        .add_elements([at(200, envelope(first, "a-much-later"))])
        .advance_watermark_to_infinity()
    )
    with streaming_test_pipeline() as p:
        deduped = (p | stream | ValidateWindows()).windows | DeduplicateWindows(ttl_secs=60)
        assert_that(deduped.windows | beam.Map(lambda ow: (ow[1].chat_id, ow[0].source_ids)),
                    equal_to([("e2e-001", ("a",)), ("e2e-002", ("b",)), ("e2e-001", ("a-much-later",))]))
        assert_that(deduped[SETTLED], equal_to([("a-redelivered",), ("a-again",)]), label="settled")


# ---- insights ---------------------------------------------------------------------------
def test_insight_carries_the_window_the_analysis_and_the_publish_time():
    from pipeline.model.types import WindowAnalysis

    chat = parse_window(window_json("rtl-001", RTL_CHAT, tenant="acme", language="ar", closed=True))
    published = datetime(2026, 11, 21, 8, 0, tzinfo=timezone.utc)
    origin = Origin(chat.chat_id, chat.window_id, b"raw", {}, published, ("m1",), ("window_truncated:3",))
    analysis = WindowAnalysis(scores=(0.7, 0.2, 0.1), summary="Customer is angry.", model_id="gemma3-270m-q4",
                              prompt_version="completion-v3", flags=("summary_retried",), reply_draft="Sorry!")
    insight = build_insight(origin, chat, analysis)
    ChatInsight.model_validate_json(insight.model_dump_json())
    assert insight.sentiment == -1 and insight.confidence == pytest.approx(0.7)
    assert insight.transcript == chat.messages and insight.closed and insight.tenant == "acme"
    assert insight.published_at == published and insight.analyzed_at >= published
    assert insight.flags == ["window_truncated:3", "summary_retried"] and insight.reply_draft == "Sorry!"
    assert insight_attributes(insight) == {"chat_id": "rtl-001", "window_id": "w1", "sentiment": "negative",
                                           "schema_version": "1", "tenant": "acme", "closed": "true"}


# ---- options and the graph ---------------------------------------------------------------
def test_pipeline_options_defaults_validation_and_beam_pass_through():
    import argparse

    from apache_beam.options.pipeline_options import GoogleCloudOptions, StandardOptions

    from chatlens.config import LAYOUT
    from pipeline.options import beam_options, chatlens_options_class
    from pipeline.streaming import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args, rest = parser.parse_known_args(["--mode", "messages", "--region", "europe-west1",
                                          "--temp_location=gs://bucket/tmp", "--reply-for", "all"])
    assert rest == [] and args.beam_args == ["--region", "europe-west1", "--temp_location=gs://bucket/tmp"]
    config = PipelineConfig.from_args(args)
    assert config.subscription == LAYOUT.messages_subscription and config.reply_for == "all"
    assert config.subscription_path == f"projects/{config.project}/subscriptions/{LAYOUT.messages_subscription}"
    assert config.results_topic_path.endswith(f"/topics/{LAYOUT.insights_topic}") and config.local
    options = beam_options(config, args.beam_args)
    assert options.view_as(StandardOptions).streaming and options.view_as(GoogleCloudOptions).region == "europe-west1"
    assert options.view_as(chatlens_options_class()).reply_for == "all"
    with pytest.raises(ValueError, match="at least 6 characters"):
        PipelineConfig(project="short")
    with pytest.raises(ValueError, match="min-batch-size"):
        PipelineConfig(project="chatlens-test", min_batch_size=4, max_batch_size=2)


def test_graph_has_one_model_stage_with_the_shared_model_and_resource_hints():
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.graph import build

    config = PipelineConfig(project="chatlens-test", runner="DataflowRunner", accelerator="type:nvidia-l4;count:1",
                            min_ram="16GB")
    pipeline = beam.Pipeline(options=PipelineOptions(streaming=True, project="chatlens-test"))
    outputs = build(pipeline, config)
    assert set(outputs) == {"envelopes", "insights", DEAD_LETTER, SETTLED}
    stages = run_inference_nodes(pipeline)
    assert [node.full_label.rsplit("/", 1)[1] for node in stages] == ["Analyze"]  # replies in the same stage
    assert {node.transform._model_tag for node in stages} == {config.model_tag}
    for node in stages:
        assert node.resource_hints == {"beam:resources:accelerator:v1": b"type:nvidia-l4;count:1",
                                       "beam:resources:min_ram_bytes:v1": b"16000000000"}


# ---- the model stages, with the real model ---------------------------------------------
@pytest.fixture(scope="module")
def real_handler(gemma_source, model_cache):
    """The model stage of the real Gemma 3 270M, converted once (one engine in this process)."""
    from pipeline.model.backends.base import ModelOptions
    from pipeline.model.backends.keyed import ModelBackend

    options = ModelOptions(model="gemma3-270m", model_cache=str(model_cache), max_batch_size=8, max_batch_duration_secs=2)
    return ModelBackend(model_options=options, large_model=False)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_analyze_windows_with_the_real_model(real_handler):
    windows = e2e_windows()
    picked = [windows[i] for i in (0, 1, 8, 9, 16, 17)]  # 2 angry, 2 neutral, 2 happy
    extra = [window_json("rtl-001", RTL_CHAT, language="ar"), window_json("inj-001", INJECTION_CHAT),
             window_json("solo-001", [("customer", ANGRY_FIRST_MESSAGE)])]  # no agent yet: a macro is picked
    stream = (EventStream().advance_watermark_to(NOW)
              .add_elements([at(i, envelope(data, f"id-{i}")) for i, data in enumerate([*picked, *extra])])
              .advance_processing_time(5)  # the batching deadline
              .advance_watermark_to_infinity())
    insights, dead = [], []
    started = time.monotonic()
    with streaming_test_pipeline() as p:
        valid = p | stream | ValidateWindows()
        out = valid.windows | AnalyzeWindows(real_handler, model_tag="test-shared-model")
        capture(out["insights"], insights, "insights")
        capture(out[DEAD_LETTER], dead, "dead")
    print(f"analysed {len(insights)} windows in {time.monotonic() - started:.1f} s")
    assert not dead, [d.message for d in dead]
    assert sorted(o.message.chat_id for o in insights) == sorted(
        [json.loads(w)["chat_id"] for w in [*picked, *extra]])
    by_chat = {o.message.chat_id: o for o in insights}
    drafted_in = {macro.language for macro in read_library().macros}  # a chat in another language: no draft, flagged
    for data in [*picked, *extra]:
        chat = parse_window(data)
        output = by_chat[chat.chat_id]
        insight = output.message
        ChatInsight.model_validate_json(output.data)
        assert insight.transcript == chat.messages  # unicode, RTL and injection text untouched
        assert insight.summary and insight.model_id and insight.prompt_version
        assert output.source_ids == (f"id-{[*picked, *extra].index(data)}",)
        assert output.attributes["sentiment"] == SENTIMENT_LABELS[insight.sentiment]
        if insight.sentiment == -1:  # a draft, or the reason why not
            assert drafted_or_answered(insight) or "reply_empty" in insight.flags or (
                "no_macro" in insight.flags and chat.language not in drafted_in), insight
        else:
            assert insight.reply_draft is None and "agent_answered" not in insight.flags
    for data in picked[:2]:  # the clearly angry chats are negative; an agent has answered them: no draft
        insight = by_chat[json.loads(data)["chat_id"]].message
        assert insight.sentiment == expected_sentiment(data) and "agent_answered" in insight.flags
    solo = by_chat["solo-001"].message
    assert solo.sentiment == -1 and "reply_from_library" in solo.flags  # a macro: offered, or withheld as unsure
    assert bool(solo.reply_draft) != ("draft_withheld" in solo.flags) and solo.reply_confidence is not None


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_tenants_with_their_own_model_get_it(real_handler, second_preset, gemma_source):
    """--tenant-models: Beam's KeyedModelHandler routes quickbite's chats to the second preset."""
    from dataclasses import replace

    stage = replace(real_handler, tenant_models=(("quickbite", str(second_preset)),), max_models_per_worker=2,
                    model_options=replace(real_handler.model_options, reply_for="none"))
    windows = [window_json(f"t-{tenant}-{n}", [("customer", text)], tenant=tenant)
               for n, (tenant, text) in enumerate([("quickbite", "My pizza arrived cold and late."),
                                                   ("telnova", "Thanks, the router works now!"),
                                                   ("quickbite", "Can I change my delivery address?"),
                                                   ("skyway", "Where do I find my boarding pass?")])]
    windows.append(window_json("t-none", [("customer", "Hello, what are your opening hours?")]))
    stream = (EventStream().advance_watermark_to(NOW)
              .add_elements([at(i, envelope(data, f"id-{i}")) for i, data in enumerate(windows)])
              .advance_processing_time(5).advance_watermark_to_infinity())
    insights, dead = [], []
    with streaming_test_pipeline() as p:
        valid = p | stream | ValidateWindows()
        out = valid.windows | AnalyzeWindows(stage, model_tag="test-tenant-models")
        capture(out["insights"], insights, "insights", lambda o: o.message)
        capture(out[DEAD_LETTER], dead, "dead")
    assert not dead, [d.message for d in dead]
    models = {insight.chat_id: (insight.tenant, insight.model_id) for insight in insights}
    default_id = f"{gemma_source.model_id}+int8"  # both tuned models served in int8
    assert models == {"t-quickbite-0": ("quickbite", "gemma3-270m-second+int8"),
                      "t-telnova-1": ("telnova", default_id),
                      "t-quickbite-2": ("quickbite", "gemma3-270m-second+int8"),
                      "t-skyway-3": ("skyway", default_id),
                      "t-none": (None, default_id)}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_messages_mode_graph_with_the_real_model(real_handler):
    config = PipelineConfig(
        project="chatlens-test", mode="messages", model=real_handler.model_options.model,
        model_cache=real_handler.model_options.model_cache,
        max_batch_size=4, max_batch_duration_secs=0, reply_for="all", session_gap_secs=600, early_fire_count=3,
        early_fire_secs=3600, dedup_ttl_secs=3600, model_sharing="process", model_tag="test-shared-model-2",
    )
    stream = EventStream().advance_watermark_to(NOW)
    stream = stream.add_elements([at(1, envelope(chat_message("s1", 1, "my parcel never arrived"), "p1"))])
    stream = stream.add_elements([at(2, envelope(chat_message("s1", 2, "sorry, checking", sender="agent"), "p2",
                                                 closed="true"))])
    stream = stream.add_elements([at(3, envelope(chat_message("s1", 2, "sorry, checking", sender="agent"), "p2"))])
    stream = stream.add_elements([at(4, envelope(b"{oops", "bad"))]).advance_watermark_to_infinity()
    insights, dead, settled = [], [], []
    with streaming_test_pipeline() as p:
        out = p | stream | AnalyzeChats(config)
        capture(out["insights"], insights, "i", lambda o: o.message)
        capture(out[DEAD_LETTER], dead, "d", lambda o: (o.message.stage, o.source_ids))
        capture(out[SETTLED], settled, "s")
    # the closing firing and the on-time one hold the same messages: one insight
    assert [(i.chat_id, [m.message_id for m in i.transcript], i.closed) for i in insights] == [
        ("s1", ids("s1", 1, 2), True)]
    assert drafted_or_answered(insights[0]) and dead == [("validate", ("bad",))] and settled


# ---- the noop model stage (bench/e2e.py's baseline) ----------------------------------------
def test_model_stage_noop_option_and_baseline_handler():
    import argparse

    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.model.types import WindowAnalysis
    from pipeline.model.backends.noop.handler import NOOP_FLAG, NOOP_MODEL_ID, NoopModelHandler
    from pipeline.options import beam_options, chatlens_options_class
    from pipeline.graph import build
    from pipeline.streaming import add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert PipelineConfig.from_args(parser.parse_args([])).model_stage == "gemma"  # never the default
    config = PipelineConfig.from_args(parser.parse_args(["--model-stage", "noop"]))
    assert config.model_stage == "noop"
    assert beam_options(config).view_as(chatlens_options_class()).model_stage == "noop"
    with pytest.raises(SystemExit):
        parser.parse_args(["--model-stage", "fast"])
    with pytest.raises(ValueError, match="model-stage"):
        PipelineConfig(project="chatlens-test", model_stage="fast")

    chat = parse_window(e2e_windows()[0])
    handler = NoopModelHandler(large_model=False)
    [result] = handler.run_inference([chat], handler.load_model())
    analysis = result.inference
    assert isinstance(analysis, WindowAnalysis) and analysis.sentiment == 0 and sum(analysis.scores) == 1
    assert analysis.model_id == NOOP_MODEL_ID and NOOP_FLAG in analysis.flags and analysis.summary
    origin = Origin(chat.chat_id, chat.window_id, b"raw", {}, datetime.now(timezone.utc))
    insight = build_insight(origin, chat, analysis)
    ChatInsight.model_validate_json(insight.model_dump_json())
    assert insight.sentiment == 0 and insight.model_id == NOOP_MODEL_ID and NOOP_FLAG in insight.flags
    assert analysis.reply_draft is None  # neutral: --reply-for negative drafts nothing
    reply = NoopModelHandler(large_model=False, reply_for="all")
    [drafted] = reply.run_inference([chat], reply.load_model())
    assert drafted.inference.reply_draft and drafted.inference.scores == analysis.scores

    # in the graph: the model stage runs the baseline, under a tag of its own
    pipeline = beam.Pipeline(options=PipelineOptions(streaming=True, project="chatlens-test"))
    build(pipeline, PipelineConfig(project="chatlens-test", runner="DataflowRunner", model_stage="noop"))
    stages = [node.transform for node in run_inference_nodes(pipeline)]
    assert len(stages) == 1
    assert all(isinstance(t._model_handler._unkeyed, NoopModelHandler) for t in stages)
    assert {t._model_tag for t in stages} == {f"{config.model_tag}-noop"}
