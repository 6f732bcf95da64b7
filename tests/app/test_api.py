"""Dashboard API and review workflow on a real database (SQLite; PostgreSQL when configured)."""

from __future__ import annotations

import json
import re
import tracemalloc
from datetime import timedelta

import pytest
from tests.support.app import (
    DATABASE_PARAMS,
    T0,
    dashboard_settings,
    make_insight,
    sign_in,
    staffed_database,
    store,
)
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from app.feedback import export_feedback
from app.main import create_app
from app.schemas import WINDOW_OUTPUTS
from chatlens.contracts import ANALYSIS_FIELDS


@pytest.fixture(params=DATABASE_PARAMS)
def staffed(request, tmp_path):
    return staffed_database(request.param, tmp_path)


@pytest.fixture
def database_url(staffed):
    return staffed[0]


@pytest.fixture
def app(database_url):
    store(
        database_url,
        make_insight("neg-old", sentiment=-1, tenant="quickbite", start=T0),
        make_insight("neg-new", sentiment=-1, tenant="streamly", start=T0 + timedelta(minutes=5)),
        make_insight("neu", sentiment=0, tenant="quickbite", start=T0 - timedelta(minutes=30)),
        make_insight("pos", sentiment=1, tenant="flyway", start=T0 - timedelta(hours=1),
                     texts=[("customer", "The refund arrived, thank you, brilliant service")]),
    )
    return create_app(dashboard_settings(database_url))


@pytest.fixture
def alice(app, staffed):
    with TestClient(app) as client:
        yield sign_in(client, staffed[1], "alice")


@pytest.fixture
def second_client(app, staffed):
    def make(username: str) -> TestClient:
        return sign_in(TestClient(app), staffed[1], username)  # the app is already started
    return make


def ids(response) -> list[str]:
    assert response.status_code == 200, response.text
    return [item["chat_id"] for item in response.json()["items"]]


def test_queue_puts_unhappy_customers_first_then_the_longest_waiting(alice):
    response = alice.get("/api/chats")
    assert ids(response) == ["neg-old", "neg-new", "neu", "pos"]
    assert response.json()["counts"] == {"negative": 2, "neutral": 1, "positive": 1}
    assert response.json()["total"] == 4


def test_queue_filters_by_sentiment_brand_status_and_assignee(alice):
    assert ids(alice.get("/api/chats", params={"sentiment": "negative"})) == ["neg-old", "neg-new"]
    by_brand = alice.get("/api/chats", params={"tenant": "quickbite"})
    assert ids(by_brand) == ["neg-old", "neu"]
    assert by_brand.json()["counts"] == {"negative": 1, "neutral": 1, "positive": 0}

    assert alice.post("/api/chats/neu/assign", json={"assignee": "me"}).status_code == 200
    assert alice.post("/api/chats/pos/assign", json={"assignee": "bob"}).status_code == 200
    assert ids(alice.get("/api/chats", params={"assignee": "me"})) == ["neu"]
    assert ids(alice.get("/api/chats", params={"assignee": "bob"})) == ["pos"]
    assert ids(alice.get("/api/chats", params={"assignee": "none"})) == ["neg-old", "neg-new"]

    assert alice.post("/api/chats/pos/handled").status_code == 200
    assert ids(alice.get("/api/chats")) == ["neg-old", "neg-new", "neu"]  # open = not handled
    assert ids(alice.get("/api/chats", params={"status": "handled"})) == ["pos"]
    assert len(ids(alice.get("/api/chats", params={"status": "all"}))) == 4
    assert alice.get("/api/tenants").json() == ["flyway", "quickbite", "streamly"]
    assert alice.get("/api/chats", params={"sentiment": "furious"}).status_code == 422


