"""Extractive summaries: the chat's own sentences, quoted, joined by fixed words.

A 270M model narrating a chat swaps who said what, invents agent actions and writes "nothing
needed" on open complaints (the blind review, quality-rubric.md). A summary that only quotes
cannot invent: the customer's problem in their own words, the agent's last message, and a
status read from the label and from who spoke last. The model may still pick: given its own
free-form summary as `guide`, the sentences sharing the most words with it are quoted; its own
words never are.

Quotes are the chat's words in the chat's language, normalised as the model reads them
(`pipeline.normalise`: handles, links and e-mail addresses as markers) with whitespace folded,
cut at a word with an ellipsis where long; " … " joins sentences that do not follow each other.
The connecting words are English, as every ChatLens summary is, whatever the chat's language.
Lines addressed to a model (prompt injections) are never quoted: as the customer's "problem"
they would mislead the agent they were meant to fool.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from chatlens.contracts import MAX_SUMMARY_CHARS, ChatMessage, ChatWindow
from pipeline.model.decoding.text import cut_at_word, sentence_ends
from pipeline.normalise import normalise

CUSTOMER_CHARS = 200  # the customer's quote
STAFF_CHARS = 180  # the agent's quotes together: with the fixed words the whole stays within 512
MIN_WORDS = 3  # a shorter customer sentence ("1", "car", "done 👍") answers a menu or a question: no problem stated
NEW_WORDS = 2  # guide words (a number counts two) a second sentence must add to be worth its room ("thank" is not)
MIN_EARLIER_CHARS = 60  # room an earlier agent quote needs to say something

_TO_MODEL = re.compile(
    r"<\s*/?\s*(?:start_of_turn|end_of_turn|bos|eos)\s*>|\bsystem (?:note|prompt)\b|\bAI assistant\b"
    r"|\b(?:for|to) the (?:AI|model|assistant)\b|\bvoor het model\b|\bignore (?:all|everything|the above|previous)\b"
    r"|\bnegeer alles\b|\blabel\s*[:=]|\bclassify\b", re.IGNORECASE)
"""A line written to a model, not to the agent: the corpus's injections, in their languages."""
_NO_END = re.compile(r"(?:^|[\s(])(?:mr|mrs|ms|dr|st|sr|sra|jr|prof|ing|dott|sig|hr|nr|ref|vs|ca|approx|"
                     r"z\.b|e\.g|i\.e|p\.ex|[^\W\d]|\d{1,2})\.$|\([^)]*$", re.IGNORECASE)
"""A full stop that ends no sentence: after a title, an initial or a German or Dutch ordinal
("am 3. Mai"), or inside an open bracket ("(ref. RB-1)")."""
_LEADING_HANDLES = re.compile(r"^(?:@user[\s,:]*)+")
_STOPWORDS = frozenset(
    "the and for with that this from was were has have had are but not you your they them their its our "
    "she her his him who what when which will would can could been about into than then there also just again "
    "customer customers agent agents asks asked says said wants wanted chat".split())


@dataclass(frozen=True)
class _Sentence:
    text: str
    message: int  # its message's place in the chat
    index: int  # its place in the message

    def follows(self, other: _Sentence) -> bool:
        return self.message == other.message and self.index == other.index + 1


def sentences(text: str) -> list[str]:
    """A message's sentences as they may be quoted: normalised, without the handles it opens with
    (`@user`, a social post's address), no line written to a model, a line a sentence at least,
    whitespace folded."""
    return [sentence for sentence in _pieces(text) if sentence]


def _pieces(text: str) -> list[str | None]:
    """`sentences`, with None for each line left out: what was between two quotes shows as " … "."""
    found: list[str | None] = []
    for line in _LEADING_HANDLES.sub("", normalise(text).strip()).splitlines():
        if _TO_MODEL.search(line):
            found.append(None)
            continue
        start = 0
        for end in [*sentence_ends(line), len(line)]:
            if end < len(line) and _NO_END.search(line[start:end]):
                continue
            sentence = " ".join(line[start:end].split())
            if sentence:
                found.append(sentence)
            start = end
    return found


def _said(window: ChatWindow, m: int) -> list[_Sentence]:
    return [_Sentence(text, m, i) for i, text in enumerate(_pieces(window.messages[m].text)) if text]


def content_words(text: str) -> set[str]:
    """What a guide and a sentence share: numbers and codes whole, other words by their first five
    letters without accents ("delivered" meets "delivery", "portátil" "portable"), function words left out."""
    plain = "".join(c for c in unicodedata.normalize("NFKD", text.lower()) if not unicodedata.combining(c))
    words = re.findall(r"[^\W_]+", plain)
    return {w if _is_number(w) else w[:5] for w in words if _is_number(w) or (len(w) >= 3 and w not in _STOPWORDS)}


def _is_number(word: str) -> bool:
    """An amount, a date or a code (`qh7t2l`): kept whole, it matches only itself."""
    return any(c.isdigit() for c in word)


