"""End to end, all real: the local Pub/Sub server, `chatlens pipeline` in a subprocess on the
BundleBasedDirectRunner with the real Gemma 3 270M, and the real google-cloud-pubsub clients.

Each test bounds its waits; when one fails, the tail of the pipeline's log is printed.
The model on a small shared CPU analyses a chat in seconds, not milliseconds, so the
bounds are generous.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from collections import Counter

import pytest
from tests.support.models import copy_preset
from tests.support.pipeline import (
    ANGRY_FIRST_MESSAGE,
    CHATLENS,
    PROJECT,
    REPO,
    Collector,
    PipelineProcess,
    drafted_or_answered,
    e2e_malformed,
    e2e_messages,
    e2e_windows,
    publish_all,
    wait_until,
    window_json,
)
from tests.support.remote import MODEL, ChatCompletionsServer

from chatlens.config import LAYOUT, subscription_path, topic_path
from chatlens.contracts import ChatInsight, DeadLetter, parse_message

# The local Pub/Sub delivers out of order and some messages twice, as production may (issue 32).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.pubsub_worst_case]

WAIT = 600  # seconds: the most any test waits for its results


@pytest.fixture
def outputs(emulator):
    """Collectors on the dashboard's subscriptions of the results and dead-letter topics."""
    insights = Collector(subscription_path(PROJECT, LAYOUT.insights_subscription))
    dead = Collector(subscription_path(PROJECT, LAYOUT.deadletter_subscription))
    yield insights, dead
    insights.close()
    dead.close()


@pytest.fixture
def pipelines(emulator, gemma_source, model_cache, tmp_path):
    """Start `chatlens pipeline` processes; stops them and prints the tail of their log.

    pytest shows a test's captured output only when it fails: that is when the log matters.
    """
    started: list[PipelineProcess] = []
    log_path = tmp_path / "pipeline.log"
    # XLA programs compiled by one run are reused by the next (the cache's jax-compilation-cache)
    env = {"CHATLENS_CACHE": str(model_cache)}

    def start(*args: str) -> PipelineProcess:
        process = PipelineProcess(emulator, log_path, "--model-cache", str(model_cache), *args, env=env).start()
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()
    if started:
        print(f"\n----- tail of {log_path} -----\n{started[-1].log_tail(150)}")


def insights_of(collector: Collector) -> list[ChatInsight]:
    return [ChatInsight.model_validate_json(data) for data, _ in collector.messages]


def dead_letters_of(collector: Collector) -> list[DeadLetter]:
    """The dead letters, one per input and failure as the dashboard stores them: Pub/Sub may deliver
    an input twice (the local server's worst-case delivery does), and its dead letter is then
    published twice, under the same key (app.crud.ingest.dead_letter_key)."""
    from app.crud.ingest import dead_letter_key

    letters: dict = {}
    for data, attributes in collector.messages:
        letter = DeadLetter.model_validate_json(data)
        letters.setdefault(dead_letter_key(letter, attributes) or len(letters), letter)
    return list(letters.values())


def messages_read(process: PipelineProcess) -> int:
    """The pipeline's `messages_read` counter, from its newest progress line (0 before the first)."""
    counts = re.findall(r"\bmessages_read=(\d+)", process.log_tail(10_000))
    return int(counts[-1]) if counts else 0


def assert_log_shows_progress(process: PipelineProcess) -> None:
    assert process.log_contains("progress:"), process.log_tail()


def test_deadline_batches_carry_every_window_exactly_once(pipelines, outputs):
    """The pipeline's own mechanics without the model's cost (`--model-stage noop`): windows go
    through the deadline batching (typed state keys, batches of at most 4) and each ends as
    exactly one insight or dead letter."""
    from pipeline.model.backends.noop.handler import NOOP_MODEL_ID

    insights, dead = outputs
    windows, malformed = e2e_windows(), e2e_malformed()
    process = pipelines("--model-stage", "noop", "--max-batch-size", "4", "--max-batch-duration-secs", "1")
    publish_all(topic_path(PROJECT, LAYOUT.windows_topic), windows + malformed)
    done = wait_until(lambda: len(insights) >= len(windows) and len(dead) >= len(malformed), 180,
                      while_alive=process)
    assert done, f"{len(insights)} insights and {len(dead)} dead letters\n{process.log_tail()}"
    time.sleep(3)  # nothing more may arrive
    results = insights_of(insights)
    assert sorted(i.chat_id for i in results) == sorted(json.loads(w)["chat_id"] for w in windows)
    assert {i.model_id for i in results} == {NOOP_MODEL_ID} and len(dead_letters_of(dead)) == len(malformed)
    assert not process.log_contains("may not be deterministic"), process.log_tail()


