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
