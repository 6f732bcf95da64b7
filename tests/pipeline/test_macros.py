"""Reply drafts from the reply library (pipeline/model/decoding/macros.py): the team's words, the
model's pick; the shipped library; the pipeline's reading of the library file."""

from __future__ import annotations

import os
import time

import pytest

from chatlens.contracts import ReplyLibrary, ReplyMacro
from chatlens.replies import read_library, write_library
from pipeline.corpus import load_split
from pipeline.model.decoding.macros import REFERENCE, choose, language_of, macro_reply, opening, pick, reference
from pipeline.model.loading.reply_library import ReplyLibraryFile
from pipeline.review_checks import reply_problems
from tests.pipeline.test_extractive import window

LATE = ReplyMacro(title="Late", language="en", keywords="late delayed parcel tracking",
                  body="I'm sorry {reference} is late. I'm checking where it is now.")
LATE_NO_REF = ReplyMacro(title="Late, no reference", language="en", keywords="late delayed parcel tracking",
                         body="I'm sorry your parcel is late. Could you send me its tracking number?")
CHARGE = ReplyMacro(title="Charged wrongly", language="en", keywords="charged twice bill fee",
                    body="I'm sorry about the charge. I'm going through your billing now.")
ANYTHING = ReplyMacro(title="Anything else", language="en", body="I'm sorry about this. I'm looking into it now.")
SPAT = ReplyMacro(title="Retraso", language="es", keywords="retraso paquete tarde", body="Siento el retraso.")
LIBRARY = ReplyLibrary(macros=[LATE, LATE_NO_REF, CHARGE, ANYTHING, SPAT])


def test_the_reference_is_the_customers_first_code_never_a_year_a_time_or_an_amount():
    assert reference(window(("customer", "Ordered 3 May 2026 at 14:05 for £19.99, order 58213"))) == "58213"
    assert reference(window(("agent", "Your ref is AB-99120?"), ("customer", "no, PP-5561027 and 84401"))) == "PP-5561027"
    assert reference(window(("customer", "it cost 4500 and took 12 days"))) is None


def test_the_macro_sharing_most_words_with_the_chat_and_the_draft_wins_with_the_reference_where_there_is_one():
    assert pick(window(("customer", "I was charged twice this month")), LIBRARY) == CHARGE
    late = window(("customer", "parcel PP-5561027 is late, tracking stuck"))
    assert macro_reply(late, LIBRARY) == "I'm sorry PP-5561027 is late. I'm checking where it is now."
    assert pick(window(("customer", "my parcel is late")), LIBRARY) == LATE_NO_REF  # no code: never "{reference}"
    # the model's draft tips a chat that names nothing: "delayed" is the draft's word, not the customer's
    vague = window(("customer", "where is my stuff??"))
    assert pick(vague, LIBRARY) == ANYTHING and pick(vague, LIBRARY, guide="Sorry it is delayed") == LATE_NO_REF
    assert pick(window(("customer", "ik ben boos"), language="nl"), LIBRARY) is None  # no Dutch macros: no draft
    assert pick(window(("customer", "tarde"), language="es"), LIBRARY.model_copy(update={"macros": [LATE]})) is None


def test_the_pick_is_as_sure_as_its_score_stands_out_among_the_candidates():
    """`Choice.confidence` is the pick's softmax share: near 1 where one macro alone matches, under a
    half for two matching alike, 1/n where nothing matched and the catch-all stands in (what the offer
    policy withholds below its threshold)."""
    charged = choose(window(("customer", "I was charged twice, the fee on my bill is wrong")), LIBRARY)
    assert charged.macro == CHARGE and charged.confidence > 0.99
    tie = ReplyLibrary(macros=[LATE_NO_REF, LATE_NO_REF.model_copy(update={"title": "Late, too"}), ANYTHING])
    both = choose(window(("customer", "my parcel is late")), tie)
    assert both.macro == LATE_NO_REF and 0.4 < both.confidence < 0.5  # a half each, less the catch-all's share
    nothing = choose(window(("customer", "where is my stuff??")), LIBRARY)
    assert nothing.macro == ANYTHING and nothing.confidence == pytest.approx(1 / 3)  # LATE needs a reference
    assert choose(window(("customer", "ik ben boos"), language="nl"), LIBRARY) is None


TIE_SCRIPT = """
from chatlens.contracts import ReplyLibrary, ReplyMacro
from pipeline.model.decoding.macros import choose
from tests.pipeline.test_extractive import window
m = lambda t, k: ReplyMacro(title=t, language="en", keywords=k, body="I'm sorry about this. I'm looking into it now.")
lib = ReplyLibrary(macros=[m("X", "parcel courier driver invoice voucher"), m("Y", "ticket flight screen router modem"),
                           m("A", "courier flight invoice screen"), m("B", "driver router"), m("C", "voucher modem invoice screen")])
choice = choose(window(("customer", "parcel courier driver invoice voucher ticket flight screen router modem")), lib)
print(choice.macro.title, repr(choice.confidence))
"""