def test_windows_in_insights_and_dead_letters_out(pipelines, outputs):
    insights, dead = outputs
    every = e2e_windows()
    windows, malformed = every[:8] + every[8:10] + every[16:18], e2e_malformed()  # 8 angry, 2 neutral, 2 happy
    process = pipelines("--max-batch-size", "8", "--max-batch-duration-secs", "2")
    started = time.monotonic()
    publish_all(topic_path(PROJECT, LAYOUT.windows_topic), windows + malformed,
                [{"source": "e2e", "n": str(i)} for i in range(len(windows) + len(malformed))])

    done = wait_until(lambda: len(insights) >= len(windows) and len(dead) >= len(malformed), WAIT,
                      while_alive=process)
    elapsed = time.monotonic() - started
    assert done, f"{len(insights)} insights and {len(dead)} dead letters after {elapsed:.0f} s\n{process.log_tail()}"
    time.sleep(5)  # nothing more may arrive: exactly one outcome per input
    print(f"{len(windows)} windows + {len(malformed)} malformed -> {len(insights)} insights, "
          f"{len(dead)} dead letters in {elapsed:.0f} s")

    results = insights_of(insights)
    assert sorted(i.chat_id for i in results) == sorted(json.loads(w)["chat_id"] for w in windows)
    by_chat = {json.loads(w)["chat_id"]: json.loads(w) for w in windows}
    for insight, attributes in zip(results, insights.attributes()):
        source = by_chat[insight.chat_id]
        assert insight.window_id == source["window_id"] and insight.closed == source["closed"]
        assert [m.message_id for m in insight.transcript] == [m["message_id"] for m in source["messages"]]
        assert insight.summary and insight.model_id and insight.prompt_version
        assert insight.analyzed_at >= insight.published_at
        if insight.sentiment == -1:  # every negative chat gets a reply draft, or staff are told why not
            assert drafted_or_answered(insight), insight
        assert attributes == {"chat_id": insight.chat_id, "window_id": insight.window_id,
                              "sentiment": {-1: "negative", 0: "neutral", 1: "positive"}[insight.sentiment],
                              "schema_version": "1", "tenant": insight.tenant, "closed": "true"}
    angry = [i for i in results if int(i.chat_id.rsplit("-", 1)[1]) <= 8]
    assert sum(i.sentiment == -1 for i in angry) >= 6, [(i.chat_id, i.scores) for i in angry]

    letters = dead_letters_of(dead)
    assert sorted(letter.payload for letter in letters) == sorted(malformed)
    for letter, attributes in zip(letters, dead.attributes()):
        assert letter.stage == "validate" and letter.error_message
        assert letter.attributes["source"] == "e2e"
        assert attributes["stage"] == "validate"
    assert_log_shows_progress(process)
    assert process.stop(signal.SIGTERM) == 0


def test_message_stream_sessions_into_insights(pipelines, outputs):
    insights, dead = outputs
    lines = e2e_messages()
    messages = [parse_message(line) for line in lines]
    last = {m.chat_id: m.message_id for m in messages}  # the last message of each chat closes it
    attributes = [{"closed": "true"} if last[m.chat_id] == m.message_id else {} for m in messages]
    process = pipelines("--mode", "messages", "--session-gap-secs", "600", "--early-fire-count", "100",
                        "--early-fire-secs", "3600", "--max-batch-duration-secs", "2", "--reply-for", "all",
                        "--status-every", "1")
    started = time.monotonic()
    # Each chat's closing message goes out once the pipeline has read the others: the server delivers
    # out of order (worst case), and a close that overtakes a chat's earlier messages fires without
    # them (they come with the session's next firing; README, "No ordering promise").
    topic = topic_path(PROJECT, LAYOUT.messages_topic)
    opening = [(line, attrs) for line, attrs in zip(lines, attributes) if not attrs]
    publish_all(topic, [line for line, _ in opening])
    assert wait_until(lambda: messages_read(process) >= len(opening), WAIT, interval=0.5, while_alive=process), \
        process.log_tail()
    time.sleep(3)  # the server's spontaneous second copies come within 3 s: all first copies are read by now
    publish_all(topic, [line for line, attrs in zip(lines, attributes) if attrs], [a for a in attributes if a])

    chats = sorted(last)
    done = wait_until(lambda: {i.chat_id for i in insights_of(insights)} >= set(chats), WAIT, while_alive=process)
    elapsed = time.monotonic() - started
    assert done, f"{len(insights)} insights after {elapsed:.0f} s\n{process.log_tail()}"
    time.sleep(5)
    print(f"{len(lines)} messages of {len(chats)} chats -> {len(insights)} insights in {elapsed:.0f} s")
    results = insights_of(insights)
    assert not len(dead)
    # closed chats fire at once with every message, sorted by sent_at; early firings are off
    assert sorted(i.chat_id for i in results) == chats
    for insight in results:
        expected = sorted((m for m in messages if m.chat_id == insight.chat_id), key=lambda m: m.sent_at)
        assert insight.transcript == expected and insight.closed
        assert insight.window_id.startswith("s") and f"-n{len(expected)}-" in insight.window_id
        assert drafted_or_answered(insight)  # --reply-for all
        assert insight.customer_id == next(m.user_id for m in expected if m.sender == "customer")
    assert process.stop(signal.SIGINT) == 0


