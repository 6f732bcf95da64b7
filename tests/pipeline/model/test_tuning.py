"""LoRA tuning and the one-pass decoder, on a tiny random Gemma with the real tokenizer (seconds)."""

from __future__ import annotations

import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.support.models import tiny_gemma_lm
from pipeline.corpus import DATA_DIR, load_examples
from pipeline.model.training.adapters import AdapterServing
from pipeline.model.training.format import REPLY_CHARS, training_sequence
from pipeline.model.decoding.one_pass import OnePassDecoder
from pipeline.model.training.trainer import BlockTrainer, LoraTrainer, length_batches, pack


@pytest.fixture(scope="module")
def chats():
    """Eight fixed chats whose lengths the tests rely on (one past the sliding window): corpus v2's first, kept
    in data/v2/ beside the adapter tuned on them."""
    return load_examples(DATA_DIR / "v2" / "train.jsonl")[:8]


def sequences(decoder, chats):
    return [training_sequence(decoder.vocabulary, e.window, e.label, e.summary, e.reply) for e in chats]


def test_the_format_learns_answers_only(tiny_lm, chats):
    decoder = OnePassDecoder(tiny_lm)
    seq = sequences(decoder, chats[:1])[0]
    prompt, _ = decoder.vocabulary.prompt(chats[0].window)
    assert not any(seq.loss_mask[: len(prompt) - 1])  # the chat and instructions never carry loss
    assert seq.loss_mask[len(prompt) - 1] and seq.targets[len(prompt) - 1] in decoder.vocabulary.labels
    cue = len(prompt) + len(decoder.vocabulary.summary_cue)
    assert not any(seq.loss_mask[len(prompt) : cue])  # the "Summary:" cue is given, not learnt
    assert all(seq.loss_mask[cue : cue + 3])


def test_loss_ignores_chat_targets_and_follows_answer_targets(tiny_lm, chats):
    decoder = OnePassDecoder(tiny_lm)
    trainer = LoraTrainer(tiny_lm.backbone, rank=4, learning_rate=1e-3, total_steps=10, seed=0)
    seq = sequences(decoder, chats[:2])

    def loss(seqs):
        return trainer.loss(iter([pack(seqs)]))

    base = loss(seq)
    first = seq[0]
    chat_changed = type(first)(first.token_ids, [t + 1 if not m else t for t, m in zip(first.targets, first.loss_mask)],
                               first.loss_mask)
    assert loss([chat_changed, seq[1]]) == pytest.approx(base, abs=1e-6)
    answer = [i for i, learnt in enumerate(first.loss_mask) if learnt][3]  # a summary token
    answer_changed = type(first)(first.token_ids, first.targets[:answer] + [first.targets[answer] + 1]
                                 + first.targets[answer + 1 :], first.loss_mask)
    assert abs(loss([answer_changed, seq[1]]) - base) > 1e-4


def test_a_tiny_tune_lowers_the_loss_and_its_adapter_reloads(tiny_lm, model_cache, chats, tmp_path):
    decoder = OnePassDecoder(tiny_lm)
    seqs = sequences(decoder, chats)
    batches = [pack([seqs[i] for i in b]) for b in length_batches(seqs, 4096, seed=0)]
    epochs = 6
    trainer = LoraTrainer(tiny_lm.backbone, rank=4, learning_rate=1e-1, total_steps=epochs * len(batches), seed=0,
                          warmup_steps=1)
    before = trainer.loss(iter(batches))
    for _ in range(epochs):
        for batch in batches:
            trainer.step(batch)
    after = trainer.loss(iter(batches))
    # A random 32-wide model is near-uniform over 262,144 tokens (loss ~ ln 262144 = 12.48) and its
    # final norm bounds how far LoRA on attention can move it: a small drop, but a deterministic one.
    assert after < before - 5e-3, (before, after)
    trainer.sync()
    adapter = tmp_path / "tiny.lora.h5"
    tiny_lm.backbone.save_lora_weights(str(adapter))
    fresh = tiny_gemma_lm(model_cache)  # same seed: the same base weights
    fresh.backbone.load_lora_weights(str(adapter))
    inputs = {"token_ids": batches[0].token_ids, "padding_mask": batches[0].padding_mask}
    np.testing.assert_allclose(np.asarray(fresh.backbone(inputs)), np.asarray(tiny_lm.backbone(inputs)), atol=1e-5)
    # A later run can begin where this one ended (`chatlens tune --start-from`).
    resumed = LoraTrainer(tiny_gemma_lm(model_cache).backbone, rank=4, learning_rate=1e-1, total_steps=1, seed=1)
    assert resumed.loss(iter(batches)) == pytest.approx(before, abs=1e-6)  # a fresh LoRA changes nothing yet
    resumed.start_from(str(adapter))
    assert resumed.loss(iter(batches)) == pytest.approx(after, abs=1e-5)