def test_search_matches_transcript_words_and_prefixes(alice):
    assert ids(alice.get("/api/chats", params={"q": "brilliant"})) == ["pos"]
    assert ids(alice.get("/api/chats", params={"q": "BRILL refund", "status": "all"})) == ["pos"]
    assert ids(alice.get("/api/chats", params={"q": "neg-new"})) == ["neg-new"]
    assert ids(alice.get("/api/chats", params={"q": "nothing-like-this"})) == []
    for hostile in ['"', "%", "_", "NEAR(a b)", "a OR b*", "'; DROP TABLE chats; --", "\\"]:
        assert alice.get("/api/chats", params={"q": hostile}).status_code == 200, hostile
    assert len(ids(alice.get("/api/chats"))) == 4


def test_detail_has_transcript_summary_confidence_and_draft(alice):
    chat = alice.get("/api/chats/neg-old").json()
    assert chat["sentiment"] == "negative" and chat["confidence"] == pytest.approx(0.82)
    assert chat["scores"] == pytest.approx({"negative": 0.82, "neutral": 0.13, "positive": 0.05})
    assert chat["summary"].startswith("Customer of chat neg-old")
    assert chat["draft"].startswith("I'm sorry your order is late")
    assert [m["sender"] for m in chat["transcript"]] == ["customer", "agent", "customer"]
    assert chat["version"] == 1 and chat["status"] == "new"
    assert alice.get("/api/chats/nope").status_code == 404


# Outputs the chat row copies are shown under the review's names; every other one under its own.
API_NAMES = {"sentiment": "predicted_sentiment", "reply_draft": "draft"}


def test_detail_returns_every_model_output_of_the_current_window(alice, database_url):
    insight = make_insight("flagged", "w7", sentiment=0, flags=["refund", "vip"], start=T0 + timedelta(minutes=9))
    store(database_url, insight)
    chat = alice.get("/api/chats/flagged").json()
    sent = insight.model_dump(mode="json")
    assert set(WINDOW_OUTPUTS) <= set(ANALYSIS_FIELDS) and {"scores", "flags"} <= set(WINDOW_OUTPUTS)
    for name in ANALYSIS_FIELDS:
        assert API_NAMES.get(name, name) in chat, name
    assert {name: chat[name] for name in WINDOW_OUTPUTS} == {name: sent[name] for name in WINDOW_OUTPUTS}
    assert chat["flags"] == ["refund", "vip"]
    assert (chat["predicted_sentiment"], chat["confidence"], chat["summary"], chat["draft"]) == (
        "neutral", sent["confidence"], sent["summary"], sent["reply_draft"])
    detail_schema = alice.get("/openapi.json").json()["components"]["schemas"]["ChatDetail"]
    assert set(WINDOW_OUTPUTS) <= set(detail_schema["required"])
    page = alice.get("/chats/flagged")  # the review pane reads the same detail
    assert page.status_code == 200 and '<span class="tag">vip</span>' in page.text
    assert '<meter min="0" max="1" value="0.7" aria-label="neutral probability">' in page.text


def test_queue_filters_mean_the_same_on_the_pages_and_in_the_api(alice, second_client):
    def page_ids(**params) -> list[str]:
        response = alice.get("/partials/queue", params=params)
        assert response.status_code == 200
        return list(dict.fromkeys(re.findall(r'data-chat-id="([^"]+)"', response.text)))

    alice.post("/api/chats/neu/assign", json={"assignee": "me"})
    alice.post("/chats/pos/assign", data={"assignee": "me"})
    alice.post("/api/chats/neg-new/handled")
    for params in [{}, {"assignee": "me"}, {"assignee": "none"}, {"status": "handled"}, {"status": "all"},
                   {"sentiment": "negative"}, {"sentiment": "neutral", "assignee": "me"}]:
        assert page_ids(**params) == ids(alice.get("/api/chats", params=params)), params
    assert page_ids(assignee="me") == ["neu", "pos"]
    # Words the filters do not know: the pages ignore them, the API says why.
    assert page_ids(status="bogus", sentiment="furious") == ids(alice.get("/api/chats"))
    for bad in [{"status": "bogus"}, {"sentiment": "furious"}, {"status": "open|all"}]:
        assert alice.get("/api/chats", params=bad).status_code == 422, bad
    sam = second_client("sam")
    assert sam.get("/api/errors", params={"kind": "invalid_insight"}).status_code == 200
    assert sam.get("/api/errors", params={"kind": "bogus"}).status_code == 422


