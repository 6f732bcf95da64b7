"""Continuous batching in the one-pass decoder (`decoding/loop_rows.py`): a call's chats beyond its
decoding rows join as rows finish, on a tiny random Gemma with the real tokenizer."""

from __future__ import annotations

import numpy as np

from pipeline.corpus import DATA_DIR, load_examples
from pipeline.model.decoding.loop_rows import DONE
from pipeline.model.decoding.one_pass import OnePassDecoder


def recorded_loops(decoder) -> list[dict]:
    """Per call of the decoder's loop: the chat rows it was given and which rows were done after it."""
    calls, loop = [], decoder._decode_loop

    def recording(state, weights, cache, logits, carried, *inputs, **static):
        before = np.asarray(carried["phase"]) != DONE
        carried, *rest = loop(state, weights, cache, logits, carried, *inputs, **static)
        calls.append({"running": before, "done": np.asarray(carried["phase"]) == DONE})
        return (carried, *rest)

    recording.holds = loop.holds
    decoder._decode_loop = recording
    return calls


def test_chats_beyond_the_rows_join_as_rows_finish_with_what_each_gives_alone(tiny_lm):
    """Seven chats through two rows, replies for some (rows that end at different steps): the loop
    stops when a row is free and chats wait, one joins in its place, and the loop goes on with the
    other row where it was. Every chat's label, summary, reply and confidences are those it gets
    decoded alone (each row at its own positions), from one loop program."""
    chats = [e.window for e in load_examples(DATA_DIR / "v2" / "train.jsonl")[:7]]
    policies = ["all", "none", "all", "none", "none", "all", "none"]
    alone = OnePassDecoder(tiny_lm, summary_tokens=5, reply_tokens=4)
    alone.prefill_overhead = alone.reload_cost = 0  # each chat's prefill as wide as its own length bucket
    expected = [alone.run([chat], [policy])[0] for chat, policy in zip(chats, policies)]
    decoder = OnePassDecoder(tiny_lm, summary_tokens=5, reply_tokens=4, decoding_rows=2)
    decoder.prefill_overhead = decoder.reload_cost = 0
    calls = recorded_loops(decoder)
    got = decoder.run(chats, policies)
    assert [o.reply is not None for o in got] == [p == "all" for p in policies]
    for a, b in zip(got, expected):
        assert (a.summary, a.reply, a.summary_tokens, a.reply_tokens, a.truncated) == \
            (b.summary, b.reply, b.summary_tokens, b.reply_tokens, b.truncated)
        np.testing.assert_allclose(a.probabilities, b.probabilities, atol=1e-5)
        np.testing.assert_allclose([a.summary_confidence, a.reply_confidence or 0],
                                   [b.summary_confidence, b.reply_confidence or 0], rtol=1e-4)
    assert len(calls) >= 6  # at least once per chat that waited, and once to finish
    # while chats waited, each call ended as soon as one row was done, the other still decoding
    assert any(call["done"].sum() == 1 and call["running"].all() for call in calls[:-1])
    assert [key for key in decoder.compiles if "decode" in key] == [
        f"one-pass decode batch=2 width={decoder.decoding_width} steps={decoder.decoding_steps}"]


def test_a_call_no_larger_than_its_rows_decodes_in_one_loop_call(tiny_lm):
    chats = [e.window for e in load_examples(DATA_DIR / "v2" / "train.jsonl")[:3]]
    decoder = OnePassDecoder(tiny_lm, summary_tokens=5, reply_tokens=4, decoding_rows=4)
    calls = recorded_loops(decoder)
    outputs = decoder.run(chats, "all")
    assert len(calls) == 1 and calls[0]["done"].all() and len(outputs) == 3
    assert decoder.run([], "all") == []
