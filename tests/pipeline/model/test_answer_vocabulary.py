"""The tokens a tuned model may write (`decoding/answer_vocabulary.py`), on a tiny random Gemma with
the real tokenizer: where the full vocabulary's choice is among them, the same tokens; elsewhere
only theirs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipeline.corpus import DATA_DIR, load_examples, load_split
from pipeline.model.decoding.answer_vocabulary import SIZES, AnswerVocabulary, decode, encode
from pipeline.model.decoding.one_pass import REPLY, SUMMARY, OnePassDecoder
from pipeline.model.training.adapters import SHIPPED_ADAPTER, AdapterServing, manifest_path


@pytest.fixture(scope="module")
def windows():
    return [e.window for e in load_examples(DATA_DIR / "v2" / "train.jsonl")[:4]]


def written_tokens(decoder, windows) -> tuple[list, list[set[int]]]:
    """The decoder's outputs for `windows` (replies for all), and per call of its decoding loop the
    tokens its rows wrote (summaries and replies) and the candidates it was given."""
    calls, loop = [], decoder._decode_loop

    def recording(state, weights, cache, logits, carried, *inputs, **static):
        candidates = inputs[-2]  # (first, position, wants_reply, numbers, candidates, refill)
        carried, *rest = loop(state, weights, cache, logits, carried, *inputs, **static)
        ids, real = candidates
        wrote = np.asarray(carried["tokens"])[np.isin(np.asarray(carried["phases"]), (SUMMARY, REPLY))]
        calls.append((set(wrote.tolist()), set(np.asarray(ids)[np.asarray(real)].tolist())))
        return (carried, *rest)

    recording.holds = loop.holds
    decoder._decode_loop = recording
    return decoder.run(windows, "all"), calls


def test_ranges_round_trip_and_stay_one_short_line():
    tokens = [*range(8192), 9000, 9001, 12345, 70000]
    assert encode(tokens) == "0-8191 9000-9001 12345 70000"
    assert decode(encode(tokens)) == tuple(tokens)
    assert decode(encode([])) == ()


def test_a_batchs_candidates_are_the_vocabulary_its_prompts_their_case_and_the_formats_own(tiny_lm, windows):
    decoder = OnePassDecoder(tiny_lm, prompt_format=2)
    vocabulary = AnswerVocabulary(tuple(range(100)))
    prompts = [decoder.vocabulary.prompt(w)[0] for w in windows]
    texts = [decoder._decode(p) for p in prompts]
    ids, real = vocabulary.candidates(decoder._tokenize, prompts, texts, decoder._always,
                                      tiny_lm.backbone.vocabulary_size)
    assert ids.shape == real.shape == (SIZES[0],) and np.all(np.diff(ids) >= 0)
    chosen = set(ids[real].tolist())
    assert len(chosen) == real.sum()  # each real one once; the padding repeats the last
    assert set(range(100)) | decoder._always | {t for p in prompts for t in p} <= chosen
    upper = decoder._tokenize(texts[0].upper())
    assert set(upper) <= chosen and not set(upper) <= {t for p in prompts for t in p}  # the case variants
    too_many = AnswerVocabulary(tuple(range(SIZES[-1])))
    assert too_many.candidates(decoder._tokenize, prompts, texts, (), tiny_lm.backbone.vocabulary_size) is None


def test_where_the_models_choice_is_a_candidate_the_tokens_are_the_full_vocabularys(tiny_lm, windows):
    """Every token the whole vocabulary's decoding wrote is a candidate: the same summaries and replies,
    and each confidence the same tokens' share among fewer candidates (higher, never lower)."""
    full, calls = written_tokens(OnePassDecoder(tiny_lm, summary_tokens=6, reply_tokens=5), windows)
    size = tiny_lm.backbone.vocabulary_size
    assert calls[0][1] == set(range(size))  # without an answer vocabulary, every token
    wrote = set().union(*(w for w, _ in calls))
    others = np.random.default_rng(0).choice(size, 3000, replace=False).tolist()
    subset = OnePassDecoder(tiny_lm, summary_tokens=6, reply_tokens=5,
                            answer_vocabulary=AnswerVocabulary(tuple(sorted(wrote | set(others)))))
    got, got_calls = written_tokens(subset, windows)
    assert len(got_calls[0][1]) < size // 8  # the step projected on a few of the vocabulary's rows
    for a, b in zip(full, got):
        assert (a.summary, a.reply, a.probabilities) == (b.summary, b.reply, b.probabilities)
        assert b.summary_confidence >= a.summary_confidence - 1e-6
        assert b.reply_confidence >= a.reply_confidence - 1e-6


def test_a_decoder_writes_only_its_candidates(tiny_lm, windows):
    """A random tiny model writes tokens from all over the vocabulary; given an answer vocabulary
    without them, it writes only candidates, and the labels stay the full vocabulary's own."""
    full, calls = written_tokens(OnePassDecoder(tiny_lm, summary_tokens=6, reply_tokens=5), windows)
    small = OnePassDecoder(tiny_lm, summary_tokens=6, reply_tokens=5,
                           answer_vocabulary=AnswerVocabulary(tuple(range(1000))))
    got, got_calls = written_tokens(small, windows)
    (wrote, _), = calls
    (got_wrote, candidates), = got_calls
    assert wrote - candidates  # the full decoding wrote tokens the candidates lack: this test can fail
    assert got_wrote <= candidates
    assert [o.probabilities for o in got] == [o.probabilities for o in full]


def test_the_shipped_adapters_answer_vocabulary_is_its_training_datas(tiny_lm):
    """The manifest's tokens are those `chatlens tune` computes from the chats it was tuned on (the
    same file, by its sha256), with the tokenizer's common pieces."""
    import hashlib

    from pipeline.corpus import split_path
    from pipeline.tune import answer_vocabulary

    manifest = json.loads(manifest_path(SHIPPED_ADAPTER).read_text())
    assert hashlib.sha256(split_path("train").read_bytes()).hexdigest() == manifest["training_data"]["sha256"]

    class Engine:
        decoder = OnePassDecoder(tiny_lm, prompt_format=2)

    computed = answer_vocabulary(Engine, load_split("train"))
    assert AdapterServing.from_json(manifest).answer_vocabulary == computed
    assert manifest["answer_vocabulary"]["count"] == len(computed.tokens)