def test_a_tie_is_broken_the_same_way_in_every_process_whatever_its_hash_seed():
    """X's and Y's words weigh alike (each side's named by one, two, two, two and three macros): a tie,
    which the library's order breaks. Summed in the order of a set of words, which follows the
    process's string hashes, the two totals differed in their last bits from process to process, and
    so did the confidence (and, on dev, once the pick: a Beam worker and a test disagreed)."""
    import subprocess
    import sys

    from tests.support.pipeline import REPO

    outputs = {subprocess.run([sys.executable, "-c", TIE_SCRIPT], cwd=REPO, capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout for seed in (1, 6, 7)}
    assert len(outputs) == 1 and outputs.pop().startswith("X ")


def test_a_macro_the_draft_checks_fail_for_the_chat_is_never_picked():
    """A decoded draft that invents a refund (one the chat never mentions) does not
    get the customer a macro speaking of their refund: the draft checks (review_checks) fail it."""
    refund = ReplyMacro(title="Refund not received", language="en", keywords="refund money back still waiting",
                        body="I'm sorry your refund still hasn't come through. I'm checking where it stands.")
    library = ReplyLibrary(macros=[refund, *LIBRARY.macros])
    chat = window(("customer", "still waiting, where is my stuff??"))
    assert reply_problems(refund.body, chat)  # a refund this chat never mentions
    assert pick(chat, library, guide="Sorry, your refund is still waiting") != refund
    asked = window(("customer", "my refund is still not back, waiting two weeks"))
    assert pick(asked, library, guide="Sorry, your refund is still waiting") == refund


def test_a_chat_without_a_language_gets_the_language_its_words_meet():
    assert language_of(window(("customer", "mi paquete llega tarde, otro retraso"), language=None), LIBRARY) == "es"
    assert language_of(window(("customer", "parcel late"), language="en-GB"), LIBRARY) == "en"
    assert language_of(window(("customer", "???"), language=None), LIBRARY) == "en"  # no clue: the library's first
    assert language_of(window(("customer", "???"), language=None), ReplyLibrary(macros=[])) is None


def test_the_models_opening_is_kept_only_where_it_restates_what_the_customer_said():
    chat = window(("customer", "Parcel PP-5561027 is late and the tracking is stuck"), ("agent", "Checking."))
    kept = "I'm sorry parcel PP-5561027 is late and the tracking is stuck."
    assert opening(chat, LIBRARY, kept + " I've refunded you.") == kept
    assert macro_reply(chat, LIBRARY, kept, own_opening=True) == kept + " I'm checking where it is now."
    assert opening(chat, LIBRARY, "I'm sorry the driver lost parcel PP-5561027.") is None  # "driver", "lost": not said
    assert opening(chat, LIBRARY, "I've refunded parcel PP-5561027.") is None  # a claimed action
    assert opening(chat, LIBRARY, "I'm sorry PP-5561028 is late.") is None  # another number
    assert macro_reply(chat, LIBRARY, "Sorry the driver lost it.", own_opening=True) == (
        "I'm sorry PP-5561027 is late. I'm checking where it is now.")


def test_the_shipped_library_drafts_in_every_corpus_language_and_claims_nothing():
    library = read_library()
    chats = load_split("dev")
    corpus_languages = {chat.window.language for chat in chats}
    for language in corpus_languages:
        macros = [m for m in library.macros if m.language == language]
        assert len(macros) >= 10 and any(not m.keywords for m in macros), language  # a catch-all in each
        assert len({m.title for m in macros}) == len(macros), language
        # the same macros in the same order in every language: annotations name them by number
        assert len(macros) == len([m for m in library.macros if m.language == "en"]), language
    for macro in library.macros:  # each checked against a chat it would be picked for: its own keywords
        assert macro.body.count("{") == macro.body.count(REFERENCE), macro.title  # no placeholder but {reference}
        chat = window(("customer", f"{macro.keywords} PP-1234567"), language=macro.language)
        assert not reply_problems(macro.body.replace(REFERENCE, "PP-1234567"), chat), (macro.language, macro.title)


@pytest.mark.parametrize("language, said, title", [
    ("en", "flight 6 hours delayed, I missed my connection in Frankfurt", "Flight or train delayed or cancelled"),
    ("de", "Meine Karte wird an der Kasse abgelehnt, obwohl Geld auf dem Konto ist", "Karte / Zahlung gesperrt"),
    ("es", "PixelForge me ha borrado las plantillas que pagué", "Archivos o datos perdidos"),
    ("en", "the technician never came, I took the morning off for the installation", "Nobody came to the appointment"),
    ("en", "my insurance claim was sent in March and nobody answers", "Claim or case taking too long (ask for the number)"),
])
def test_the_shipped_library_has_macros_for_the_problems_the_first_twenty_only_roughly_fit(language, said, title):
    """Travel delays, blocked cards, lost files, missed visits and claims without a case number
    got a generic macro before (the annotators' "roughly": data/macro_picks/)."""
    assert pick(window(("customer", said), language=language), read_library()).title == title


def test_the_pipeline_reads_the_library_file_again_when_it_changes_and_keeps_the_last_good_one(tmp_path):
    path = tmp_path / "library.json"
    shipped = ReplyLibraryFile(None).current()
    assert shipped == read_library()
    watched = ReplyLibraryFile(str(path), interval_secs=0)
    assert watched.current() == shipped  # no file yet: the shipped library
    write_library(LIBRARY, path)
    assert watched.current() == LIBRARY
    path.write_text('{"macros": [{"title": ""}]}')
    os.utime(path, (time.time() + 10, time.time() + 10))
    assert watched.current() == LIBRARY  # a bad edit never stops the drafts
    write_library(LIBRARY, path)
    slow = ReplyLibraryFile(str(path), interval_secs=3600)
    assert slow.current() == LIBRARY
    write_library(ReplyLibrary(macros=[ANYTHING]), path)
    os.utime(path, (time.time() + 20, time.time() + 20))
    assert slow.current() == LIBRARY  # looked at once an interval


def test_a_library_file_that_is_not_one_says_so():
    with pytest.raises(ValueError, match="is not a reply library"):
        read_library(__file__)