def test_an_angry_first_message_fires_negative_before_the_chat_closes(pipelines, outputs):
    """A streaming early firing is judged on the chat so far: one furious message, no close, is negative
    at its first firing (the model learnt partial windows from corpus v3)."""
    insights, dead = outputs
    process = pipelines("--mode", "messages", "--session-gap-secs", "600", "--early-fire-count", "1",
                        "--early-fire-secs", "3600", "--max-batch-duration-secs", "1", "--reply-for", "negative")
    line = json.dumps({"schema_version": 1, "chat_id": "angry-1", "message_id": "angry-1-m1", "sender": "customer",
                       "user_id": "cust-1", "sent_at": "2026-11-27T10:00:00Z",
                       "text": ANGRY_FIRST_MESSAGE}).encode()
    publish_all(topic_path(PROJECT, LAYOUT.messages_topic), [line])
    assert wait_until(lambda: insights_of(insights), WAIT, while_alive=process), process.log_tail()
    first = insights_of(insights)[0]
    assert first.chat_id == "angry-1" and not first.closed and len(first.transcript) == 1
    assert first.sentiment == -1, (first.sentiment, first.confidence, first.summary)
    assert first.reply_draft or "draft_withheld" in first.flags  # a draft for an unhappy customer, or why not
    assert not len(dead)
    assert process.stop(signal.SIGINT) == 0


def test_restart_with_messages_in_flight_loses_nothing(pipelines, outputs):
    insights, dead = outputs
    windows, malformed = e2e_windows()[:10], e2e_malformed()
    payloads = windows + malformed
    first = pipelines("--max-batch-size", "2", "--max-batch-duration-secs", "1")
    publish_all(topic_path(PROJECT, LAYOUT.windows_topic), payloads)
    # Stop once the model is loaded and analysing the first windows. (Waiting for a first insight
    # is not enough: the local runner may publish a whole bundle's outcomes at once, so with a
    # fast enough model the first insight comes with all the others.)
    assert wait_until(lambda: first.log_contains("XLA compile #1"), WAIT, interval=0.5,
                      while_alive=first), first.log_tail()
    before = len(insights) + len(dead)
    assert first.stop(signal.SIGTERM) == 0
    assert first.log_contains("handed back for redelivery"), first.log_tail()
    print(f"stopped after {before} outcome(s) of {len(payloads)}")
    assert before < len(payloads), "everything finished before the stop: nothing was in flight"

    second = pipelines("--max-batch-size", "8", "--max-batch-duration-secs", "2")
    expected = {json.loads(w)["chat_id"] for w in windows}
    done = wait_until(
        lambda: {i.chat_id for i in insights_of(insights)} >= expected
        and {d.payload for d in dead_letters_of(dead)} >= set(malformed),
        WAIT, while_alive=second)
    assert done, f"{len(insights)} insights, {len(dead)} dead letters\n{second.log_tail()}"
    time.sleep(5)
    results = insights_of(insights)
    counts = Counter((i.chat_id, i.window_id) for i in results)
    print(f"after the restart: {len(results)} insights for {len(expected)} windows, {len(dead)} dead letters; "
          f"duplicates: {sum(c - 1 for c in counts.values())}")
    # at least once: every input has an outcome; a duplicate is the same window again
    assert {chat_id for chat_id, _ in counts} == expected
    assert all(window_id == "w1" for _, window_id in counts)
    assert {d.payload for d in dead_letters_of(dead)} == set(malformed)
    assert second.stop(signal.SIGTERM) == 0


