"""Automatic checks for what the blind usability review fails (`../shared/quality-rubric.md`).

Overlap scores reward a fluent house style; the review asks whether an agent can rely on a
summary and send a draft. Some of its failure classes can be seen in the text alone, and each
check below finds one, as a pure function that returns the reason (or None):

- `claimed_action`: a draft says an action was already taken ("I've passed this to billing",
  "J'ai transmis…") that no message of the chat shows;
- `unsupported_promise`: a draft promises a refund, compensation or deadline the chat never
  mentions ("a full refund", "within 24 hours");
- `third_person`: a draft speaks about the customer ("the customer", "le client") instead of to them;
- `number_from_handle`: a number that the chat only has inside a handle, link, e-mail address
  or hashtag (`@115911` read as an order number);
- `status_contradicts_label`: a summary whose stated feeling or status contradicts the label
  ("the customer thanked the agent" on an angry chat, "nothing needed" where a reply is).

They read like a strict reviewer, not a perfect one: each pattern list is small, in the corpus's
seven languages, and `tests/pipeline/test_review_checks.py` holds hand-made cases either way.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from chatlens.contracts import ChatWindow
from pipeline import normalise, scoring

_FLAGS = re.IGNORECASE | re.UNICODE

# First-person claims of an action already done; the group `verb` names the action. Each pattern is read in
# every chat (agents write English everywhere) except the two preterite lists, read only in their language.
_CLAIMS = [
    r"\b(?:i|we)(?:'ve| have| had)(?: already| just| now| also)? (?:gone ahead and )?"
    r"(?P<verb>(?:pass|forward|flagg|flag|escalat|rais|logg|report|call|contact|ask|email|e-mail|messag|refund|credit|"
    r"issu|sent|arrang|book|schedul|cancel|process|submitt|open|fil|add|appli|reset|updat|chang|block|froze|"
    r"frozen|unblock|reissu|order|request|inform|notifi|spok|check|reach|put|creat|assign|transferr|"
    r"shar|mark|confirm|rebook|waiv|remov|fix|sort)\w*)",
    r"\b(?:i|we) (?:just |already )?(?P<verb>passed|forwarded|flagged|escalated|raised|logged|reported|called|"
    r"contacted|emailed|messaged|refunded|credited|issued|sent|arranged|booked|scheduled|cancell?ed|processed|"
    r"submitted|opened|filed|reset|blocked|froze|unblocked|reissued|notified|reached out|put in|created|"
    r"transferred|marked|rebooked|waived|removed|fixed|sorted)\b",
    r"\b(?:has|have) (?:already |now |just )?been (?P<verb>(?:refund|escalat|credit|forward|pass|flagg|cancel|"
    r"process|sent|issu|arrang|book|reissu|block|unblock|transferr|waiv|fix|sort)\w*)",
    r"\b(?:j'ai|nous avons|je viens d[e']|nous venons d[e'])\s*(?:d[ée]j[àa] |bien |aussi )?(?P<verb>(?:transmis|signal|"
    r"escalad|remont|appel|contact|demand|rembours|cr[ée]dit|envoy|annul|bloqu|r[ée]serv|programm|ouvert|"
    r"enregistr|transf[ée]r|relanc|v[ée]rifi|fait|pass[ée]|inform|cr[ée]{2})\w*)",
    r"\b(?:he|hemos|ya he|ya hemos|acabo de|acabamos de)\s+(?:ya )?(?P<verb>(?:pasad|traslad|escalad|reportad|"
    r"llamad|contactad|pedid|solicitad|reembolsad|abonad|enviad|cancelad|bloquead|reservad|programad|abiert|"
    r"registrad|transferid|verificad|revisad|comunicad|derivad|avisad|informad|tramitad|gestionad|"
    r"pasar|trasladar|escalar|enviar|abrir|registrar|derivar|tramitar)\w*)",
    r"\b(?:ya )?(?P<verb>envié|escalé|pasé|trasladé|reporté|llamé|contacté|pedí|solicité|reembolsé|cancelé|"
    r"bloqueé|reservé|abrí|registré|derivé|comuniqué|tramité|avisé)(?!\w)(?! (?:usted|ud))",
    r"\b(?:ich habe|wir haben|habe ich|haben wir|hab ich)\b[^.!?\n]{0,60}?\b(?P<verb>weitergeleitet|gemeldet|eskaliert|"
    r"angerufen|kontaktiert|angefragt|erstattet|gutgeschrieben|gesendet|geschickt|verschickt|storniert|"
    r"gesperrt|entsperrt|gebucht|umgebucht|eröffnet|veranlasst|beauftragt|informiert|geprüft|"
    r"übermittelt|angelegt|aufgenommen|weitergegeben|erfasst|bestellt)\b",
    r"\b(?:ho|abbiamo)\s+(?:già |appena |anche )?(?P<verb>(?:inoltrat|segnalat|escalat|chiamat|contattat|chiest|"
    r"rimborsat|accreditat|inviat|mandat|annullat|bloccat|prenotat|apert|registrat|trasferit|"
    r"verificat|passat|girat|aperto|sollecitat|avvisat|informat)\w*)",
    r"\b(?:ik heb|wij hebben|we hebben|heb ik|hebben we)\b[^.!?\n]{0,60}?\b(?P<verb>(?:doorgegeven|doorgestuurd|"
    r"gemeld|geëscaleerd|gebeld|gecontacteerd|gevraagd|terugbetaald|gecrediteerd|verstuurd|gestuurd|"
    r"geannuleerd|geblokkeerd|geboekt|geopend|aangevraagd|ingediend|aangemaakt|ingepland|"
    r"doorgezet|overgedragen)\w*)",
    r"\b(?:j[áa] |eu )?(?P<verb>encaminhei|reportei|escalei|liguei|contactei|contatei|solicitei|reembolsei|"
    r"creditei|enviei|cancelei|bloqueei|reservei|registei|registrei|transferi|verifiquei|passei|"
    r"abri um|abri o|abri a|informei|avisei)\b",
]
_ONLY_IN = {5: "es", 9: "pt"}  # index in _CLAIMS -> the one language whose preterites it lists
_CLAIM = [(re.compile(p, _FLAGS), _ONLY_IN.get(i)) for i, p in enumerate(_CLAIMS)]
# Words that make what follows in the sentence a question or a condition, not a statement or a promise.
_HEDGE = re.compile(
    r"\b(?:whether|if|ask|request|check|look (?:at|into)|review|could|would|shall|can i|may|"
    r"si|s'il|demander|demande|vérifier|examiner|pourr\w*|"
    r"pedir|solicitar|solicitud|revisar|comprobar|podr\w*|"
    r"ob|falls|wenn|prüf\w*|anfrag\w*|beantrag\w*|klär\w*|könnt\w*|"
    r"chieder\w*|richiest\w*|verificar\w*|potre\w*|"
    r"vragen|aanvraag|aanvragen|bekijken|nakijken|zou\w*|"
    r"pedido|analisar|poderi\w*)\b", _FLAGS)
_SENTENCE = re.compile(r"[^.!?。]+[.!?。]*")


def _hedged(text: str, start: int) -> bool:
    """Whether the sentence holding position `start` hedges before it ("to see whether it has been sent")."""
    opening = max(text.rfind(mark, 0, start) for mark in ".!?。\n") + 1
    return bool(_HEDGE.search(text[opening:start]))

# A refund or compensation the draft offers, per language.
_COMPENSATION = re.compile(
    r"\b(?:refund\w*|reimburs\w*|money back|compensat\w*|voucher|goodwill|rembours\w*|dédommag\w*|bon d'achat|"
    r"(?:un|d'un|votre|l'|cet) ?avoir\b|reembols\w*|devoluci[óo]n del importe|compensaci[óo]n|indemniz\w*|erstatt\w*|rückerstatt\w*|"
    r"gutschein|gutschrift|entschädig\w*|rimbors\w*|indennizz\w*|risarciment\w*|terugbetal\w*|"
    r"vergoeding|tegoedbon|compensatie|reembols\w*|estorno|indemniza\w*)", _FLAGS)
# A deadline the draft commits to: the words that must then appear in the chat.
_DEADLINE = re.compile(
    r"\b(?:within|in the next|en moins de|sous|dans les|d'ici|en (?:un plazo de |las próximas |los próximos )?|"
    r"dentro de|innerhalb(?: von)?|binnen|entro|em até|no prazo de)\s+(?P<what>\d+|24|48|72|a|one|two|"
    r"une?|deux|trois|un|una|dos|tres|einem|einer|zwei|drei|uno|due|tre|één|twee|drie|um|uma|dois|três)"
    r"\s+(?P<unit>(?:business |working )?(?:hour|day|week|heure|jour|semaine|hora|día|dia|semana|stunde|tag|"
    r"woche|werktag|ora|ore|giorn|settiman|uur|dag|werkdag|week)\w*)"
    r"|\b(?P<when>by (?:tomorrow|tonight|the end of (?:the )?(?:day|week)|end of (?:day|week)|monday|tuesday|"
    r"wednesday|thursday|friday)|d'ici demain|avant demain|antes de mañana|bis morgen|entro domani|"
    r"vóór morgen|uiterlijk morgen|até amanhã)\b", _FLAGS)

# Subject forms only: "apoio ao cliente", "código do cliente", "service client" or "atención al cliente" name a
# service or a number, not the person the draft is written to.
_THIRD_PERSON = re.compile(
    r"\b(?:the customer|this customer|the client)\b(?!\s+(?:service|support|care|team|portal|account|number|area|"
    r"hub|cent(?:re|er)|desk|line|app|relations|experience))"
    r"|\b(?:le client|la cliente|el cliente|der kunde|die kundin|il cliente|de klant|o cliente)\b(?![-\w])", _FLAGS)

# Where a number in a chat is not a fact about the customer's case.
NOT_FACTS = re.compile("|".join((normalise.EMAIL, normalise.LINK, normalise.HANDLE, normalise.HASHTAG)), _FLAGS)

_POSITIVE_STATUS = re.compile(
    r"(?<!['\"‘“])\b(?:thank(?:s|ed|ing)? (?:the agent|the brand|the team|them|her|him)|(?:is|was|now|feels?|seems?|left|"
    r"ends?|ended) (?:very |quite |now )?(?:happy|satisfied|pleased|delighted|relieved|grateful)|"
    r"all (?:sorted|good|set)|problem (?:is )?(?:solved|fixed|resolved)|"
    r"(?<!un)(?<!not )(?<!isn't )(?<!never )resolved\b(?! yet))", _FLAGS)
_NEGATIVE_STATUS = re.compile(
    r"\b(?:(?:remains?|still|is|stays?|left|ends?|ended) (?:very |quite |clearly |deeply )?(?:unhappy|angry|"
    r"furious|frustrated|upset|dissatisfied|annoyed|disappointed|fed up)|unresolved|not (?:yet )?resolved|"
    r"still (?:waiting|broken|missing|not)|threatens? to (?:leave|cancel|switch|complain))", _FLAGS)
_NOTHING_NEEDED = re.compile(r"\b(?:nothing (?:else |more |further )?(?:is )?(?:needed|to do|left|pending|"
                             r"outstanding)|no (?:further )?action (?:is )?needed)\b", _FLAGS)


def _stem(word: str) -> str:
    return word.lower()[:5]


def transcript_text(window: ChatWindow) -> str:
    """The chat's text, one message a line: what every output is checked against."""
    return "\n".join(m.text for m in window.messages)


