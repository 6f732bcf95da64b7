"""The dashboard in headless Chromium: live queue, keyboard review, audit; screenshots for the docs.

Everything is real: the local Pub/Sub server, the google-cloud-pubsub publisher, the
dashboard under uvicorn with its subscribers, and Debian's Chromium driven by Playwright.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from tests.support.app import (
    PASSWORD,
    dashboard_settings,
    insight_bytes,
    make_insight,
    publisher,
    running_server,
    sample_queue,
    staffed_database,
    store,
)

from app.main import create_app
from chatlens.config import DEFAULT_PROJECT, LAYOUT, topic_path
from localpubsub.admin import ensure_layout

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
ARTIFACTS = Path(__file__).parents[1] / "artifacts"
# Playwright waits 5 s by default; CI's two cores also run a model test meanwhile, and a live
# insight has once taken longer than that to reach the page there.
WAIT_MS = 15_000
XSS_TEXT = "<script>alert('xss')</script> and \"><img src=x onerror=alert(1)>"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium: apt-get install chromium"),
]


@pytest.fixture(autouse=True)
def patient_expect():
    """Give Playwright's `expect` assertions the same wait as page actions (WAIT_MS)."""
    from playwright.sync_api import expect

    expect.set_options(timeout=WAIT_MS)
    yield
    expect.set_options(timeout=5_000)


def live_insight():
    now = datetime.now(timezone.utc)
    return make_insight(
        "qb-31002", "w1", -1,
        [("customer", "Hi, my order #31002 never arrived. The app says delivered but nothing is here."),
         ("bot", "Sorry to hear that! Let me connect you with a colleague."),
         ("customer", "I've been waiting for over an hour and I'm starving. I want my money back.")],
        tenant="quickbite", customer_id="cust-904412", start=now - timedelta(minutes=55), step=60 * 26,
        summary="Order 31002 marked delivered but never arrived; customer waited over an hour and wants a refund.",
        reply="I'm so sorry your order never reached you. I've refunded order 31002 in full; "
              "the money will be back on your card within 3-5 days.",
        flags=["refund_request", "missing_order"],
    ).model_copy(update={"summary_confidence": 0.91, "reply_confidence": 0.87})


def unsure_insight():
    """A chat whose draft the model was unsure of: withheld, its summary flagged (pipeline/model/decoding/offer.py)."""
    return make_insight(
        "zz-unsure", "w1", -1, [("customer", "The thing you sent is not what I had in mind at all.")],
        tenant="flyway", customer_id="cust-unsure", reply=None, flags=["draft_withheld", "summary_unsure"],
        start=datetime.now(timezone.utc) - timedelta(minutes=4),
    ).model_copy(update={"summary_confidence": 0.31, "reply_confidence": 0.22})


def answered_insight():
    """An unhappy chat an agent has answered: no draft offered (OfferPolicy.after_agent false)."""
    return make_insight(
        "zz-answered", "w1", -1, [("customer", "Still no refund."), ("agent", "I've chased it with billing.")],
        tenant="flyway", customer_id="cust-answered", reply=None, flags=["agent_answered"],
        start=datetime.now(timezone.utc) - timedelta(minutes=6),
    )


def library_insight():
    """A chat whose draft is a macro of the team's reply library (pipeline/model/decoding/macros.py)."""
    return make_insight(
        "zz-macro", "w1", -1, [("customer", "Parcel PP-5561027 is four days late.")],
        tenant="flyway", customer_id="cust-macro", flags=["reply_from_library"],
        reply="I'm sorry PP-5561027 still hasn't reached you. I'm checking where it is now.",
        start=datetime.now(timezone.utc) - timedelta(minutes=5),
    ).model_copy(update={"reply_confidence": 0.87})  # the picker's confidence (macros.Choice)


def login(page, base: str, username: str) -> None:
    page.goto(f"{base}/login")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_selector("#chat-list")