def test_analyze_command_writes_insights_and_dead_letters(gemma_source, model_cache, tmp_path):
    windows, malformed = e2e_windows(), e2e_malformed()
    lines = [windows[0], windows[9], malformed[0], windows[17], windows[0], malformed[2]]  # one repeated window
    source = tmp_path / "chats.jsonl"
    source.write_bytes(b"\n".join(lines) + b"\n")
    started = time.monotonic()
    done = subprocess.run([str(CHATLENS), "analyze", str(source), "--model-cache", str(model_cache)], cwd=REPO,
                          capture_output=True, timeout=WAIT, env={**os.environ, "CHATLENS_CACHE": str(model_cache)})
    print(f"chatlens analyze: {time.monotonic() - started:.0f} s")
    assert done.returncode == 0, done.stderr.decode()[-4000:]
    out, dead_out = tmp_path / "chats.insights.jsonl", tmp_path / "chats.insights.deadletter.jsonl"
    insights = [ChatInsight.model_validate_json(line) for line in out.read_text().splitlines()]
    letters = [DeadLetter.model_validate_json(line) for line in dead_out.read_text().splitlines()]
    assert [i.chat_id for i in insights] == ["e2e-001", "e2e-010", "e2e-018"]  # input order, repeat skipped
    assert [letter.payload for letter in letters] == [malformed[0], malformed[2]]
    assert [letter.attributes["line"] for letter in letters] == ["3", "6"]
    assert all(drafted_or_answered(i) for i in insights if i.sentiment == -1)
    summary = done.stderr.decode().strip().splitlines()[-1]
    assert "6 line(s)" in summary and "3 insight(s)" in summary and "2 dead letter(s)" in summary
    assert "1 duplicate(s) skipped" in summary


def test_a_new_preset_in_the_watched_folder_is_used_without_a_restart(pipelines, outputs, gemma_source,
                                                                       gemma_preset, tmp_path):
    """--model-watch: drop a new preset in and the running pipeline's next batches use it."""
    insights, _ = outputs
    watched = tmp_path / "presets"
    watched.mkdir()
    process = pipelines("--max-batch-size", "2", "--max-batch-duration-secs", "1", "--reply-for", "none",
                        "--model-watch", str(watched / "*" / "chatlens.json"), "--model-watch-interval-secs", "1")
    windows = e2e_windows()
    publish_all(topic_path(PROJECT, LAYOUT.windows_topic), windows[8:10])
    assert wait_until(lambda: len(insights) >= 2, WAIT, while_alive=process), process.log_tail()
    assert {i.model_id for i in insights_of(insights)} == {f"{gemma_source.model_id}+int8"}  # served in int8

    copy_preset(gemma_preset, watched / "v2", "gemma3-270m-v2")
    time.sleep(2)  # one watch interval
    publish_all(topic_path(PROJECT, LAYOUT.windows_topic), windows[10:12])
    assert wait_until(lambda: len(insights) >= 4, WAIT, while_alive=process), process.log_tail()
    later = [i for i in insights_of(insights) if i.chat_id in {"e2e-011", "e2e-012"}]
    assert [i.model_id for i in later] == ["gemma3-270m-v2+int8"] * 2, process.log_tail()
    assert process.log_contains("found by the watch") and process.alive()
    assert process.stop(signal.SIGTERM) == 0


def test_remote_model_stage_end_to_end(emulator, outputs, tmp_path):
    """--model-stage remote: the same pipeline with an OpenAI-compatible endpoint that is busy at first."""
    insights, dead = outputs
    chats = [window_json("r-1", [("customer", "This is terrible, my card was charged twice.")]),
             window_json("r-2", [("customer", "All sorted, thank you so much!")]),
             window_json("r-3", [("customer", "What time do you open on Sunday?")]),
             window_json("r-4", [("customer", "GARBAGE please")])]
    malformed = e2e_malformed()[:1]
    with ChatCompletionsServer(failures=[(429, {"Retry-After": "1"})]) as server:
        process = PipelineProcess(emulator, tmp_path / "pipeline.log", "--model-stage", "remote",
                                  "--remote-url", server.base_url, "--remote-model", MODEL,
                                  "--max-batch-size", "1", "--max-batch-duration-secs", "1").start()
        try:
            publish_all(topic_path(PROJECT, LAYOUT.windows_topic), chats + malformed)
            done = wait_until(lambda: len(insights) >= 3 and len(dead) >= 2, 180, while_alive=process)
            assert done, f"{len(insights)} insights, {len(dead)} dead letters\n{process.log_tail()}"
            time.sleep(3)
            assert process.stop(signal.SIGTERM) == 0
        finally:
            process.stop()
    results = {i.chat_id: i for i in insights_of(insights)}
    assert {c: i.sentiment for c, i in results.items()} == {"r-1": -1, "r-2": 1, "r-3": 0}
    assert results["r-1"].reply_draft and not results["r-2"].reply_draft
    assert {i.model_id for i in results.values()} == {f"remote:{MODEL}"}
    letters = {(letter.stage, letter.chat_id) for letter in dead_letters_of(dead)}
    assert letters == {("validate", None), ("inference", "r-4")}, letters
    assert 429 in server.answered  # the endpoint was busy first, and the pipeline retried
