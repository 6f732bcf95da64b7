"""The bounded set of compiled programs (pipeline/model/decoding/programs.py): real XLA programs,
and both engines on a tiny random Gemma holding one program at a time."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from pipeline.corpus import DATA_DIR, load_examples
from pipeline.model.decoding.one_pass import OnePassDecoder
from pipeline.model.decoding.programs import Programs
from pipeline.model.decoding.prompted import EngineConfig, PromptedEngine
from pipeline.prompts import load_prompts


def test_programs_beyond_the_limit_are_dropped_least_recently_used_first():
    programs = Programs(limit=2)
    traced = []

    def scaled(x, factor):
        traced.append((x.shape, factor))  # runs once per compile
        return x * factor

    run = programs.jit(scaled, static_argnames=("factor",))
    assert float(run(jnp.ones(3), factor=2).sum()) == 6
    assert float(run(jnp.ones(4), factor=2).sum()) == 8
    assert float(run(jnp.ones(3), factor=2).sum()) == 6  # held: not compiled again
    assert traced == [((3,), 2), ((4,), 2)]
    assert float(run(jnp.ones(3), factor=3).sum()) == 9  # a third program: (4,) was the least recent
    assert len(programs) == 2
    assert float(run(jnp.ones(4), factor=2).sum()) == 8  # dropped, so compiled again
    assert traced == [((3,), 2), ((4,), 2), ((3,), 3), ((4,), 2)]
    with pytest.raises(ValueError, match="at least one"):
        Programs(limit=0)


def test_a_program_says_whether_arguments_of_a_shape_would_find_it_compiled():
    programs = Programs(limit=1)
    run = programs.jit(lambda x, factor: x * factor, static_argnames=("factor",))
    assert not run.holds(jax.ShapeDtypeStruct((3,), "float32"), factor=2)
    run(jnp.ones(3), factor=2)
    assert run.holds(jax.ShapeDtypeStruct((3,), "float32"), factor=2) and run.holds(jnp.zeros(3), factor=2)
    assert not run.holds(jax.ShapeDtypeStruct((3,), "float32"), factor=3)  # another static value
    assert not run.holds(jax.ShapeDtypeStruct((3,), "int32"), factor=2)  # another dtype
    run(jnp.ones(4), factor=2)
    assert not run.holds(jnp.ones(3), factor=2)  # dropped: the limit is one


def test_one_decoding_loop_program_serves_batches_with_and_without_replies(tiny_lm):
    """The loop's bound does not depend on whether a row may reply (it ends when every row is done):
    one program, not one for each, and the same summaries either way."""
    window = load_examples(DATA_DIR / "v2" / "train.jsonl")[0].window
    decoder = OnePassDecoder(tiny_lm, summary_tokens=4, reply_tokens=3)
    without, with_replies = decoder.run([window], "none"), decoder.run([window], "all")
    loops = [key for key in decoder.compiles if "decode" in key]
    assert len(loops) == 1 and loops[0].endswith(f"steps={decoder.decoding_steps}"), loops
    assert with_replies[0].reply is not None and without[0].reply is None
    assert without[0].summary == with_replies[0].summary


def test_the_decoding_loop_decodes_in_the_buffers_of_the_cache_it_is_given(tiny_lm):
    """The batch's decoding cache is donated to the loop, which carries it in those buffers rather
    than a copy beside them (8 rows of 384 positions of Gemma 3 270M: 138 -> 62 MiB of working
    memory): the arrays passed are spent after the call."""
    window = load_examples(DATA_DIR / "v2" / "train.jsonl")[0].window
    decoder = OnePassDecoder(tiny_lm, summary_tokens=4, reply_tokens=3)
    given, loop = [], decoder._decode_loop

    def recording(state, weights, cache, *args, **static):
        given.extend(jax.tree_util.tree_leaves(cache))
        return loop(state, weights, cache, *args, **static)

    recording.holds = loop.holds
    decoder._decode_loop = recording
    output, = decoder.run([window], "all")
    assert output.summary_tokens > 0
    assert given and all(array.is_deleted() for array in given)


def test_a_decoder_holding_one_program_gives_what_one_holding_all_gives(tiny_lm):
    """Prefills and decoding loops of three shapes, each dropped and compiled again in turn: the
    same labels, summaries, replies and confidences as a decoder that keeps every program."""
    chats = load_examples(DATA_DIR / "v2" / "train.jsonl")[:8]
    windows = [[chats[0].window], [chats[3].window, chats[1].window], [chats[0].window]]
    keeping, dropping = OnePassDecoder(tiny_lm, summary_tokens=4, reply_tokens=3, max_programs=64), \
        OnePassDecoder(tiny_lm, summary_tokens=4, reply_tokens=3, max_programs=1)
    for batch in windows:
        expected, got = keeping.run(batch, "all"), dropping.run(batch, "all")
        assert got == expected
        assert len(dropping.programs) == 1
    assert len(keeping.programs) > 3


def test_a_prompted_engine_holding_one_program_gives_what_one_holding_all_gives(tiny_lm):
    """The engine of untuned models: its head prefill, scoring and generation programs, each
    dropped and compiled again in turn, give the same analyses."""
    chats = [e.window for e in load_examples(DATA_DIR / "v2" / "train.jsonl")[:3]]
    config = EngineConfig(summary_tokens=4, reply_tokens=3)
    keeping, dropping = (PromptedEngine(tiny_lm, "tiny", load_prompts("completion"), config, max_programs=n)
                         for n in (64, 1))
    for batch in ([chats[0]], chats[1:], [chats[0]]):
        assert dropping.analyze(batch, "all") == keeping.analyze(batch, "all")
        assert len(dropping.programs) == 1
    assert len(keeping.programs) > 3


def test_batches_of_different_prompt_lengths_share_one_decoding_loop_program(tiny_lm):
    """The decoding loop's cache has room for the longest prompt a decoder takes (`decoding_width`),
    whatever the batch's: batches of two length buckets (two prefills) run one loop program, and a
    short chat decodes as it does beside a long one."""
    chats = load_examples(DATA_DIR / "v2" / "train.jsonl")
    decoder = OnePassDecoder(tiny_lm, summary_tokens=4, reply_tokens=3)
    lengths = {len(decoder.vocabulary.prompt(c.window)[0]): c.window for c in chats[:40]}
    short, long = lengths[min(lengths)], lengths[max(lengths)]
    alone = decoder.run([short], "all") + decoder.run([long], "all")
    prefills = [key for key in decoder.compiles if "prefill" in key]
    loops = [key for key in decoder.compiles if "decode" in key]
    assert len(prefills) == 2 and len(loops) == 1, decoder.compiles
    assert loops[0] == f"one-pass decode batch=1 width={decoder.decoding_width} steps={decoder.decoding_steps}"
    assert OnePassDecoder(tiny_lm, summary_tokens=4, reply_tokens=3).run([short], "all") == alone[:1]
