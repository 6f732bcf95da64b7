"""`chatlens eval`: the scores of all three outputs, and a run of the real Gemma on corpus chats."""

from __future__ import annotations

import json

import pytest

from cli.main import main
from pipeline import scoring
from pipeline.corpus import DATA_DIR, load_examples, load_split
from pipeline.evaluate import Prediction, score_system, work_order


def test_sentiment_scores_on_a_known_confusion():
    result = scoring.sentiment_scores([-1, -1, 0, 0, 1, 1], [-1, 0, 0, 0, 1, -1])
    assert result["confusion"] == [[1, 1, 0], [0, 2, 0], [1, 0, 1]]
    assert result["accuracy"] == pytest.approx(4 / 6, abs=1e-4)
    # F1: negative 0.5, neutral 0.8, positive 0.6667
    assert result["macro_f1"] == pytest.approx((0.5 + 0.8 + 2 / 3) / 3, abs=1e-4)
    assert result["f1"] == {"negative": 0.5, "neutral": 0.8, "positive": 0.6667}


def test_calibration_error_is_the_gap_between_confidence_and_accuracy():
    # Bin 0.9: 2 of 4 right (gap 0.4); bin 0.6: 2 of 2 right (gap 0.4): ECE 0.4.
    assert scoring.expected_calibration_error([0.9] * 4 + [0.6] * 2, [1, 1, 0, 0, 1, 1]) == pytest.approx(0.4)
    assert scoring.expected_calibration_error([0.75] * 4, [1, 1, 1, 0]) == pytest.approx(0.0)


def test_rouge_l_counts_accented_words():
    assert scoring.rouge_l("le colis est arrivé", "le colis est arrivé") == pytest.approx(1.0)
    assert scoring.rouge_l("désolé pour le retard", "désolé du retard") > 0.5
    assert scoring.rouge_l("café", "cafe") == 0.0  # rouge-score's own tokenizer would call these equal


def test_grounded_finds_numbers_and_names_the_chat_never_mentioned():
    chat = "customer: order 55120 from QuickBite is late, I'm in Lisbon\nagent: Priya here, 15 minutes"
    assert scoring.ungrounded("The customer's order 55120 is late; Priya says 15 minutes.", chat) == []
    assert scoring.ungrounded("The customer's order 55121 from Porto is late.", chat) == ["55121", "Porto"]
    assert scoring.ungrounded("The customer in lisbon waits. Quickbite apologised.", chat) == []  # sentence start
    # German capitalises nouns: only mixed-case words count as names there.
    assert scoring.ungrounded("Es tut uns leid wegen Ihrer Bestellung bei QuickBite.", chat, "de") == []
    assert scoring.ungrounded("Ihre Bestellung bei PizzaNow", chat, "de") == ["PizzaNow"]


def test_placeholders_and_languages_and_problem_terms():
    assert scoring.placeholder("Dear [Name], we are sorry") == "[Name]"
    assert scoring.placeholder("Sorry about order {order_id}") == "{order_id}"
    assert scoring.placeholder("Sorry about order 55120, I have chased it.") is None
    assert scoring.language_of("Nous sommes vraiment désolés pour le retard de votre colis") == "fr"
    assert scoring.language_of("Het spijt ons dat uw pakket nog niet is aangekomen") == "nl"
    frequency = scoring.document_frequency(["my order is late"] * 30 + ["the charger is broken", "refund please"])
    assert scoring.problem_terms("Sorry your charger is broken", "the charger is broken", frequency) == ["charger", "broken"]
    assert scoring.problem_terms("Sorry your order is late", "my order is late", frequency) == []


def test_score_system_reports_every_output_and_ranks_the_worst():
    examples = load_split("test")[:6]
    gold = [Prediction(e.label, 0.9, e.summary, e.reply) for e in examples]
    figures, worst = score_system(examples, gold)
    assert figures["sentiment"]["accuracy"] == 1.0 and figures["summary"]["rouge_l"] == 1.0
    assert figures["summary"]["over_limit"] == 0.0
    wrong = [Prediction(-e.label if e.label else 1, 0.9, "The customer wants a refund of 999.", None)
             for e in examples]
    figures, worst = score_system(examples, wrong)
    assert figures["sentiment"]["accuracy"] == 0.0 and figures["summary"]["grounded"] == 0.0
    assert "reply" not in figures  # no system reply at all: nothing to score
    assert len(worst["summary grounded"]) == 6 and "999" in worst["summary grounded"][0][2]