def test_review_workflow_is_audited_with_before_and_after(second_client, alice):
    version = alice.get("/api/chats/neg-old").json()["version"]
    edited = alice.put("/api/chats/neg-old/draft", json={"text": "We are so sorry.", "version": version})
    assert edited.status_code == 200
    assert edited.json()["draft"] == "We are so sorry." and edited.json()["draft_edited"]
    approved = alice.post("/api/chats/neg-old/approve", json={"version": edited.json()["version"]})
    assert approved.json()["status"] == "approved"
    rejected = alice.post("/api/chats/neg-old/reject",
                          json={"version": approved.json()["version"], "reason": "promises too much"})
    assert rejected.json()["status"] == "rejected" and rejected.json()["reject_reason"] == "promises too much"
    assert alice.post("/api/chats/neg-old/handled").json()["status"] == "handled"
    assert alice.post("/api/chats/neg-old/reopen").json()["status"] == "new"
    assert alice.post("/api/chats/neg-old/copied").status_code == 204

    sam = second_client("sam")
    entries = sam.get("/api/audit", params={"chat_id": "neg-old"}).json()
    assert [e["action"] for e in entries] == ["copy", "reopen", "handled", "reject", "approve", "edit"]
    assert {e["actor"] for e in entries} == {"alice"}
    edit = entries[-1]
    assert edit["before"]["draft"].startswith("I'm sorry") and edit["after"]["draft"] == "We are so sorry."
    assert edit["before"]["version"] == 1 and edit["after"]["version"] == 2
    assert entries[-2]["before"]["status"] == "new" and entries[-2]["after"]["status"] == "approved"


def test_approve_with_text_saves_and_approves_in_one_step(alice):
    chat = alice.get("/api/chats/neu").json()
    done = alice.post("/api/chats/neu/approve", json={"version": chat["version"], "text": "Arrives today!"})
    assert done.json()["draft"] == "Arrives today!" and done.json()["status"] == "approved"
    # Editing an approved reply takes the approval back: it was for other words.
    again = alice.put("/api/chats/neu/draft", json={"text": "Arrives tomorrow.", "version": done.json()["version"]})
    assert again.json()["status"] == "new"


def test_two_agents_editing_one_draft_never_overwrite_each_other(second_client, alice):
    bob = second_client("bob")
    seen_by_alice = alice.get("/api/chats/neg-new").json()["version"]
    seen_by_bob = bob.get("/api/chats/neg-new").json()["version"]
    assert alice.put("/api/chats/neg-new/draft", json={"text": "Alice's words", "version": seen_by_alice}).status_code == 200

    clash = bob.put("/api/chats/neg-new/draft", json={"text": "Bob's words", "version": seen_by_bob})
    assert clash.status_code == 409
    assert clash.json()["current"]["draft"] == "Alice's words"
    assert "alice changed this chat" in clash.json()["detail"]
    assert bob.post("/api/chats/neg-new/approve", json={"version": seen_by_bob}).status_code == 409
    assert alice.get("/api/chats/neg-new").json()["draft"] == "Alice's words"

    # With the newer version Bob can go ahead, knowingly.
    newer = clash.json()["current"]["version"]
    assert bob.put("/api/chats/neg-new/draft", json={"text": "Bob's words", "version": newer}).status_code == 200


def test_html_form_conflict_shows_the_newer_text_and_keeps_mine(second_client, alice):
    bob = second_client("bob")
    alice.put("/api/chats/neu/draft", json={"text": "Newer text from alice", "version": 1})
    page = bob.post("/chats/neu/draft", data={"version": "1", "text": "Bob typed this",
                                               "csrf_token": bob.headers["X-CSRF-Token"]},
                    headers={"HX-Request": "true", "HX-Target": "detail"})
    assert page.status_code == 409
    assert "Not saved." in page.text and "Newer text from alice</textarea>" in page.text
    assert "Bob typed this</pre>" in page.text