def _quote(picked: list[_Sentence], limit: int) -> str:
    """The sentences in chat order within `limit`: each gets an equal share of what the shorter ones
    leave (cut at a word where longer), " … " between ones that do not follow each other."""
    picked = sorted(picked, key=lambda s: (s.message, s.index))
    room, shares = limit - 3 * (len(picked) - 1), {}
    for left, sentence in enumerate(sorted(picked, key=lambda s: len(s.text))):
        shares[sentence] = min(len(sentence.text), room // (len(picked) - left))
        room -= shares[sentence]
    text = cut_at_word(picked[0].text, shares[picked[0]])
    for before, sentence in zip(picked, picked[1:]):
        gap = " " if sentence.follows(before) or text.endswith("…") else " … "
        text += gap + cut_at_word(sentence.text, shares[sentence])
    return text


def _named(sentence: _Sentence, guide: set[str]) -> set[str]:
    return content_words(sentence.text) & guide


def _weight(words: set[str]) -> int:
    """How much shared words tell: a number (an order, an amount) twice as much as a word."""
    return sum(2 if _is_number(w) else 1 for w in words)


def _customer_part(window: ChatWindow, guide: set[str]) -> str:
    """Where the customer states the problem: the sentence of their opening (their messages before
    an agent's first) that names most guide words (else its first; an order number alone says
    little), then the one anywhere that names most of the rest (else the one after it, or the one
    before: the praise before a "but")."""
    said = [s for m, message in enumerate(window.messages) if message.sender == "customer" for s in _said(window, m)]
    if not said:
        return "Customer: no message yet."
    candidates = [s for s in said if len(re.findall(r"[^\W_]{2,}", s.text)) >= MIN_WORDS] or said
    agent_from = next((m for m, message in enumerate(window.messages) if message.sender == "agent"),
                      len(window.messages))
    opening = [s for s in candidates if s.message < agent_from] or candidates[:1]
    first = max(opening, key=lambda s: (len(_named(s, guide)), -s.message, -s.index))
    covered = _named(first, guide)
    rest = [s for s in candidates if s is not first]
    second = _most_named(rest, guide, covered) if rest else None
    if second is None or _weight(_named(second, guide) - covered) < NEW_WORDS:
        beside = [s for s in candidates if s.follows(first)] + [s for s in candidates if first.follows(s)]
        second = beside[0] if beside else None
    return f"Customer: “{_quote([first, second] if second else [first], CUSTOMER_CHARS)}”."


def _most_named(candidates: list[_Sentence], guide: set[str], covered: set[str]) -> _Sentence:
    """The sentence naming most guide words not `covered`, numbers counting twice; the earliest on a tie."""
    return max(candidates, key=lambda s: (_weight(_named(s, guide) - covered), -s.message, -s.index))


def _staff_part(window: ChatWindow, guide: set[str]) -> str:
    """The last agent (or bot) message and, where room is left, the latest of theirs before it that
    names more of the guide (the refund before a closing "Glad I could help!")."""
    staff = [m for m, message in enumerate(window.messages) if message.sender != "customer" and _said(window, m)]
    if not staff:
        return ""
    who, last = _who(window.messages[staff[-1]]), _message_quote(window, staff[-1], guide, STAFF_CHARS)
    part = f" {who}'s last message: “{last}”."
    told = {m: _weight(content_words(window.messages[m].text) & guide) for m in staff
            if window.messages[m].sender == window.messages[staff[-1]].sender}
    earlier = [m for m in told if told[m] >= NEW_WORDS and told[m] > told[staff[-1]]]
    if not earlier or STAFF_CHARS - len(last) < MIN_EARLIER_CHARS:
        return part
    return f" {who}, earlier: “{_message_quote(window, earlier[-1], guide, STAFF_CHARS - len(last))}”.{part}"


def _who(message: ChatMessage) -> str:
    return "Agent" if message.sender == "agent" else "Bot"


def _message_quote(window: ChatWindow, m: int, guide: set[str], limit: int) -> str:
    """A staff message whole where it fits, else its sentences that name the guide most, then its
    latest ones (commitments and questions come late, greetings first)."""
    ranked = sorted(_said(window, m), key=lambda s: (-_weight(_named(s, guide)), -s.index))
    picked = [ranked[0]]
    for sentence in ranked[1:]:
        if sum(len(s.text) + 3 for s in [*picked, sentence]) - 3 <= limit:
            picked.append(sentence)
    return _quote(picked, limit)


def status(window: ChatWindow, label: int) -> str:
    """Who the chat waits for, from who spoke last and whether they asked something, and the
    customer's mood from the label, in the past where staff have spoken since (the customer has
    not answered that yet). An unhappy customer with the last word waits for the agent: never
    "nothing needed" on an open complaint."""
    spoken = [m for m in window.messages if sentences(m.text)] or window.messages
    last = spoken[-1]
    asked = any(mark in " ".join(sentences(last.text)) for mark in "?¿")
    customer_last = last.sender == "customer"
    if all(m.sender == "customer" for m in window.messages):
        turn = "no agent reply yet"
    elif not customer_last:
        turn = "waiting for the customer's answer" if asked else f"the {last.sender} spoke last"
    else:
        turn = "waiting for the agent" if asked or label == -1 else "the customer spoke last"
    mood = {-1: "customer unhappy" if customer_last else "customer was unhappy",
            1: "customer satisfied" if customer_last else "customer was positive"}.get(label)
    return f"{mood}, {turn}" if mood else turn


def extractive_summary(window: ChatWindow, label: int, guide: str | None = None) -> str:
    """`Customer: “…”. [Agent, earlier: “…”.] Agent's last message: “…”. Status: ….`, within
    `MAX_SUMMARY_CHARS`: quotes of the chat and fixed words. `guide`, the model's free-form
    summary, picks which sentences are quoted."""
    words = content_words(guide or "")
    summary = f"{_customer_part(window, words)}{_staff_part(window, words)} Status: {status(window, label)}."
    assert len(summary) <= MAX_SUMMARY_CHARS, summary  # the quotes' limits and the fixed words add up to less
    return summary