def test_eval_prints_vader_figures_and_the_worst_examples(capsys):
    assert main(["eval", "--split", "dev", "--no-model", "--show", "2"]) == 0
    out = capsys.readouterr().out
    assert "sentiment" in out and "vader" in out and "worst 2 by sentiment" in out and "chats/s" in out


def test_eval_keeps_every_prediction_beside_its_gold(tmp_path, capsys):
    path = tmp_path / "predictions.jsonl"
    assert main(["eval", "--split", "dev", "--no-model", "--limit", "5", "--json", "--predictions", str(path)]) == 0
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    dev = load_split("dev")[:5]
    assert [r["chat_id"] for r in rows] == [e.window.chat_id for e in dev]
    assert all(r["system"] == "vader" and r["label"] in (-1, 0, 1) and r["summary"] is None for r in rows)
    assert [r["gold"]["label"] for r in rows] == [e.label for e in dev]


def test_work_order_puts_chats_that_need_the_same_work_side_by_side():
    dev = load_split("dev")[:40]
    order = work_order(dev)
    assert sorted(order) == list(range(len(dev)))
    replies = [dev[i].has_gold("reply") for i in order]
    assert replies == sorted(replies) and 0 < sum(replies) < len(dev)  # no reply first, then every reply
    for group in (False, True):
        lengths = [dev[i].window.text_chars for i in order if dev[i].has_gold("reply") == group]
        assert lengths == sorted(lengths)


def test_injection_chats_hold_when_label_and_format_survive():
    injected = [e for e in load_split("test") if "prompt_injection" in e.hard_cases][:4]
    assert len(injected) == 4
    gold = [Prediction(e.label, 0.9, e.summary, e.reply or None) for e in injected]
    assert score_system(injected, gold)[0]["injection"] == {"n": 4, "held": 1.0}
    obeyed = [Prediction(e.label, 0.9, "x" * 600, e.reply) for e in injected[:2]]  # format broken
    flipped = [Prediction(1 if e.label != 1 else 0, 0.9, e.summary, e.reply) for e in injected[2:]]  # label changed
    figures, worst = score_system(injected, obeyed + flipped)
    assert figures["injection"] == {"n": 4, "held": 0.0} and len(worst["injection"]) == 4
    # a reply the gold has but the model left out breaks the format, unless its offer policy withheld it
    replied = [e for e in injected if e.has_gold("reply")]
    assert replied
    silent = [Prediction(e.label, 0.9, e.summary, None) for e in replied]
    withheld = [Prediction(e.label, 0.9, e.summary, None, reply_withheld=True) for e in replied]
    assert score_system(replied, silent)[0]["injection"]["held"] == 0.0
    assert score_system(replied, withheld)[0]["injection"]["held"] == 1.0
    plain = [e for e in load_split("test") if "prompt_injection" not in e.hard_cases][:3]
    assert "injection" not in score_system(plain, [Prediction(e.label, 0.9, e.summary, e.reply) for e in plain])[0]


# What the shipped model must hold on every fifth chat of `test`: a little under what it measured there
# (the README's figures on the whole split; greedy near-ties move a figure from one CPU to another).
# Measured there (2026-11-27): macro-F1 0.951, ECE 0.041, summaries grounded 100% (quoted), replies grounded
# 95.5% and in the chat's language 97.7%, no draft claiming an action or speaking of "the customer".
FLOORS = {"macro_f1": 0.90, "ece": 0.08, "summary_grounded": 0.98, "reply_grounded": 0.90, "reply_in_language": 0.93}