def test_live_queue_review_and_audit_in_chromium(tmp_path, pubsub_server):
    from playwright.sync_api import expect, sync_playwright

    ensure_layout(DEFAULT_PROJECT, emulator_host=pubsub_server)
    url, _tokens = staffed_database("sqlite", tmp_path)
    store(url, *sample_queue(),
          make_insight("zz-xss", "w1", 1, [("customer", XSS_TEXT)], tenant="flyway", customer_id="cust-xss",
                       summary=f"Customer wrote {XSS_TEXT}", reply=f"Reply {XSS_TEXT}",
                       start=datetime.now(timezone.utc) - timedelta(minutes=3)),
          unsure_insight(), library_insight(), answered_insight())
    app = create_app(dashboard_settings(url, emulator=pubsub_server))
    ARTIFACTS.mkdir(exist_ok=True)
    dialogs: list[str] = []

    with running_server(app) as base, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1440, "height": 900})
        context.grant_permissions(["clipboard-read", "clipboard-write"], origin=base)
        context.set_default_timeout(WAIT_MS)
        page = context.new_page()
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))

        login(page, base, "alice")
        expect(page.locator("#live")).to_have_attribute("data-state", "live")
        expect(page.locator("#feed")).to_have_attribute("data-state", "running")

        # Hostile chat text stays text: visible as typed, and nothing runs.
        page.locator('a.chat-row[data-chat-id="zz-xss"]').click()
        expect(page.locator("#chat .messages .bubble").first).to_have_text(XSS_TEXT)
        expect(page.locator("#draft")).to_have_value(f"Reply {XSS_TEXT}")
        assert page.locator("#chat img").count() == 0

        # A draft the model was unsure of is not offered, and the page says so plainly.
        page.locator('a.chat-row[data-chat-id="zz-unsure"]').click()
        expect(page.get_by_test_id("draft-withheld")).to_have_text(
            "No draft: the model was unsure (22% confidence). Write the reply yourself.")
        expect(page.locator(".reply-state")).to_have_text("No draft: the model was unsure")
        expect(page.get_by_test_id("summary-confidence")).to_contain_text(
            "The model was unsure of this summary (31% confidence)")
        expect(page.locator("#draft")).to_have_value("")
        # A draft from the team's reply library says where it comes from.
        page.locator('a.chat-row[data-chat-id="zz-macro"]').click()
        expect(page.get_by_test_id("draft-from-library")).to_have_text(
            "Picked from the reply library by ChatLens · 87% sure of the pick")
        expect(page.locator("#draft")).to_have_value(library_insight().reply_draft)
        # Once an agent has answered, no draft is offered, and the page says why.
        page.locator('a.chat-row[data-chat-id="zz-answered"]').click()
        expect(page.locator(".reply-state")).to_have_text("No draft: an agent has already answered in this chat")
        expect(page.locator("#draft")).to_have_value("")

        # A new insight published to Pub/Sub appears without a reload.
        page.evaluate("window.__sameDocument = true")
        client = publisher(pubsub_server)
        client.publish(topic_path(DEFAULT_PROJECT, LAYOUT.insights_topic), insight_bytes(live_insight())).result(timeout=20)
        new_row = page.locator('a.chat-row[data-chat-id="qb-31002"]')
        expect(new_row).to_be_visible()
        assert page.evaluate("window.__sameDocument") is True
        client.stop()

        # Keyboard review: open it, edit (e), approve (a), copy (c).
        new_row.click()
        expect(page.locator("#chat")).to_have_attribute("data-chat-id", "qb-31002")
        expect(page).to_have_url(f"{base}/chats/qb-31002")
        expect(page.locator(".reply-state")).to_have_text("Drafted by ChatLens · 87% model confidence")
        expect(page.get_by_test_id("summary-confidence")).to_have_text("Summary: 91% model confidence")
        page.locator("#chat-title").click()  # focus on the page, not in a field
        page.keyboard.press("e")
        expect(page.locator("#draft")).to_be_focused()
        page.keyboard.press("Control+A")
        reply = ("I'm so sorry your order never reached you, and for the long wait. I've refunded order 31002 "
                 "in full (back on your card within 3-5 days) and added a €10 voucher to your account.")
        page.keyboard.type(reply)
        page.keyboard.press("Escape")
        page.keyboard.press("a")
        expect(page.locator("#chat .flash.ok")).to_have_text("Reply approved.")
        expect(page.locator("#chat")).to_have_attribute("data-status", "approved")
        expect(page.locator("#draft")).to_have_value(reply)
        expect(new_row.locator(".status")).to_have_text("approved")
        page.keyboard.press("c")
        expect(page.locator("#toast")).to_contain_text("copied")
        assert page.evaluate("navigator.clipboard.readText()") == reply

        # j/k move through the queue.
        page.keyboard.press("j")
        expect(page.locator("#chat")).not_to_have_attribute("data-chat-id", "qb-31002")
        page.keyboard.press("k")
        expect(page.locator("#chat")).to_have_attribute("data-chat-id", "qb-31002")
        page.wait_for_timeout(300)
        page.screenshot(path=str(ARTIFACTS / "detail.png"))

        page.goto(f"{base}/")
        expect(page.locator("#live")).to_have_attribute("data-state", "live")
        page.screenshot(path=str(ARTIFACTS / "queue.png"))
        assert page.goto(f"{base}/audit").status == 403  # agents do not see the audit log

        # The supervisor sees the approval in the audit log, with the text before and after.
        supervisor = browser.new_context(viewport={"width": 1440, "height": 900}).new_page()
        supervisor.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
        login(supervisor, base, "sam")
        supervisor.goto(f"{base}/audit?chat_id=qb-31002&action=approve")
        table = supervisor.locator("table.audit-table tbody")
        expect(table.locator("tr")).to_have_count(2)  # one entry: its draft and its status changed
        expect(table).to_contain_text("alice")
        expect(table.locator("tr", has_text="draft").locator("td.old")).to_contain_text("in full; the money")
        expect(table.locator("tr", has_text="draft").locator("td.new")).to_contain_text("€10 voucher")
        expect(table.locator("tr", has_text="status").locator("td.new")).to_have_text("approved")
        supervisor.screenshot(path=str(ARTIFACTS / "audit.png"))
        browser.close()

    assert dialogs == [], f"chat text ran as script: {dialogs}"


