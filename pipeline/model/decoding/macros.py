"""Reply drafts from the team's reply library: the model picks a macro, it never writes the reply.

A 270M model's own drafts claim actions nobody took and promise refunds the chat never offered
(the blind review, quality-rubric.md). A macro was written by the team: its promises are the
team's to make. What the model adds is the choice: its own decoded draft (`guide`, in the
customer's language) and the customer's messages name the problem, and the macro whose title
and keywords share most of their words wins (`extractive.content_words`: word stems, numbers whole).
A macro the draft checks fail for the chat (`review_checks`: a refund it never mentions) is never
picked. Two other pickers did worse on dev (README, "Which macro"): the decoded summary's words in
place of the draft's, and the model's likelihood of each macro as its reply.
`{reference}` in a macro stands for the first order, parcel, booking or ticket code the customer
gave; a macro using it is only picked for a chat that has one, and is preferred on a tie.

The macros are the chat's language's (`ChatWindow.language`, its primary subtag); a chat without
one gets the language whose macros the customer's words meet most (else the library's first).
Where nothing matches, the language's macro without keywords (the catch-all) is used; a language
with no macros gets no draft.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass

from chatlens.contracts import REFERENCE_PLACEHOLDER as REFERENCE
from chatlens.contracts import ChatWindow, ReplyLibrary, ReplyMacro
from pipeline.model.decoding.extractive import content_words, sentences
from pipeline.review_checks import reply_problems

MAX_OPENING_CHARS = 240
_CODE = re.compile(r"(?<![\w-])(?:[A-Za-z]{1,5}-?\d{3,}[A-Za-z0-9-]*|\d{5,})(?![\w-])")
"""An order, parcel, booking or ticket code: letters then digits (`PP-5561027`, `AB12345`) or a
number of five digits or more (`58213`); years, times, amounts and short counts are not."""


def reference(window: ChatWindow) -> str | None:
    """The first code in the customer's messages, as they wrote it."""
    for message in window.messages:
        if message.sender == "customer" and (found := _CODE.search(message.text)):
            return found.group(0)
    return None


def _primary(tag: str) -> str:
    """A language tag's primary subtag, as macros and chats are matched: "pt-BR" -> "pt"."""
    return tag.split("-")[0].lower()


def _customer_words(window: ChatWindow) -> set[str]:
    return content_words(" ".join(m.text for m in window.messages if m.sender == "customer"))


def in_language(library: ReplyLibrary, language: str | None) -> list[ReplyMacro]:
    """The library's macros in one language, matched on the primary subtag ("pt" and "pt-BR" alike),
    in the library's order: the same macros in the same places in every language
    (tests/pipeline/test_macros.py)."""
    wanted = _primary(language) if language else None
    return [m for m in library.macros if _primary(m.language) == wanted]


def language_of(window: ChatWindow, library: ReplyLibrary) -> str | None:
    """The chat's language as the library knows it: its own (primary subtag); for a chat without
    one, the language whose macros share most words with the customer's, else the library's first
    (the team's own). None only for an empty library."""
    if window.language:
        return _primary(window.language)
    said = _customer_words(window)
    shared: dict[str, int] = {}
    for macro in library.macros:
        language = _primary(macro.language)
        shared[language] = shared.get(language, 0) + len(_macro_words(macro, body=True) & said)
    return max(shared, key=shared.__getitem__, default=None)  # a tie: the first in library order


def _macro_words(macro: ReplyMacro, body: bool = False) -> set[str]:
    return content_words(f"{macro.title} {macro.keywords}" + (f" {macro.body}" if body else ""))


def candidates(library: ReplyLibrary, language: str | None, code: str | None) -> list[ReplyMacro]:
    """The macros a chat may get: its language's, those using `{reference}` only where it has one."""
    return [m for m in in_language(library, language) if code is not None or REFERENCE not in m.body]


def filled(macro: ReplyMacro, code: str | None) -> str:
    """The macro's text for a chat, `{reference}` filled in with its code."""
    return macro.body.replace(REFERENCE, code or "")


@dataclass(frozen=True)
class Choice:
    """A picked macro and how sure the picker is of it: the softmax share of its score among the
    chat's candidates. Near 1 where no other macro matches the chat's words; under a half for a
    tie of two (the other candidates keep a little); 1/n where nothing matched and the catch-all
    stands in. A wrong problem is the review's
    commonest fault in library drafts, and on dev it came mostly with low shares (README, "Drafts
    offered only when the pick is sure"): the offer policy withholds those."""

    macro: ReplyMacro
    confidence: float


def choose(window: ChatWindow, library: ReplyLibrary, guide: str | None = None) -> Choice | None:
    """The macro whose title and keywords best match the model's draft and the customer's messages:
    each shared word weighs by how few of the candidates name it (a word every macro names tells
    nothing), once per side; then one using the chat's reference; then the library's order; never
    one the draft checks fail for this chat. None: the language has no macros, or none matches and
    it has no catch-all."""
    code = reference(window)
    found = candidates(library, language_of(window, library), code)
    said = _customer_words(window)
    drafted = content_words(guide or "")
    named = [_macro_words(macro) for macro in found]
    naming = Counter(word for words in named for word in words)

    def weight(index: int) -> float:  # rounded: a tie is a tie in every process, whatever its hash seed
        return round(sum(math.log(1 + len(found) / naming[word]) * ((word in said) + (word in drafted))
                         for word in sorted(named[index])), 9)

    # a macro the draft checks fail for this chat (a refund the chat never mentions) is never picked
    allowed = {i: weight(i) for i, macro in enumerate(found) if not reply_problems(filled(macro, code), window)}
    best = max(allowed, key=lambda i: (allowed[i], REFERENCE in found[i].body, -i), default=None)
    if best is None or allowed[best] <= 0:
        best = next((i for i in allowed if not found[i].keywords.strip()), None)
        if best is None:
            return None
    return Choice(found[best], 1 / sum(math.exp(w - allowed[best]) for w in allowed.values()))


def pick(window: ChatWindow, library: ReplyLibrary, guide: str | None = None) -> ReplyMacro | None:
    """The macro `choose` picks, without its confidence."""
    choice = choose(window, library, guide)
    return choice.macro if choice else None


def opening(window: ChatWindow, library: ReplyLibrary, guide: str | None) -> str | None:
    """The model draft's first sentence where it only restates the problem: each of its words the
    customer's or the language's macros' own (no word of a fact the customer did not give), and no
    draft check failing (no action claimed, nothing promised, no "the customer"). None otherwise."""
    first = next(iter(sentences(guide or "")), None)
    if first is None or len(first) > MAX_OPENING_CHARS:
        return None
    language = language_of(window, library)
    allowed = _customer_words(window).union(
        *(_macro_words(m, body=True) for m in in_language(library, language)))
    if content_words(first) - allowed or reply_problems(first, window):
        return None
    return first


def written(window: ChatWindow, library: ReplyLibrary, macro: ReplyMacro, guide: str | None = None,
            own_opening: bool = False) -> str:
    """The macro's text for this chat, `{reference}` filled in. With `own_opening`, the macro's
    first sentence (its apology) gives way to the model's (`opening`) where that only restates
    the problem."""
    body = filled(macro, reference(window))
    said = own_opening and opening(window, library, guide)
    if said:
        body = " ".join([said, *sentences(body)[1:]])
    return body


def macro_reply(window: ChatWindow, library: ReplyLibrary, guide: str | None = None,
                own_opening: bool = False) -> str | None:
    """The picked macro's text (`written`); None where no macro fits."""
    macro = pick(window, library, guide)
    return None if macro is None else written(window, library, macro, guide, own_opening)