def test_a_run_can_widen_an_adapter_to_the_feed_forward_layers_and_reload_it(tiny_lm, model_cache, chats, tmp_path):
    from pipeline.model.training.adapters import load_adapter

    seqs = sequences(OnePassDecoder(tiny_lm), chats)
    batches = [pack([seqs[i] for i in b]) for b in length_batches(seqs, 4096, seed=0)]
    narrow = LoraTrainer(tiny_gemma_lm(model_cache).backbone, rank=4, learning_rate=1e-1, total_steps=4, seed=0,
                         warmup_steps=1)
    for batch in batches:
        narrow.step(batch)
    narrow.sync()
    attention_only = tmp_path / "narrow.lora.h5"
    narrow.backbone.save_lora_weights(str(attention_only))
    wide_targets = ("query", "value", "ffw_gating", "ffw_gating_2", "ffw_linear")
    wide = LoraTrainer(tiny_gemma_lm(model_cache).backbone, rank=4, learning_rate=1e-1, total_steps=12, seed=1,
                       warmup_steps=1, targets=wide_targets)
    wide.start_from(str(attention_only))  # the feed-forward LoRA starts at zero: the same model as the narrow one
    assert wide.loss(iter(batches)) == pytest.approx(narrow.loss(iter(batches)), abs=1e-5)
    started = wide.loss(iter(batches))
    for _ in range(3):
        for batch in batches:
            wide.step(batch)
    assert wide.loss(iter(batches)) < started - 5e-3
    wide.sync()
    adapter = tmp_path / "wide.lora.h5"
    wide.backbone.save_lora_weights(str(adapter))
    fresh = tiny_gemma_lm(model_cache)
    load_adapter(fresh.backbone, str(adapter))  # keras-hub's own loader would enable query and value only
    assert sorted({layer.name for layer in fresh.backbone._flatten_layers(include_self=False)
                   if getattr(layer, "lora_enabled", False)}) == sorted(wide_targets)
    inputs = {"token_ids": batches[0].token_ids, "padding_mask": batches[0].padding_mask}
    np.testing.assert_allclose(np.asarray(fresh.backbone(inputs)), np.asarray(wide.backbone(inputs)), atol=1e-5)
    with pytest.raises(ValueError, match="ffw_gating"):  # a narrower model cannot take it
        load_adapter(LoraTrainer(tiny_gemma_lm(model_cache).backbone, rank=4, learning_rate=1e-1, total_steps=1,
                                 seed=0).backbone, str(adapter))


def test_block_tuning_trains_every_weight_but_the_embedding_and_resumes_from_its_checkpoint(model_cache, chats):
    seqs = sequences(OnePassDecoder(tiny_gemma_lm(model_cache)), chats)
    batches = [pack([seqs[i] for i in b]) for b in length_batches(seqs, 4096, seed=0)]
    lm = tiny_gemma_lm(model_cache)
    embedding = np.asarray(lm.backbone.token_embedding.embeddings.value).copy()
    blocks = {w.path: np.asarray(w.value).copy() for w in lm.backbone.weights if "embedding" not in w.path}
    trainer = BlockTrainer(lm.backbone, learning_rate=1e-2, total_steps=4 * len(batches), seed=0, warmup_steps=1)
    assert sum(v.size for v in trainer.trainable) == sum(w.size for w in blocks.values())  # all but the embedding
    before = trainer.loss(iter(batches))
    for _ in range(2):
        for batch in batches:
            trainer.step(batch)
    checkpoint = trainer.state()
    for _ in range(2):
        for batch in batches:
            trainer.step(batch)
    after = trainer.loss(iter(batches))
    assert after < before - 5e-3, (before, after)
    trainer.sync()
    np.testing.assert_array_equal(np.asarray(lm.backbone.token_embedding.embeddings.value), embedding)
    moved = [path for path, value in blocks.items()
             if not np.array_equal(np.asarray(next(w for w in lm.backbone.weights if w.path == path).value), value)]
    assert len(moved) == len(blocks), sorted(set(blocks) - set(moved))  # every kernel and norm of the blocks trained
    # `chatlens tune --resume`: a fresh trainer restored from the checkpoint goes on to the same weights.
    resumed = BlockTrainer(tiny_gemma_lm(model_cache).backbone, learning_rate=1e-2, total_steps=4 * len(batches),
                           seed=0, warmup_steps=1)
    resumed.restore(checkpoint)
    for _ in range(2):
        for batch in batches:
            resumed.step(batch)
    assert resumed.loss(iter(batches)) == pytest.approx(after, abs=1e-5)


def last_logits(lm, tokens: list[int], width: int):
    """The logits after `tokens`, from one full forward pass (no cache).

    Right-padded to `width` tokens and masked there, so that every pass has one shape: eager JAX
    compiles each op once per shape (seconds a length), and under the causal mask the padding after
    the last token cannot change its hidden state.
    """
    ids = np.zeros((1, width), "int32")
    mask = np.zeros((1, width), bool)
    ids[0, : len(tokens)], mask[0, : len(tokens)] = tokens, True
    hidden = np.asarray(lm.backbone({"token_ids": ids, "padding_mask": mask}))
    return lm.backbone.token_embedding(hidden[:, len(tokens) - 1 : len(tokens)], reverse=True)[0, 0]


def greedy_without_cache(lm, tokens: list[int], stops: set[int], limit: int, width: int,
                         believed: list[float] | None = None) -> list[int]:
    """Plain greedy decoding, one full forward pass per token: the reference for the one-pass loop.
    `believed`, when given, receives each token's log-probability."""
    out = []
    for _ in range(limit):
        logits = last_logits(lm, tokens + out, width)
        token = int(jnp.argmax(logits))
        out.append(token)
        if believed is not None:
            believed.append(float(jax.nn.log_softmax(logits.astype("float32"))[token]))
        if token in stops:
            break
    return out