def test_a_supervisor_edits_a_reply_macro_in_chromium(tmp_path):
    from playwright.sync_api import expect, sync_playwright

    from chatlens.replies import read_library

    url, _tokens = staffed_database("sqlite", tmp_path)
    export = tmp_path / "reply-library.json"
    app = create_app(dashboard_settings(url, reply_library=str(export)))
    first = read_library().macros[0]  # the migration seeded the shipped library
    body = "I'm sorry about {reference} <b>and</b> the wait. I'm checking it now & will write back within the hour."

    with running_server(app) as base, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_context(viewport={"width": 1440, "height": 900}).new_page()
        page.set_default_timeout(WAIT_MS)
        login(page, base, "sam")
        page.get_by_role("link", name="Reply library").click()
        expect(page).to_have_url(f"{base}/macros")
        macro = page.locator("li.macro").first
        expect(macro.locator("h2")).to_have_text(first.title)

        macro.get_by_text("Edit", exact=True).click()
        macro.get_by_label("Text", exact=True).fill(body)
        macro.get_by_role("button", name="Save").click()

        expect(page.locator(".flash.ok")).to_have_text("Macro saved.")
        saved = page.locator("li.macro").first
        expect(saved.locator(".macro-body")).to_have_text(body)  # markup typed is text, shown as typed
        expect(saved.locator(".macro-meta")).to_contain_text("Edited by sam")
        assert saved.locator("b").count() == 0
        browser.close()

    library = read_library(export)
    assert library.macros[0].body == body and library.macros[0].title == first.title
