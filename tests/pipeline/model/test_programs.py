"""The bounded set of compiled programs (pipeline/model/decoding/programs.py): real XLA programs,
and both engines on a tiny random Gemma holding one program at a time."""

from __future__ import annotations

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