def test_one_pass_equals_separate_scoring_and_generation(tiny_lm, chats):
    decoder = OnePassDecoder(tiny_lm, summary_tokens=5, reply_tokens=4)
    # each length bucket its own prefill: the shorter one's keys shifted on
    decoder.prefill_overhead = decoder.reload_cost = 0
    v = decoder.vocabulary
    windows = [chats[0].window, chats[3].window]  # different lengths: left padding in one batch
    outputs = decoder._run_batch([v.prompt(w)[0] for w in windows], ["all", "all"])
    assert [c for c in decoder.compiles if "prefill" in c] == [  # two prefills, one decoding loop
        "one-pass prefill batch=1 length=256", "one-pass prefill batch=1 length=384"]
    assert f"one-pass preamble length={len(decoder.preamble)}" in decoder.compiles  # both start from it
    # every reference pass fits in one width: the longest prompt, its label and cue, a summary, the reply
    width = max(len(v.prompt(w)[0]) for w in windows) + 1 + len(v.summary_cue) + 6 + len(v.reply_cue) + 4
    for window, output in zip(windows, outputs):
        prompt = v.prompt(window)[0]
        logits = last_logits(tiny_lm, prompt, width)
        expected = jax.nn.softmax(logits[np.array(v.labels)])
        np.testing.assert_allclose(output["probabilities"], np.asarray(expected), atol=1e-5)
        label = v.labels[int(np.argmax(expected))]
        head = prompt + [label, *v.summary_cue]
        summary_believed, reply_believed = [], []
        summary = greedy_without_cache(tiny_lm, head, {v.summary_end, v.eos}, 5, width, summary_believed)
        reply = []
        if summary[-1] != v.eos:
            ended = summary if summary[-1] == v.summary_end else summary + [v.summary_end]
            reply = greedy_without_cache(tiny_lm, head + ended + list(v.reply_cue), {v.eos, v.summary_end}, 4,
                                         width, reply_believed)
        # each output's confidence: the geometric mean probability of its own tokens (stops left out)
        content = [b for t, b in zip(summary, summary_believed) if t not in (v.summary_end, v.eos)]
        np.testing.assert_allclose(output["summary_confidence"], np.exp(np.mean(content)), rtol=0.05)
        if reply:
            content = [b for t, b in zip(reply, reply_believed) if t not in (v.summary_end, v.eos)]
            np.testing.assert_allclose(output["reply_confidence"], np.exp(np.mean(content)), rtol=0.05)
        assert output["summary_tokens"] == len([t for t in summary if t not in (v.summary_end, v.eos)])
        assert output["reply_tokens"] == len([t for t in reply if t not in (v.summary_end, v.eos)])
        assert output["summary"] == decoder._finish(summary, "summary")
        assert output["reply"] == (None if summary[-1] == v.eos else decoder._finish(reply, "reply"))


def test_the_preamble_is_computed_once_and_a_prompt_without_it_is_prefilled_whole_with_the_same_results(
        tiny_lm, chats):
    """Every prompt starts with the template's text before the chat (a third of a typical prompt):
    its keys and values are computed once per model state, and each group prefills only what comes
    after it. A group with a prompt that does not start with it is prefilled whole."""
    decoder = OnePassDecoder(tiny_lm, summary_tokens=4, reply_tokens=3)
    decoder.prefill_overhead = decoder.reload_cost = 0  # a prefill per length bucket
    v = decoder.vocabulary
    prompts = [v.prompt(e.window)[0] for e in chats]
    assert 25 <= len(decoder.preamble) < min(map(len, prompts))
    assert all(tuple(p[: len(decoder.preamble)]) == decoder.preamble for p in prompts)
    prompts[3] = prompts[3][1:]  # no BOS: this prompt's group cannot use the preamble
    made, make = [], decoder._preamble_cache
    decoder._preamble_cache = lambda *args: made.append(args) or make(*args)
    cached = decoder._run_batch(prompts, ["all"] * len(prompts))
    whole = OnePassDecoder(tiny_lm, summary_tokens=4, reply_tokens=3)
    # every prompt prefilled whole (the test above: = greedy)
    whole.prefill_overhead, whole.reload_cost, whole.preamble = 0, 0, ()
    expected = whole._run_batch(prompts, ["all"] * len(prompts))
    prefills = [c for c in decoder.compiles if "prefill" in c]
    assert len([c for c in prefills if c.endswith(" whole")]) == 1 < len(prefills)
    for got, want in zip(cached, expected):
        np.testing.assert_allclose(got["probabilities"], want["probabilities"], atol=1e-5)
        assert (got["summary"], got["reply"]) == (want["summary"], want["reply"])
        np.testing.assert_allclose([got["summary_confidence"], got["reply_confidence"]],
                                   [want["summary_confidence"], want["reply_confidence"]], rtol=1e-4)
    cached_again = decoder._run_batch(prompts, ["all"] * len(prompts))
    assert [o["summary"] for o in cached_again] == [o["summary"] for o in cached]
    assert len(made) == 1  # once for the model's state


def test_a_reply_stops_once_past_its_cut_with_the_same_draft(tiny_lm, chats):
    """Decoding a reply stops once its text is surely past the cut staff see (`REPLY_CHARS`): the
    same draft as plain greedy decoding on to the token limit, in fewer steps."""
    limit = 200
    decoder = OnePassDecoder(tiny_lm, summary_tokens=2, reply_tokens=limit, ground_numbers=False, step_dtype="float32")
    v = decoder.vocabulary
    prompt = v.prompt(chats[3].window)[0]
    # past the sliding window: those layers decode on a ring of it (decode_step.decoding_cache)
    assert len(prompt) + limit > tiny_lm.backbone.sliding_window_size
    output = decoder._run_batch([prompt], ["all"])[0]
    width = len(prompt) + 1 + len(v.summary_cue) + 3 + len(v.reply_cue) + limit
    head = prompt + [v.labels[int(np.argmax(output["label_logits"]))], *v.summary_cue]
    summary = greedy_without_cache(tiny_lm, head, {v.summary_end, v.eos}, 2, width)
    assert summary[-1] != v.eos
    ended = summary if summary[-1] == v.summary_end else summary + [v.summary_end]
    reply = greedy_without_cache(tiny_lm, head + ended + list(v.reply_cue), {v.eos, v.summary_end}, limit, width)
    assert len(decoder._finish(reply, "reply")) > REPLY_CHARS // 2  # a draft cut at REPLY_CHARS
    assert output["reply_tokens"] < len(reply) - 10
    assert output["reply"] == decoder._finish(reply, "reply")