def test_a_newer_window_becomes_current_and_reopens_the_review(second_client, alice, database_url):
    chat = alice.get("/api/chats/neu").json()
    alice.post("/api/chats/neu/approve", json={"version": chat["version"]})
    later = make_insight("neu", "w2", sentiment=-1, start=T0 + timedelta(minutes=40),
                         texts=[("customer", "Still nothing arrived."), ("customer", "Hello??")])
    older = make_insight("neu", "w0", sentiment=1, start=T0 - timedelta(hours=2))
    store(database_url, later, older)  # the older window arrives last: it must not roll back

    current = alice.get("/api/chats/neu").json()
    assert current["window_id"] == "w2" and current["windows_seen"] == 3
    assert current["sentiment"] == "negative" and current["status"] == "new"
    assert current["transcript"][-1]["text"] == "Hello??"
    assert current["version"] > chat["version"] + 1
    sam = second_client("sam")
    superseded = sam.get("/api/audit", params={"chat_id": "neu", "action": "new_window"}).json()
    assert len(superseded) == 1 and superseded[0]["actor"] == "pipeline"
    assert superseded[0]["before"]["status"] == "approved" and superseded[0]["after"]["window_id"] == "w2"


def test_sentiment_corrections_are_exported_as_feedback(alice, database_url):
    assert alice.post("/api/chats/pos/sentiment", json={"corrected": "neutral"}).json()["sentiment"] == "neutral"
    assert alice.post("/api/chats/neu/sentiment", json={"corrected": "negative"}).status_code == 200
    assert alice.post("/api/chats/neu/sentiment", json={"corrected": "positive"}).status_code == 200
    chat = alice.get("/api/chats/pos").json()
    assert chat["predicted_sentiment"] == "positive" and chat["corrected_sentiment"] == "neutral"
    assert ids(alice.get("/api/chats", params={"sentiment": "neutral"})) == ["pos"]
    rows = export_feedback(database_url)
    assert [{k: r[k] for k in ("chat_id", "window_id", "predicted", "corrected")} for r in rows] == [
        {"chat_id": "pos", "window_id": "w1", "predicted": "positive", "corrected": "neutral"},
        {"chat_id": "neu", "window_id": "w1", "predicted": "neutral", "corrected": "positive"},
    ]
    assert rows[0]["corrected_by"] == "alice"
    assert alice.post("/api/chats/pos/sentiment", json={"corrected": "angry"}).status_code == 422


def test_invalid_requests_are_refused_with_reasons(alice):
    assert alice.put("/api/chats/neu/draft", json={"text": "   ", "version": 1}).status_code == 422
    assert alice.put("/api/chats/neu/draft", json={"text": "x" * 2001, "version": 1}).status_code == 422
    assert alice.post("/api/chats/neu/reject", json={"version": 1, "reason": ""}).status_code == 422
    unknown = alice.post("/api/chats/neu/assign", json={"assignee": "mallory"})
    assert unknown.status_code == 422 and "mallory" in unknown.json()["detail"]
    assert alice.put("/api/chats/nope/draft", json={"text": "hi", "version": 1}).status_code == 404