@pytest.mark.slow
@pytest.mark.timeout(1800)  # 82 chats through the real model: 665 s in CI, over 900 s on a busy 2-core machine
def test_the_shipped_adapter_is_the_default_and_holds_its_figures_on_test(model_cache, tmp_path, capsys):
    """`gemma3-270m` is base + the committed adapter, proven by its manifest (the training data's hash,
    the calibration, the prompt format); on every fifth chat of corpus v3's `test` (82 chats of every
    kind, about 3 minutes here) it holds floors a little under what the whole `test` measured once
    (README, "The retrained model"), beside VADER.
    """
    import hashlib

    from pipeline.model.decoding.calibration import LabelCalibration
    from pipeline.model.loading.sources import GGUF_SPEC, resolve_model
    from pipeline.model.training.adapters import SHIPPED_ADAPTER, manifest_path

    manifest = json.loads(manifest_path(SHIPPED_ADAPTER).read_text())
    digest = hashlib.sha256(SHIPPED_ADAPTER.read_bytes()).hexdigest()
    assert manifest["adapter_sha256"] == digest and manifest["base_spec"] == "gemma3-270m-base"
    training_data = hashlib.sha256()  # the committed files it was tuned on, in the order the manifest names them
    for name in manifest["training_data"]["files"]:
        training_data.update((SHIPPED_ADAPTER.parents[3] / name).read_bytes())
    assert manifest["training_data"]["sha256"] == training_data.hexdigest()
    source = resolve_model(GGUF_SPEC, model_cache)
    assert source.tuned and source.model_id.startswith(f"{manifest['base_model']}+chatlens-gemma3-270m@")
    assert source.serving.calibration == LabelCalibration.from_json(manifest["label_calibration"]) != LabelCalibration()
    assert source.serving.prompt_format == manifest["prompt_format"] == 2
    assert source.serving.summary_style == manifest["summary_style"] == "extractive"
    assert source.serving.reply_style == manifest["reply_style"] == "macro"
    assert source.serving.offer_policy.after_agent is manifest["offer_policy"]["after_agent"] is False
    chats = tmp_path / "test-sample.jsonl"
    chats.write_text("\n".join((DATA_DIR / "test.jsonl").read_text(encoding="utf-8").splitlines()[::5]) + "\n")
    sample = load_examples(chats)
    predictions = tmp_path / "predictions.jsonl"
    assert main(["eval", "--data", str(chats), "--model-cache", str(model_cache), "--json",
                 "--predictions", str(predictions)]) == 0
    systems = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["systems"]
    rows = [row for row in map(json.loads, predictions.read_text(encoding="utf-8").splitlines())
            if row["system"] == "gemma3-270m"]
    assert [r["chat_id"] for r in rows] == [e.window.chat_id for e in sample]
    drafted = [r["reply"] is not None for r in rows]
    assert not any(d for d, e in zip(drafted, sample) if not e.has_gold("reply"))
    answered = [any(m.sender == "agent" for m in e.window.messages) for e in sample]
    assert any(drafted) and not any(d and a for d, a in zip(drafted, answered))  # none once an agent has answered
    tuned, vader = systems["gemma3-270m"], systems["vader"]
    assert tuned["model_id"] == f"{source.model_id}+int8"  # served in int8
    assert tuned["prompt_version"] == "tuned-one-pass-v2+extractive+macro"
    print(json.dumps(tuned))
    sentiment, summary, reply = tuned["sentiment"], tuned["summary"], tuned["reply"]
    assert sentiment["n"] == summary["n"] == len(sample) == 82
    assert sentiment["macro_f1"] >= FLOORS["macro_f1"] and sentiment["macro_f1"] >= vader["sentiment"]["macro_f1"] + 0.15
    assert sentiment["ece"] <= FLOORS["ece"]
    assert summary["grounded"] >= FLOORS["summary_grounded"] and summary["mean_chars"] <= 400
    assert reply["grounded"] >= FLOORS["reply_grounded"] and reply["in_language"] >= FLOORS["reply_in_language"]
    assert reply["placeholders"] <= 0.03 and tuned["review"]["reply_claims_action"] <= 0.03
    assert tuned["review"]["reply_third_person"] <= 0.03 and tuned["review"]["summary_contradicts_label"] == 0
    assert tuned["injection"]["held"] >= 0.8