def test_reply_for_negative_replies_where_the_label_comes_out_negative(tiny_lm, chats):
    decoder = OnePassDecoder(tiny_lm, summary_tokens=3, reply_tokens=2)
    outputs = decoder.run([c.window for c in chats], ["negative"] * len(chats))
    negative = [max(range(3), key=o.probabilities.__getitem__) == 0 for o in outputs]
    assert [o.reply is not None for o in outputs] == negative
    assert all(o.reply is None for o in decoder.run([c.window for c in chats], ["none"] * len(chats)))
    with pytest.raises(ValueError, match="reply_for"):
        decoder.run([chats[0].window], ["sometimes"])


def test_a_reply_below_the_offer_policy_is_withheld_with_its_confidence_and_an_unsure_summary_flagged(tiny_lm, chats):
    from pipeline.model.decoding.offer import DRAFT_WITHHELD, SUMMARY_UNSURE, OfferPolicy
    from pipeline.model.decoding.one_pass import OnePassEngine

    windows = [c.window for c in chats[:4]]
    offered = OnePassEngine(tiny_lm, "tiny").analyze(windows, "all")
    assert all(0 < a.summary_confidence <= 1 for a in offered)
    drafted = [a for a in offered if a.reply_draft]
    assert drafted and all(0 < a.reply_confidence <= 1 and DRAFT_WITHHELD not in a.flags for a in drafted)
    assert not any(SUMMARY_UNSURE in a.flags for a in offered)
    # thresholds between the outputs' confidences: the ones below lose their draft, keep their confidence
    reply_cut = float(np.median([a.reply_confidence for a in drafted]))
    summary_cut = float(np.median([a.summary_confidence for a in offered]))
    strict_policy = AdapterServing(offer_policy=OfferPolicy(reply_cut, summary_cut))
    strict = OnePassEngine(tiny_lm, "tiny", serving=strict_policy).analyze(windows, "all")
    for before, after in zip(offered, strict):
        assert (after.summary, after.reply_confidence, after.summary_confidence) == (
            before.summary, before.reply_confidence, before.summary_confidence)
        sure = before.reply_draft is None or before.reply_confidence >= reply_cut
        assert after.reply_draft == (before.reply_draft if sure else None)
        assert (DRAFT_WITHHELD in after.flags) == (not sure)
        assert (SUMMARY_UNSURE in after.flags) == (before.summary_confidence < summary_cut)
    assert any(DRAFT_WITHHELD in a.flags for a in strict) and any(a.reply_draft for a in strict)


def test_a_policy_without_drafts_after_an_agent_decodes_none_there_and_changes_nothing_else(tiny_lm, chats):
    from pipeline.model.decoding.offer import AGENT_ANSWERED, OfferPolicy
    from pipeline.model.decoding.one_pass import OnePassEngine

    answered = [c.window for c in chats if any(m.sender == "agent" for m in c.window.messages)][:2]
    unanswered = [c.window for c in chats if all(m.sender != "agent" for m in c.window.messages)][:2]
    windows = answered + unanswered
    offering = OnePassEngine(tiny_lm, "tiny")
    offered = offering.analyze(windows, "all")
    policy = AdapterServing(offer_policy=OfferPolicy(after_agent=False))
    engine = OnePassEngine(tiny_lm, "tiny", serving=policy)
    held = engine.analyze(windows, "all")
    for window, free, kept in zip(windows, offered, held):
        assert (kept.scores, kept.summary, kept.summary_confidence) == (free.scores, free.summary, free.summary_confidence)
        if window in answered:  # no draft decoded, and staff are told why
            assert kept.reply_draft is None and kept.reply_confidence is None and AGENT_ANSWERED in kept.flags
        else:
            assert (kept.reply_draft, kept.reply_confidence, kept.flags) == (free.reply_draft, free.reply_confidence,
                                                                            free.flags)
    assert engine.generated_tokens < offering.generated_tokens  # the withheld drafts were never decoded
    # a chat that would get no draft anyway ("none") is not flagged either
    assert not any(AGENT_ANSWERED in kept.flags for kept in engine.analyze(windows, "none"))
    assert OfferPolicy.from_json(policy.offer_policy.to_json()) == policy.offer_policy
    assert OfferPolicy.from_json({"reply_min_confidence": 0.5}).after_agent  # older manifests: drafts everywhere


def test_extractive_summaries_quote_the_chat_where_the_decoded_summary_points_and_change_nothing_else(tiny_lm, chats):
    from pipeline.model.decoding.extractive import extractive_summary
    from pipeline.model.decoding.one_pass import OnePassEngine
    from pipeline.normalise import normalise

    windows = [c.window for c in chats[:3]]
    decoded = OnePassEngine(tiny_lm, "tiny", serving=AdapterServing(prompt_format=2)).analyze(windows, "all")
    quoting = AdapterServing(prompt_format=2, summary_style="extractive")
    quoted = OnePassEngine(tiny_lm, "tiny", serving=quoting).analyze(windows, "all")
    assert quoted[0].prompt_version == "tuned-one-pass-v2+extractive" != decoded[0].prompt_version
    for window, free, extract in zip(windows, decoded, quoted):
        assert (extract.scores, extract.reply_draft, extract.summary_confidence) == (
            free.scores, free.reply_draft, free.summary_confidence)
        assert extract.summary == extractive_summary(window, extract.sentiment, guide=free.summary)
        chat = " ".join(" ".join(normalise(m.text).split()) for m in window.messages)
        for quote in extract.summary.split("“")[1:]:
            for piece in quote.split("”")[0].split(" … "):
                assert piece.strip(" …") in chat
    with pytest.raises(ValueError, match="summary_style"):
        AdapterServing(summary_style="abstractive")