def test_plain_html_forms_work_without_javascript(alice):
    csrf = alice.headers["X-CSRF-Token"]
    response = alice.post("/chats/neg-old/assign", data={"assignee": "me", "csrf_token": csrf},
                          headers={"X-CSRF-Token": ""}, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/chats/neg-old"
    page = alice.get("/chats/neg-old")
    assert page.status_code == 200 and "@alice" in page.text
    assert alice.get("/api/chats/neg-old").json()["assignee"] == "alice"


def test_ops_endpoints_and_openapi(alice):
    assert alice.get("/healthz").json() == {"status": "ok"}
    ready = alice.get("/readyz")
    assert ready.status_code == 200 and ready.json()["database"] is True and ready.json()["feed"] == "off"
    alice.post("/api/chats/neu/handled")
    metrics = alice.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert 'chatlens_dashboard_queue_size{sentiment="negative"} 2' in metrics.text
    assert 'chatlens_dashboard_actions_total{action="handled"} 1' in metrics.text
    assert "chatlens_dashboard_insights_stored 4" in metrics.text
    # Prometheus's own parser reads it back: names, types and values
    families = {f.name: f for f in text_string_to_metric_families(metrics.text)}
    assert families["chatlens_dashboard_actions"].type == "counter"
    assert families["chatlens_dashboard_queue_size"].type == "gauge"
    assert {s.labels["sentiment"]: s.value for s in families["chatlens_dashboard_queue_size"].samples} == {
        "negative": 2, "neutral": 0, "positive": 1}
    schema = alice.get("/openapi.json").json()
    assert "/api/chats" in schema["paths"] and "/api/chats/{chat_id}/draft" in schema["paths"]
    docs = alice.get("/docs")
    assert docs.status_code == 200 and "/static/vendor/swagger-ui-5.35.0/swagger-ui-bundle.js" in docs.text
    assert alice.get("/static/vendor/swagger-ui-5.35.0/swagger-ui-bundle.js").status_code == 200
    assert alice.get("/static/vendor/htmx-2.0.11.min.js").status_code == 200


def test_corrections_and_reviewed_replies_are_exported_as_examples(alice, database_url, capsys):
    from pipeline.feedback import export_examples
    from cli.main import main

    alice.post("/api/chats/pos/sentiment", json={"corrected": "neutral"})
    neg = alice.get("/api/chats/neg-old").json()
    edited = alice.put("/api/chats/neg-old/draft",
                       json={"text": "Sorry about the wait, I have chased the kitchen.", "version": neg["version"]})
    alice.post("/api/chats/neg-new/approve", json={"version": alice.get("/api/chats/neg-new").json()["version"]})
    assert edited.status_code == 200
    examples = {e.window.chat_id: e for e in export_examples(database_url)}
    assert set(examples) == {"pos", "neg-old", "neg-new"}  # "neu" was never reviewed
    assert examples["pos"].label == 0 and examples["pos"].reply is None and examples["pos"].gold == ("label",)
    assert examples["neg-old"].reply == "Sorry about the wait, I have chased the kitchen."
    assert examples["neg-old"].gold == ("reply",) and examples["neg-old"].label == -1  # the model's, as context
    assert examples["neg-new"].reply == alice.get("/api/chats/neg-new").json()["draft"]
    assert examples["pos"].window.messages[0].text == "The refund arrived, thank you, brilliant service"
    # chatlens eval scores on them: sentiment on the one corrected chat.
    capsys.readouterr()
    assert main(["eval", "--from-dashboard", database_url, "--no-model", "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["chats"] == 3 and report["systems"]["vader"]["sentiment"]["n"] == 1


def test_errors_views_read_a_prefix_of_each_payload_not_the_whole(alice, second_client, database_url):
    """Six 4 MB dead letters used to be loaded (and decoded) whole to show 2,000 characters."""
    from app.db import Database
    from app.models import ErrorEvent

    big = ("é" * 2500 + "x" * 4_000_000).encode()
    db = Database(database_url)
    with db.writing() as session:
        for i in range(6):
            session.add(ErrorEvent(source="deadletters", kind="dead_letter", message_id=f"big-{i}",
                                   error_message="too big", payload=big, attributes={}))
        session.add(ErrorEvent(source="deadletters", kind="dead_letter", message_id="small",
                               error_message="small", payload="short é".encode(), attributes={}))
        session.commit()
    db.dispose()
    sam = second_client("sam")
    sam.get("/api/errors?limit=1")  # everything imported and warm before measuring
    tracemalloc.start()
    try:
        rows = sam.get("/api/errors").json()
        api_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        page = sam.get("/errors")
        page_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert page.status_code == 200 and "é" * 100 in page.text
    assert api_peak < 8_000_000 and page_peak < 8_000_000, (api_peak, page_peak)
    by_id = {row["message_id"]: row for row in rows}
    assert by_id["small"]["payload_preview"] == "short é" and by_id["small"]["payload_bytes"] == 8
    assert by_id["big-0"]["payload_preview"] == "é" * 2000 + " …" and by_id["big-0"]["payload_bytes"] == len(big)
