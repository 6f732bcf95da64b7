"""The labelled corpus in data/: valid contracts, the counts the project relies on, honest gold."""

from __future__ import annotations

import importlib.util
from collections import Counter

import pytest

from pipeline import scoring
from pipeline.corpus import (
    DATA_DIR,
    HARD_CASES,
    MAX_GOLD_REPLY_CHARS,
    MAX_GOLD_SUMMARY_CHARS,
    SPLITS,
    counts_markdown,
    load_split,
    readme_with_counts,
    second_replies,
)
from pipeline.evaluate import transcript_text


@pytest.fixture(scope="module")
def splits():
    return {split: load_split(split) for split in SPLITS}  # every line parses as a ChatWindow


@pytest.fixture(scope="module")
def every(splits):
    return [e for examples in splits.values() for e in examples]


def test_sizes_and_label_balance(splits):
    assert len(splits["train"]) >= 700 and len(splits["dev"]) >= 150 and len(splits["test"]) >= 150
    for split, examples in splits.items():
        shares = Counter(e.label for e in examples)
        assert set(shares) == {-1, 0, 1}
        for label, count in shares.items():
            assert 0.30 <= count / len(examples) <= 0.40, (split, label, count, len(examples))


def test_splits_share_no_scenario_and_no_chat(splits):
    scenarios = {split: {e.scenario for e in examples} for split, examples in splits.items()}
    assert all(e.scenario for examples in splits.values() for e in examples)
    assert not scenarios["train"] & scenarios["dev"]
    assert not scenarios["train"] & scenarios["test"]
    assert not scenarios["dev"] & scenarios["test"]
    ids = [e.window.chat_id for examples in splits.values() for e in examples]
    assert len(ids) == len(set(ids))


def test_the_earlier_labelled_set_is_part_of_test(splits):
    test_ids = {e.window.chat_id for e in splits["test"]}
    assert {f"eval-{i:03d}" for i in range(1, 97)} <= test_ids


def test_domains_languages_lengths_and_hard_cases(every):
    assert len({e.domain for e in every}) >= 8
    languages = Counter(e.window.language for e in every)
    assert {"fr", "es", "de", "it", "pt", "nl"} <= set(languages)
    assert 1 - languages["en"] / len(every) >= 0.25
    assert all(1 <= len(e.window.messages) <= 20 for e in every)
    assert {m.sender for e in every for m in e.window.messages} == {"customer", "agent", "bot"}
    hard = Counter(h for e in every for h in e.hard_cases)
    assert set(hard) <= set(HARD_CASES)
    assert all(hard[h] >= 20 for h in HARD_CASES), hard


def test_very_long_chats_are_past_the_prompt_budget(every):
    # The engine's budget is 1,024 tokens; Gemma's tokenizer averages about 4 characters per token
    # on this corpus, so 4,500 characters of message text are past it.
    long = [e for e in every if "very_long" in e.hard_cases]
    assert all(e.window.text_chars >= 4500 for e in long)


def test_gold_summaries_are_short_english_and_grounded(every):
    assert all(0 < len(e.summary) <= MAX_GOLD_SUMMARY_CHARS for e in every)
    ungrounded = [(e.window.chat_id, scoring.ungrounded(e.summary, transcript_text(e.window))) for e in every]
    ungrounded = [u for u in ungrounded if u[1]]
    assert len(ungrounded) <= 0.02 * len(every), ungrounded[:20]
    english = sum(scoring.language_of(e.summary) == "en" for e in every)
    assert english >= 0.98 * len(every)


def test_gold_replies_follow_the_rules(every):
    for e in every:
        if e.label == -1:
            assert e.reply, e.window.chat_id
        if e.label == 1:
            assert e.reply is None, e.window.chat_id
    replies = [e for e in every if e.reply]
    assert all(len(e.reply) <= MAX_GOLD_REPLY_CHARS and scoring.placeholder(e.reply) is None for e in replies)
    grounded = [e for e in replies
                if not scoring.ungrounded(e.reply, transcript_text(e.window), e.window.language)]
    assert len(grounded) >= 0.97 * len(replies)
    in_language = sum(scoring.language_of(e.reply) == e.window.language for e in replies)
    assert in_language >= 0.9 * len(replies)


def test_readme_counts_match_the_data(splits):
    readme = (DATA_DIR / "README.md").read_text(encoding="utf-8")
    assert readme_with_counts(readme, counts_markdown(splits)) == readme, "run: python -m pipeline.corpus --write"


def test_splits_are_what_the_build_makes_of_the_sources(splits, tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("corpus_build", DATA_DIR / "tools" / "build.py")
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    rebuilt = build.build()
    for split, examples in splits.items():
        assert sorted(e.to_json() for e in rebuilt[split]) == sorted(e.to_json() for e in examples), split


@pytest.fixture(scope="module")
def reply_agreement():
    spec = importlib.util.spec_from_file_location("reply_agreement", DATA_DIR / "tools" / "reply_agreement.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_second_replies_are_for_train_and_dev_reply_chats_and_follow_the_gold_rules(splits):
    second = second_replies()
    held_out = {e.window.chat_id: e for e in splits["dev"] if e.reply}
    assert held_out.keys() <= second.keys(), "the agreement figure needs a second reply for every dev reply chat"
    chats = {e.window.chat_id: e for split in ("train", "dev") for e in splits[split] if e.reply}
    assert second.keys() <= chats.keys(), "second replies only for train and dev chats with a gold reply"
    for chat_id, reply in second.items():
        window = chats[chat_id].window
        assert len(reply) <= MAX_GOLD_REPLY_CHARS and scoring.placeholder(reply) is None, chat_id
        assert not scoring.ungrounded(reply, transcript_text(window), window.language), chat_id
        assert scoring.language_of(reply) == window.language, chat_id


def test_reply_agreement_orders_the_reference_points_as_the_readme_says(reply_agreement):
    """README (Quality) reads the reply bar against these: a second writer above it, the best
    train reply chosen with the gold in hand below it, a random one far below."""
    figures = {name: figure["rouge_l"] for name, figure in reply_agreement.agreement().items()}
    assert figures["second writer"] > 0.35 > figures["best train reply (oracle)"] > figures["any train reply"]
    assert figures == pytest.approx({"second writer": 0.384, "best train reply (oracle)": 0.281,
                                     "any train reply": 0.165, "re-tellings (same writer)": 0.331}, abs=0.001)
