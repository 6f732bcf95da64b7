"""The automatic review checks on hand-made drafts and summaries, each failure class both ways."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from chatlens.contracts import ChatMessage, ChatWindow
from pipeline import review_checks as checks
from pipeline.evaluate import Prediction, review_figures
from pipeline.corpus import Example


def chat(*messages: tuple[str, str], language: str = "en") -> ChatWindow:
    start = datetime(2026, 9, 1, tzinfo=timezone.utc)
    return ChatWindow(chat_id="c1", window_id="w1", tenant="t", language=language, customer_id="u1", closed=True,
                      messages=[ChatMessage(chat_id="c1", message_id=f"m{i}", sender=sender, user_id=sender,
                                            text=text, sent_at=start + timedelta(minutes=i))
                                for i, (sender, text) in enumerate(messages)])


LATE = chat(("customer", "Order 80317 is 70 minutes late and the curry is cold. I want my money back."))
ESCALATED = chat(("customer", "My bill doubled this month."),
                 ("agent", "I've escalated it to billing; they will reply by email."),
                 ("customer", "Fine, but I'm not happy."))


@pytest.mark.parametrize("reply", [
    "I've passed your complaint about order 80317 to the restaurant.",
    "I have already asked the hotel to refund you.",
    "We've gone ahead and refunded the curry.",
    "Your refund has been processed.",
    "J'ai transmis votre réclamation à notre équipe.",
    "He escalado tu caso al equipo de facturación.",
    "Ya envié un mensaje al repartidor.",
    "Ich habe Ihre Beschwerde an das Team weitergeleitet.",
    "Ho già inoltrato la segnalazione al reparto tecnico.",
    "Ik heb je klacht doorgegeven aan de bezorger.",
    "Já encaminhei o seu pedido para a equipa de faturação.",
])
def test_a_claimed_action_the_chat_does_not_show_is_flagged(reply):
    language = "es" if reply.startswith("Ya envié") else "pt" if reply.startswith("Já") else "en"
    assert checks.claimed_action(reply, LATE.model_copy(update={"language": language}))


def test_preterite_lists_are_read_in_their_own_language_only():
    french = LATE.model_copy(update={"language": "fr"})
    assert checks.claimed_action("Où souhaitez-vous être contacté ?", french) is None  # not Spanish "contacté"
    assert checks.claimed_action("Contacté al repartidor.", LATE.model_copy(update={"language": "es"}))


def test_a_hedged_clause_is_no_claim():
    assert checks.claimed_action("I'll check whether the refund has already been sent.", LATE) is None


@pytest.mark.parametrize("reply", [
    "I'm sorry order 80317 arrived 70 minutes late and cold. I can ask the restaurant to review it now; could you send a photo?",
    "I'll pass your complaint to the restaurant team right away.",
    "Could you tell me the order number so I can check?",
    "Je peux transmettre votre réclamation à notre équipe dès maintenant.",
    "Si me envías una foto, lo escalo ahora mismo.",
    "Envie-nos o número da encomenda, por favor.",  # Portuguese imperative, not a claim
    "Ich kann Ihre Beschwerde jetzt an das Team weiterleiten.",
])
def test_an_offer_or_a_question_is_no_claim(reply):
    assert checks.claimed_action(reply, LATE) is None


def test_an_action_the_agent_took_in_the_chat_may_be_referred_to():
    assert checks.claimed_action("As I said, I've escalated your bill to billing.", ESCALATED) is None
    # ... but the customer's own words do not make an agent's action true.
    assert checks.claimed_action("I've refunded the curry.", LATE)


@pytest.mark.parametrize("reply,flagged", [
    ("You'll get a full refund for order 80317.", False),  # the customer asked for their money back
    ("I'm sorry about the double bill; a refund is on its way.", True),
    ("I'm sorry about the double bill; shall I ask billing whether a refund is possible?", False),
    ("Wir schicken Ihnen einen Gutschein.", True),
    ("We will fix it within 24 hours.", True),
    ("Le technicien passera d'ici demain.", True),
    ("Could you send the bill so I can check it?", False),
])
def test_promises_the_chat_does_not_support(reply, flagged):
    window = LATE if "80317" in reply else ESCALATED
    assert bool(checks.unsupported_promise(reply, window)) is flagged


def test_a_deadline_the_chat_states_may_be_repeated():
    window = chat(("customer", "Your app says the engineer comes within 24 hours. Is that right?"))
    assert checks.unsupported_promise("Yes, the engineer comes within 24 hours.", window) is None


@pytest.mark.parametrize("reply,flagged", [
    ("The customer is upset about the late order.", True),
    ("We should apologise to the client.", True),
    ("Je suis désolé, le client attend depuis une heure.", True),
    ("El cliente quiere un reembolso.", True),
    ("Der Kunde möchte sein Geld zurück.", True),
    ("I'm sorry you waited so long; our customer service team can call you today.", False),
    ("Pode me informar o código do cliente?", False),
    ("Vou enviar o caso para a nossa equipa de apoio ao cliente.", False),
    ("Contact the customer support line on the back of your card.", False),
    ("Lo siento mucho, ¿me das el número de pedido?", False),
])
def test_third_person(reply, flagged):
    assert bool(checks.third_person(reply)) is flagged


def test_a_number_from_a_handle_or_link_is_no_fact():
    thread = chat(("customer", "@115911 @SkyWayHelp flight cancelled again, 3rd time this month https://t.co/x81 #fail"),
                  ("agent", "@115911 Sorry to hear that. Please DM us your booking ref."))
    assert checks.number_from_handle("Customer reports cancelled order 115911.", thread)
    assert checks.number_from_handle("Flight 81 was cancelled.", thread)
    assert checks.number_from_handle("Flight cancelled for the 3rd time this month.", thread) is None
    # A number the chat states as a fact stays a fact, even next to a handle.
    tagged = chat(("customer", "@204877 where is order #40917? Order 204877 was paid."))
    assert checks.number_from_handle("Asks where order #40917 is.", tagged) is None
    assert checks.number_from_handle("Order 204877 was paid.", tagged) is None


@pytest.mark.parametrize("summary,label,reply_needed,flagged", [
    ("The customer thanked the agent for the refund.", -1, True, True),
    ("Order 80317 came cold; the customer is happy now.", -1, True, True),
    ("Order 80317 came cold; nothing needed.", -1, True, True),
    ("Asked about the card fee; answered. Nothing left to do.", 0, False, False),
    ("Asked about the card fee; nothing needed.", 0, True, True),
    ("Bill doubled; agent escalated, customer remains unhappy.", 1, False, True),
    ("Bill doubled; the agent fixed it and the customer is happy.", 1, False, False),
    ("Bill doubled; escalated to billing, not resolved yet.", -1, True, False),
    ("Usually happy with ParcelPoint, but parcel PP-6915524 is lost.", -1, True, False),
])
def test_a_summary_that_contradicts_the_label(summary, label, reply_needed, flagged):
    assert bool(checks.status_contradicts_label(summary, label, reply_needed)) is flagged


def test_eval_reports_the_share_each_check_flags():
    examples = [Example(LATE, -1, "gold", "gold reply"), Example(ESCALATED, -1, "gold", "gold reply")]
    predictions = [Prediction(-1, 0.9, "Order 80317 is late; nothing needed.", "I've refunded you."),
                   Prediction(-1, 0.9, "Bill doubled; escalated to billing.", "Sorry about the bill; billing will email you.")]
    figures, flagged = review_figures(examples, predictions)
    assert figures["replies"] == 2 and figures["reply_claims_action"] == 0.5
    assert figures["summary_contradicts_label"] == 0.5 and figures["reply_third_person"] == 0.0
    assert [i for _, i, _ in flagged["review: reply claims_action"]] == [0]
