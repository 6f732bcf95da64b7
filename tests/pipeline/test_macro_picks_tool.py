"""data/tools/macro_picks.py: the annotators' brief, and the picker scored against annotations."""

from __future__ import annotations

import json

from chatlens.replies import read_library
from pipeline.corpus import load_split
from pipeline.model.decoding.macros import in_language, pick
from tests.support.corpus_tools import tool


def test_the_brief_numbers_the_english_macros_and_quotes_every_chat():
    picks = tool("macro_picks")
    library = read_library()
    chats = [e.window for e in load_split("dev")[:3]]
    text = picks.brief(library, chats)
    english = in_language(library, "en")
    assert f"library of {len(english)} reply macros" in text
    for number, macro in enumerate(english):
        assert f"\n{number}. **{macro.title}**: {macro.body}\n" in text
    for chat in chats:
        assert f"\n### {chat.chat_id}\n" in text
        assert all(f"> {m.text.splitlines()[0]}" in text for m in chat.messages)


def test_a_pick_counts_as_right_where_either_annotator_accepts_it(tmp_path):
    picks = tool("macro_picks")
    library = read_library()
    chats = {e.window.chat_id: e.window for e in load_split("dev")[:4]}
    numbers = {i: picks.place(library, pick(w, library)) for i, w in chats.items()}
    first, second, third, fourth = chats
    other = lambda n: (n + 1) % len(in_language(library, "en"))  # noqa: E731 - a number that is not the pick
    a = {first: {"best": numbers[first], "fits": "well"}, second: {"best": other(numbers[second]), "fits": "well"},
         third: {"best": other(numbers[third]), "also_ok": [numbers[third]], "fits": "roughly"},
         fourth: {"best": other(numbers[fourth]), "fits": "well"}}
    b = {i: {"best": other(n), "fits": "well"} for i, n in numbers.items()}
    counts = picks.score(library, chats, [a, b], guides={})["counts"]
    assert counts == {"chats": 4, "chats (well)": 3, "chats (not well)": 1, "right": 2, "right (well)": 1,
                      "right (not well)": 1, "best": 1}
    files = []
    for name, marks in (("A", a), ("B", b)):
        files.append(tmp_path / f"{name}.jsonl")
        files[-1].write_text("".join(json.dumps({"chat_id": i, **m}) + "\n" for i, m in marks.items()))
    assert picks.main(["score", "--split", "dev", "--annotations", *map(str, files)]) == 0
