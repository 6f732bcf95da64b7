"""data/tools/review.py: blind batches from eval predictions, and the tally of verdicts."""

from __future__ import annotations

import json

from pipeline.corpus import load_split
from tests.support.corpus_tools import tool


def test_batches_hide_who_wrote_each_item_and_the_tally_counts_verdicts(tmp_path):
    review = tool("review")
    dev = load_split("dev")[:6]
    predictions = tmp_path / "preds.jsonl"
    predictions.write_text("".join(json.dumps({
        "system": "model", "chat_id": e.window.chat_id, "label": e.label, "confidence": 0.9,
        "summary": f"summary of {e.window.chat_id}", "reply": "a draft" if e.reply else None,
        "gold": {"label": e.label, "summary": e.summary, "reply": e.reply}}) + "\n" for e in dev))
    out = tmp_path / "review"
    assert review.main(["prepare", "--predictions", str(predictions), "--split", "dev", "--with-gold",
                        "--batch-size", "5", "--out", str(out)]) == 0
    key = json.loads((out / "key.json").read_text())
    drafts = sum(e.reply is not None for e in dev)
    assert len(key) == 2 * (len(dev) + drafts)  # model and gold, summary and reply
    batches = sorted(out.glob("batch-*.md"))
    text = "".join(b.read_text() for b in batches)
    assert len(batches) == (len(key) + 4) // 5
    headers = [line[3:] for line in text.splitlines() if line.startswith("## ")]
    assert sorted(headers) == sorted(key)  # an opaque id, nothing of who wrote it
    assert "summary of" not in text.split("## ")[0]
    assert dev[0].window.messages[0].text in text  # each item shows its chat
    # Two reviewers: one passes everything, the other fails the model's summaries.
    (out / "verdicts-a.jsonl").write_text("".join(json.dumps({"item": i, "verdict": "ok"}) + "\n" for i in key))
    (out / "verdicts-b.jsonl").write_text("".join(json.dumps(
        {"item": i, "verdict": "not ok" if k["system"] == "model" and k["kind"] == "summary" else "ok",
         "problems": ["invented fact"]}) + "\n" for i, k in key.items()))
    report = review.tally_verdicts(key, {"a": [json.loads(l) for l in (out / "verdicts-a.jsonl").open()],
                                         "b": [json.loads(l) for l in (out / "verdicts-b.jsonl").open()]})
    cells = report["cells"]
    assert cells["model summary"]["judged"] == 2 * len(dev) and cells["model summary"]["share_ok"] == 0.5
    assert cells["model summary"]["problems"] == {"invented fact": len(dev)}
    assert cells["gold reply"]["share_ok"] == 1.0
    assert report["agreement"] == {"items": len(key), "share": round(1 - len(dev) / len(key), 3)}


def test_offer_finds_the_lowest_threshold_whose_offered_outputs_pass_and_none_where_none_do():
    review = tool("review")
    # ten drafts: the five most confident passed review, one less confident one too
    key = {f"i{n}": {"system": "model", "chat_id": f"c{n}", "kind": "reply"} for n in range(10)}
    confidence = [0.95, 0.9, 0.85, 0.8, 0.75, 0.5, 0.45, 0.4, 0.3, 0.2]
    passed = {0, 1, 2, 3, 4, 6}
    verdicts = {"a": [{"item": f"i{n}", "verdict": "ok" if n in passed else "not ok"} for n in range(10)]}
    predictions = [{"system": "model", "chat_id": f"c{n}", "reply": "draft", "reply_confidence": c}
                   for n, c in enumerate(confidence)]
    predictions.append({"system": "model", "chat_id": "unjudged", "reply": "draft", "reply_confidence": 0.1})
    curve = review.offer_curve(key, verdicts, predictions, "model", "reply", target=0.6, least=5)
    assert (curve["judged"], curve["passed"]) == (10, 6)
    assert curve["auc"] == round(23 / 24, 3)  # a passed draft more confident than a failed one in 23 of 24 pairs
    assert curve["threshold"] == 0.2  # offering all ten: 6 of 10 pass, the target
    assert curve["none_pass_below"] is None  # only three drafts lie below the last passed one: fewer than `least`
    assert review.offer_curve(key, verdicts, predictions, "model", "reply", target=0.7, least=5)["threshold"] == 0.4
    curve = review.offer_curve(key, verdicts, predictions, "model", "reply", target=0.8, least=5)
    assert curve["threshold"] == 0.45  # 6 of 7 pass; at 0.4, 6 of 8 = 75%
    row = next(r for r in curve["curve"] if r["threshold"] == 0.45)
    assert row == {"threshold": 0.45, "offered_judged": 7, "passed": 0.857, "offered_all": round(7 / 11, 3)}
    nobody = {"a": [{"item": i, "verdict": "not ok"} for i in key]}
    assert review.offer_curve(key, nobody, predictions, "model", "reply", target=0.6)["threshold"] is None
    assert review.offer_curve(key, verdicts, predictions, "model", "reply", target=0.6, least=3)["none_pass_below"] == 0.45  # below: 0.4, 0.3, 0.2, all failed