def claimed_action(reply: str, window: ChatWindow) -> str | None:
    """A first-person claim of an action already taken that no agent or bot message of the chat names
    (an agent who wrote "I've escalated it" may be quoted; a customer asking for a refund may not)."""
    staff = " ".join(m.text for m in window.messages if m.sender != "customer")
    said = {_stem(w) for w in re.findall(r"\w+", staff.lower())}
    for pattern, language in _CLAIM:
        if language and window.language != language:
            continue
        for match in pattern.finditer(reply):
            if _stem(match.group("verb")) not in said and not _hedged(reply, match.start()):
                return f"claims an action already taken: {match.group().strip()!r}"
    return None


def unsupported_promise(reply: str, window: ChatWindow) -> str | None:
    """A refund, compensation or deadline the draft offers and the chat never mentions."""
    text = transcript_text(window)
    lowered = text.lower()
    if not _COMPENSATION.search(text):
        for sentence in _SENTENCE.findall(reply):
            match = _COMPENSATION.search(sentence)
            if match and not _HEDGE.search(sentence):
                return f"offers {match.group()!r}, which the chat never mentions"
    for match in _DEADLINE.finditer(reply):
        if match.group("when"):
            if match.group("when").split()[-1].lower() not in lowered:
                return f"commits to a deadline the chat lacks: {match.group()!r}"
        elif f"{match.group('what')} {match.group('unit')}".lower() not in lowered:
            return f"commits to a deadline the chat lacks: {match.group()!r}"
    return None