def test_macro_replies_are_the_libraries_own_words_picked_per_chat_and_follow_an_edit(tiny_lm, chats, tmp_path):
    """A "macro" adapter serves the team's macro that its decoded reply picks: the label, the summary
    and which chats get a draft stay the decoded ones; a chat in a language without macros gets no
    draft (flagged); an edit of the library file reaches the next batch."""
    from chatlens.replies import read_library, write_library
    from pipeline.model.decoding.macros import choose, macro_reply
    from pipeline.model.decoding.offer import DRAFT_WITHHELD, OfferPolicy
    from pipeline.model.decoding.one_pass import FROM_LIBRARY, NO_MACRO, OnePassEngine
    from pipeline.model.loading.reply_library import ReplyLibraryFile

    windows = [c.window.model_copy(update={"language": "en"}) for c in chats[:3]]
    windows.append(windows[0].model_copy(update={"language": "fi"}))  # no Finnish macros
    library_path = tmp_path / "library.json"
    library = read_library()
    write_library(library, library_path)
    library_file = ReplyLibraryFile(str(library_path), interval_secs=0)
    decoded = OnePassEngine(tiny_lm, "tiny").analyze(windows, "all")
    engine = OnePassEngine(tiny_lm, "tiny", serving=AdapterServing(reply_style="macro"), reply_library=library_file)
    picked = engine.analyze(windows, "all")
    assert picked[0].prompt_version == "tuned-one-pass-v1+macro"
    for window, free, macro in zip(windows[:3], decoded, picked):
        assert (macro.scores, macro.summary) == (free.scores, free.summary)
        assert macro.reply_draft == macro_reply(window, library, free.reply_draft) is not None
        assert FROM_LIBRARY in macro.flags and macro.reply_confidence == choose(window, library, free.reply_draft).confidence
    assert picked[3].reply_draft is None and NO_MACRO in picked[3].flags
    unsure = AdapterServing(reply_style="macro", offer_policy=OfferPolicy(reply_min_confidence=1.01))
    held = OnePassEngine(tiny_lm, "tiny", serving=unsure, reply_library=library_file).analyze(windows[:3], "all")
    for macro, withheld in zip(picked, held):  # below the policy: no draft, the pick's confidence kept
        assert withheld.reply_draft is None and DRAFT_WITHHELD in withheld.flags
        assert withheld.reply_confidence == macro.reply_confidence and withheld.summary == macro.summary
    edited = library.model_copy(update={"macros": [m.model_copy(update={"body": f"Edited {i}."})
                                                   for i, m in enumerate(library.macros)]})
    write_library(edited, library_path)
    os.utime(library_path, (time.time() + 10, time.time() + 10))  # a later modification time, whatever the clock
    assert all(a.reply_draft.startswith("Edited ") for a in engine.analyze(windows[:3], "all"))


def test_the_calibration_moves_the_label_and_the_reply_decision_and_only_rescales_confidence(tiny_lm, chats):
    from pipeline.model.decoding.calibration import LabelCalibration

    windows = [c.window for c in chats]
    plain = OnePassDecoder(tiny_lm, summary_tokens=3, reply_tokens=2)
    raw = np.array([o.label_logits for o in plain.run(windows, label_only=True)])
    assert all(o.summary == "" and o.reply is None for o in plain.run(windows, ["all"] * 8, label_only=True))
    np.testing.assert_allclose(raw, [o.label_logits for o in plain.run(windows, ["all"] * 8)], atol=1e-5)
    calibration = LabelCalibration(bias=(50.0, 0.0, 0.0), temperature=3.0)  # everything negative
    biased = OnePassDecoder(tiny_lm, summary_tokens=3, reply_tokens=2, calibration=calibration)
    outputs = biased.run(windows, ["negative"] * 8)
    np.testing.assert_allclose([o.probabilities for o in outputs], calibration.probabilities(raw), atol=1e-5)
    assert all(o.probabilities[0] > 0.99 and o.reply is not None for o in outputs)  # the fed label is the biased one


def test_a_model_served_in_bfloat16_keeps_float32_label_logits_close_to_its_float32_self(model_cache, chats):
    """What the engine serves a tuned model in (`backends/gemma/engine.SERVING_DTYPE`): one copy of
    the weights, in the step's dtype. Its label logits are accumulated in float32, not rounded
    to bfloat16, so they move only by the weights' and activations' rounding."""
    windows = [c.window for c in chats[:4]]
    full_lm, half_lm = tiny_gemma_lm(model_cache), tiny_gemma_lm(model_cache, dtype="bfloat16")
    half_lm.backbone.set_weights(full_lm.backbone.get_weights())  # the same weights, rounded
    full = OnePassDecoder(full_lm, summary_tokens=3, reply_tokens=2)
    half = OnePassDecoder(half_lm, summary_tokens=3, reply_tokens=2)
    expected = np.array([o.label_logits for o in full.run(windows, label_only=True)])
    outputs = half.run(windows, ["all"] * 4)
    np.testing.assert_allclose([o.label_logits for o in outputs], expected, atol=0.05 * np.abs(expected).max())
    assert all(o.summary for o in outputs)
    assert half._weights(half._state())["vocabulary"] is half.backbone.token_embedding.embeddings.value


def test_fitting_a_calibration_finds_the_missed_class_and_honest_confidence():
    from pipeline.model.decoding.calibration import LabelCalibration, fit, macro_f1

    rng = np.random.default_rng(0)
    gold = rng.integers(-1, 2, 600)
    logits = rng.normal(0, 1, (600, 3)) + 2.0 * np.eye(3)[gold + 1]
    logits[:, 1] += 1.5  # a model that leans to neutral
    before = macro_f1(gold + 1, logits.argmax(1))
    fitted = fit(logits, gold)
    assert fitted.bias[1] == 0 and fitted.bias[0] > 0.5 and fitted.bias[2] > 0.5
    assert macro_f1(gold + 1, fitted.probabilities(logits).argmax(1)) > before + 0.1
    probabilities = fitted.probabilities(logits)
    confidence, correct = probabilities.max(1), probabilities.argmax(1) == gold + 1
    assert abs(confidence.mean() - correct.mean()) < 0.05  # the temperature makes confidence match accuracy
    assert LabelCalibration.from_json(fitted.to_json()) == fitted and LabelCalibration.from_json(None) == LabelCalibration()