def third_person(reply: str) -> str | None:
    """The draft speaks about the customer instead of to them."""
    match = _THIRD_PERSON.search(reply)
    return f"speaks of {match.group()!r}" if match else None


def number_from_handle(text: str, window: ChatWindow) -> str | None:
    """A number the chat only has inside a handle, link, e-mail address or hashtag."""
    chat = transcript_text(window)
    facts = scoring.numbers(NOT_FACTS.sub(" ", chat))
    anywhere = scoring.numbers(chat)
    borrowed = sorted(n for n in scoring.numbers(text) if n in anywhere and n not in facts)
    return f"takes {', '.join(borrowed)} from a handle or link" if borrowed else None


def status_contradicts_label(summary: str, label: int, reply_needed: bool) -> str | None:
    """A summary whose stated feeling or status contradicts the label (or says nothing is needed
    where a reply is, or of an unhappy customer)."""
    if (reply_needed or label == -1) and (match := _NOTHING_NEEDED.search(summary)):
        return f"says {match.group()!r} on an open problem"
    if label == -1 and (match := _POSITIVE_STATUS.search(summary)):
        return f"says {match.group()!r} of an unhappy customer"
    if label == 1 and (match := _NEGATIVE_STATUS.search(summary)):
        return f"says {match.group()!r} of a happy customer"
    return None


REPLY_CHECKS: dict[str, Callable[[str, ChatWindow], str | None]] = {
    "claims_action": claimed_action,
    "unsupported_promise": unsupported_promise,
    "third_person": lambda reply, window: third_person(reply),
    "number_from_handle": number_from_handle,
}
"""Each draft check by name, as (reply, chat) -> reason or None."""
SUMMARY_CHECKS = ("number_from_handle", "contradicts_label")
CHECK_NAMES = tuple(f"{output}_{check}" for output, checks in (("summary", SUMMARY_CHECKS), ("reply", REPLY_CHECKS))
                    for check in checks)
"""Every check as `chatlens eval` reports it: summary_number_from_handle, ..., reply_claims_action, ..."""


def reply_problems(reply: str, window: ChatWindow) -> dict[str, str]:
    """Every draft check that fails, by name, with its reason."""
    return {name: why for name, check in REPLY_CHECKS.items() if (why := check(reply, window))}


def summary_problems(summary: str, window: ChatWindow, label: int | None, reply_needed: bool) -> dict[str, str]:
    """Every summary check that fails, by name, with its reason."""
    found = {}
    if why := number_from_handle(summary, window):
        found["number_from_handle"] = why
    if label is not None and (why := status_contradicts_label(summary, label, reply_needed)):
        found["contradicts_label"] = why
    return found