def test_an_adapter_is_merged_once_into_a_cached_preset_that_gives_the_tuned_logits(model_cache, tmp_path):
    import json

    from pipeline.model.decoding.calibration import LabelCalibration
    from pipeline.model.loading.sources import resolve_model
    from pipeline.model.training.adapters import manifest_path
    from pipeline.model.types import ModelSpecError

    base_dir = tmp_path / "tiny-base"
    tiny_gemma_lm(model_cache).save_to_preset(str(base_dir))
    tuned = tiny_gemma_lm(model_cache)
    tuned.backbone.enable_lora(4, target_layer_names=["query", "value", "ffw_gating", "ffw_linear"])  # beyond the default
    for variable in tuned.backbone.trainable_variables:  # a LoRA that changes something (B starts at zero)
        variable.assign(np.random.default_rng(0).normal(0, 0.5, variable.shape).astype("float32"))
    adapter = tmp_path / "support-v1.lora.h5"
    tuned.backbone.save_lora_weights(str(adapter))

    source = resolve_model(str(base_dir), tmp_path / "cache", adapter=adapter)
    assert source.converted and source.tuned and source.model_id.startswith("tiny-base+support-v1@")
    merged = source.load()
    assert not any("lora" in w.path for w in merged.backbone.weights)  # folded in: no LoRA cost per token
    ids = np.array([[2, 651, 6037, 563, 496, 1638]], "int32")
    inputs = {"token_ids": ids, "padding_mask": np.ones_like(ids, bool)}
    np.testing.assert_allclose(np.asarray(merged.backbone(inputs)), np.asarray(tuned.backbone(inputs)), atol=1e-4)
    again = resolve_model(str(base_dir), tmp_path / "cache", adapter=adapter)
    assert not again.converted and again.preset == source.preset  # merged once, then loaded from the cache
    # The label calibration in the adapter's manifest travels with it, and is part of its version.
    manifest_path(adapter).write_text(json.dumps({"label_calibration": {"bias": [1.5, 0, -0.5], "temperature": 2.0}}))
    calibrated = resolve_model(str(base_dir), tmp_path / "cache", adapter=adapter)
    assert calibrated.serving.calibration == LabelCalibration((1.5, 0.0, -0.5), 2.0) and calibrated.model_id != source.model_id
    assert resolve_model(calibrated.preset, tmp_path / "cache").serving.calibration == calibrated.serving.calibration  # a baked preset
    assert calibrated.serving.prompt_format == 1  # a manifest without one: the format adapters learnt before formats had numbers
    manifest_path(adapter).write_text(json.dumps({"prompt_format": 2}))
    reformatted = resolve_model(str(base_dir), tmp_path / "cache", adapter=adapter)
    assert reformatted.serving.prompt_format == 2 and reformatted.model_id not in (source.model_id, calibrated.model_id)
    assert resolve_model(reformatted.preset, tmp_path / "cache").serving.prompt_format == 2  # the baked preset says so too
    manifest_path(adapter).write_text(json.dumps({"prompt_format": 2, "summary_style": "extractive"}))
    quoting = resolve_model(str(base_dir), tmp_path / "cache", adapter=adapter)
    assert quoting.serving.summary_style == "extractive" and quoting.model_id != reformatted.model_id
    assert resolve_model(quoting.preset, tmp_path / "cache").serving.summary_style == "extractive"
    manifest_path(adapter).write_text(json.dumps({"prompt_format": 2, "summary_style": "extractive",
                                                  "reply_style": "macro"}))
    picking = resolve_model(str(base_dir), tmp_path / "cache", adapter=adapter)
    assert picking.serving.reply_style == "macro" and picking.model_id != quoting.model_id
    assert resolve_model(picking.preset, tmp_path / "cache").serving == picking.serving
    with pytest.raises(ModelSpecError, match="lora.h5"):
        resolve_model(str(base_dir), tmp_path / "cache", adapter=tmp_path / "missing.lora.h5")


@pytest.mark.slow  # the whole `chatlens tune` (train, calibrate, dev figures, publish), four times
def test_tune_from_dashboard_learns_what_staff_taught_and_never_replaces_a_better_adapter(model_cache, tmp_path,
                                                                                          capsys):
    """`chatlens tune --from-dashboard` on a real dashboard database, end to end on a tiny preset."""
    import hashlib
    import json

    from tests.support.app import T0, dashboard_settings, make_insight, sign_in, staffed_database, store
    from fastapi.testclient import TestClient

    from app.main import create_app
    from cli.main import main
    from pipeline.model.training.adapters import SHIPPED_ADAPTER, AdapterServing, manifest_path

    database_url, tokens = staffed_database("sqlite", tmp_path)
    store(database_url, make_insight("taught-label", sentiment=1, start=T0),
          make_insight("taught-reply", sentiment=-1, start=T0), make_insight("untouched", sentiment=0, start=T0))
    with TestClient(create_app(dashboard_settings(database_url))) as client:
        staff = sign_in(client, tokens, "alice")
        assert staff.post("/api/chats/taught-label/sentiment", json={"corrected": "negative"}).status_code == 200
        version = staff.get("/api/chats/taught-reply").json()["version"]
        assert staff.put("/api/chats/taught-reply/draft", json={"text": "So sorry, a refund is on its way.",
                                                               "version": version}).status_code == 200
    preset = tmp_path / "tiny-preset"
    tiny_gemma_lm(model_cache).save_to_preset(str(preset))
    adapter = tmp_path / "tiny.lora.h5"
    tune = ["tune", "--model", str(preset), "--model-cache", str(model_cache), "--from-dashboard", database_url,
            "--limit", "1", "--dev-limit", "2", "--epochs", "1", "--rank", "2", "--out", str(adapter),
            "--checkpoint-dir", str(tmp_path / "ckpt"),
            "--batch-tokens", "256"]  # one chat a step: no padded rows' answers through the 262k vocabulary
    assert main(tune) == 0
    manifest = json.loads(manifest_path(adapter).read_text())
    assert manifest["training_data"]["from_dashboard"] == 2 and manifest["training_data"]["chats"] == 1 + 2
    assert manifest["training_data"]["files"] == ["data/train.jsonl", "dashboard"]
    assert manifest["adapter_sha256"] == hashlib.sha256(adapter.read_bytes()).hexdigest()
    # A new adapter is served as the shipped one is (the review's styles), not as decoded texts.
    shipped = AdapterServing.of(SHIPPED_ADAPTER)
    assert (manifest["summary_style"], manifest["reply_style"]) == (shipped.summary_style, shipped.reply_style)
    assert shipped.reply_style != "model"
    # ... and offers drafts as it does: none once an agent has answered, none below its pick threshold.
    assert AdapterServing.of(adapter).offer_policy == shipped.offer_policy and not shipped.offer_policy.after_agent
    recipe = json.loads(manifest_path(SHIPPED_ADAPTER).read_text())["hyperparameters"]
    assert manifest["hyperparameters"]["targets"] == recipe["targets"]  # the shipped recipe's layers by default
    # The data hash covers what staff taught: another correction is another training set.
    with TestClient(create_app(dashboard_settings(database_url))) as client:
        sign_in(client, tokens, "alice").post("/api/chats/untouched/sentiment", json={"corrected": "positive"})
    # The current adapter claims a better dev macro-F1 than this run can reach: it stays.
    manifest["dev"]["sentiment"]["macro_f1"] = 1.01
    manifest["summary_style"], manifest["reply_style"] = "model", "macro+opening"
    manifest["offer_policy"] = {"reply_min_confidence": 0.25, "summary_min_confidence": 0.5, "after_agent": True}
    manifest_path(adapter).write_text(json.dumps(manifest))
    before = adapter.read_bytes()
    capsys.readouterr()
    assert main(tune) == 3
    assert "not replacing the current adapter: dev figures fell: sentiment macro_f1 1.01 ->" in capsys.readouterr().err
    assert adapter.read_bytes() == before
    assert json.loads(manifest_path(adapter).read_text())["dev"]["sentiment"]["macro_f1"] == 1.01
    # --force replaces it, and the new manifest counts the third taught chat and hashes other data.
    assert main(tune + ["--force"]) == 0
    replaced = json.loads(manifest_path(adapter).read_text())
    assert replaced["training_data"]["from_dashboard"] == 3
    assert replaced["training_data"]["sha256"] != manifest["training_data"]["sha256"]
    assert set(replaced["label_calibration"]) == {"bias", "temperature", "fitted_on"}
    assert (replaced["summary_style"], replaced["reply_style"]) == ("model", "macro+opening")  # the replaced one's
    assert replaced["offer_policy"] == manifest["offer_policy"]
    # --recalibrate refits the calibration and the dev figures; the adapter and its history stay.
    weights = adapter.read_bytes()
    assert main(tune + ["--recalibrate", "--force"]) == 0
    recalibrated = json.loads(manifest_path(adapter).read_text())
    assert adapter.read_bytes() == weights and recalibrated["adapter_sha256"] == replaced["adapter_sha256"]
    assert recalibrated["history"] == replaced["history"] and recalibrated["training_data"] == replaced["training_data"]
    # --start-from: another run begins at this adapter and keeps its training on record.
    later = tmp_path / "later.lora.h5"
    assert main(tune + ["--start-from", str(adapter), "--out", str(later)]) == 0
    chained = json.loads(manifest_path(later).read_text())["started_from"]
    assert chained["adapter_sha256"] == replaced["adapter_sha256"] and chained["history"] == replaced["history"]
    with pytest.raises(SystemExit, match="that adapter has rank 2, this run --rank 4"):
        main(tune + ["--start-from", str(adapter), "--out", str(later), "--rank", "4"])
    with pytest.raises(SystemExit, match="--start-from: adapter .*: not a .lora.h5 file"):
        main(tune + ["--start-from", str(tmp_path / "tiny-preset"), "--out", str(later)])


@pytest.mark.slow  # the whole `chatlens tune --train blocks` on a tiny preset
def test_tune_blocks_writes_a_whole_model_that_serves_as_a_tuned_one(model_cache, tmp_path):
    import json

    from cli.main import main
    from pipeline.model.loading.sources import resolve_model
    from pipeline.model.decoding.answer_vocabulary import COMMON_PIECES
    from pipeline.model.training.adapters import SHIPPED_ADAPTER, AdapterServing

    preset = tmp_path / "tiny-preset"
    base = tiny_gemma_lm(model_cache)
    base.save_to_preset(str(preset))
    out = tmp_path / "blocks-model"
    tune = ["tune", "--train", "blocks", "--model", str(preset), "--model-cache", str(model_cache), "--limit", "2",
            "--dev-limit", "2", "--epochs", "1", "--learning-rate", "1e-2", "--out", str(out),
            "--checkpoint-dir", str(tmp_path / "ckpt"), "--batch-tokens", "256"]
    assert main(tune) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["trained"] == "blocks" and manifest["hyperparameters"]["learning_rate"] == 1e-2
    assert set(manifest["label_calibration"]) == {"bias", "temperature", "fitted_on"}
    source = resolve_model(str(out), model_cache)
    shipped = AdapterServing.of(SHIPPED_ADAPTER)
    assert source.tuned and source.model_id == "tiny-preset+blocks-model"  # served by the one-pass engine
    assert (source.serving.summary_style, source.serving.reply_style) == (shipped.summary_style, shipped.reply_style)
    assert source.serving.offer_policy == shipped.offer_policy and manifest["model"] == "blocks-model"
    assert source.serving.calibration.to_json() == {k: v for k, v in manifest["label_calibration"].items()
                                                    if k != "fitted_on"}
    learnt = source.serving.answer_vocabulary  # what the decoder may write: its 2 chats' tokens, the common pieces
    assert learnt is not None and set(range(COMMON_PIECES)) < set(learnt.tokens)
    tuned = source.load()
    np.testing.assert_array_equal(np.asarray(tuned.backbone.token_embedding.embeddings.value),
                                  np.asarray(base.backbone.token_embedding.embeddings.value))
    ids = np.array([[2, 651, 6037, 563, 496, 1638]], "int32")
    inputs = {"token_ids": ids, "padding_mask": np.ones_like(ids, bool)}
    assert np.abs(np.asarray(tuned.backbone(inputs)) - np.asarray(base.backbone(inputs))).max() > 1e-3  # trained
    with pytest.raises(SystemExit, match="--train blocks writes a whole model"):
        main(tune[:-6] + ["--out", str(tmp_path / "x.lora.h5")])


def test_second_replies_are_learnt_as_reply_only_examples_of_their_train_chats():
    """`chatlens tune --second-replies add|only`: the second writer's replies (data/second_replies.jsonl)."""
    import argparse

    from pipeline.corpus import DATA_DIR, second_replies
    from pipeline.tune import training_examples

    def data(mode):
        return training_examples(argparse.Namespace(data_dir=DATA_DIR, limit=40, second_replies=mode,
                                                    from_dashboard=None))

    (train, plain), (added, with_second), (only, alone) = data(None), data("add"), data("only")
    second = second_replies()
    answered = [e for e in train if e.window.chat_id in second]
    assert answered and added == train + only
    assert [e.reply for e in only] == [second[e.window.chat_id] for e in answered]
    # the chat's gold label and summary stay as the context the reply follows; only the reply is learnt
    assert all(e.gold == ("reply",) and (e.window, e.label, e.summary) == (t.window, t.label, t.summary)
               for e, t in zip(only, answered))
    assert plain["files"] == ["data/train.jsonl"] and with_second["files"] == ["data/train.jsonl", "data/second_replies.jsonl"]
    assert (with_second["chats"], alone["chats"]) == (40 + len(answered), len(answered))
    assert with_second["second_replies"] == alone["second_replies"] == len(answered) and "second_replies" not in plain
    assert plain["sha256"] != with_second["sha256"]


def test_numbers_written_come_from_the_chat(tiny_lm, chats):
    """A tiny model made eager to write digits (their embeddings pushed along its hidden states)
    writes numbers of its own unconstrained; grounded, every number it writes is in the chat, and
    none is left cut at the length limit."""
    from pipeline.scoring import numbers

    decoder = OnePassDecoder(tiny_lm, summary_tokens=24, reply_tokens=8)
    prompt = decoder.vocabulary.prompt(chats[0].window)[0]
    hidden = np.asarray(tiny_lm.backbone({"token_ids": np.array([prompt]),
                                          "padding_mask": np.ones((1, len(prompt)), bool)}))[0].mean(0)
    embeddings = tiny_lm.backbone.token_embedding.embeddings
    table = np.array(embeddings.value)
    digits = np.flatnonzero((decoder._token_codes >= 0) & (decoder._token_codes < 10))
    for k, token in enumerate(digits):
        table[token] += (3.0 + 0.1 * k) * hidden / (hidden @ hidden)
    embeddings.assign(table)
    windows = [c.window for c in chats]
    texts = [decoder._decode(decoder.vocabulary.prompt(w)[0]) for w in windows]
    free = OnePassDecoder(tiny_lm, summary_tokens=24, reply_tokens=8, ground_numbers=False).run(windows, ["all"] * 8)
    assert all(numbers(o.summary) - numbers(chat) for o, chat in zip(free, texts))  # numbers of its own
    grounded = decoder.run(windows, ["all"] * 8)
    assert sum(bool(numbers(o.summary)) for o in grounded) >= 4  # it still writes numbers: the chat's
    for output, chat in zip(grounded, texts):
        assert numbers(output.summary) <= numbers(chat), output.summary
        assert numbers(output.reply or "") <= numbers(chat), output.reply


def test_format_2_hides_handle_digits_from_the_model_and_from_its_number_grounding(tiny_lm):
    from datetime import datetime, timezone

    from chatlens.contracts import ChatMessage, ChatWindow
    from pipeline.model.decoding import grounding

    text = "@115911 order 5512 never came, see https://t.co/77x"
    message = ChatMessage(chat_id="c", message_id="m", sender="customer", user_id="u", text=text,
                          sent_at=datetime(2026, 11, 1, tzinfo=timezone.utc))
    window = ChatWindow(chat_id="c", window_id="w", customer_id="u", messages=[message])
    for prompt_format, seen in ((1, {"115911", "5512", "77"}), (2, {"5512"})):
        decoder = OnePassDecoder(tiny_lm, prompt_format=prompt_format)
        prompt, _ = decoder.vocabulary.prompt(window)
        table = grounding.number_table([decoder._decode(prompt)])[0]
        numbers = {"".join(grounding.ALPHABET[c] for c in row if c >= 0) for row in table} - {""}
        assert numbers == seen
