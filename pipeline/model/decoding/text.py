"""Text clean-up of generated completions: loop detection, markers, repeated sentences, cuts at a
sentence or a word, and how many characters a token surely adds. Model-independent."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

import numpy as np


def is_degenerate(token_ids: Sequence[int], text: str) -> bool:
    """True for the usual failure of small greedy models: a phrase or line repeated in a loop."""
    if len(token_ids) >= 12:
        grams = Counter(tuple(token_ids[i : i + 4]) for i in range(len(token_ids) - 3))
        if grams.most_common(1)[0][1] >= 3:
            return True
    sentences = [s.strip().lower() for s in re.split(r"[.!?\n]+", text) if len(s.strip()) > 8]
    return len(sentences) != len(set(sentences))


def cut_at_word(text: str, limit: int) -> str:
    """At most `limit` characters, cut at a word boundary with an ellipsis when cut at all."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    if " " in cut:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip(" ,;:-") + "…"


SENTENCE_END = re.compile(r"[.!?।؟](?=\s)|[。！？]")
"""Where a sentence ends: a full stop, question or exclamation mark before a space (so "v1.2" goes
on), with Hindi's danda and Arabic's question mark; Chinese and Japanese marks need no space."""
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff]")  # kana and CJK ideographs: their full stop is 。


def sentence_ends(text: str) -> list[int]:
    """The offsets just past each sentence's end mark."""
    return [m.end() for m in SENTENCE_END.finditer(text)]


def cut_at_sentence(text: str, limit: int) -> str:
    """At most `limit` characters, ending at the last whole sentence that fits; at a word
    (`cut_at_word`) when no sentence ends in the second half of the limit."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    ends = [end for end in sentence_ends(text[: limit + 1]) if end <= limit]
    if ends and ends[-1] >= limit // 2:
        return text[: ends[-1]]
    return cut_at_word(text, limit)


MARKERS = ("<start_of_turn>", "<end_of_turn>", "<eos>", "<bos>")  # what clean_completion blanks out


def drop_repeated_sentences(text: str) -> str:
    """The text without a sentence that says word for word what an earlier one said.

    A small model that loses its way in a language it was not tuned on can loop a whole sentence
    (seen in Czech); staff would have to delete it. Case and punctuation do not make a sentence new.
    """
    seen, kept = set(), []
    starts = [0, *sentence_ends(text)]
    for start, end in zip(starts, [*starts[1:], len(text)]):
        sentence = text[start:end]  # with the space before it, if any
        words = " ".join(re.findall(r"\w+", sentence.lower()))
        if words and words in seen:
            continue
        seen.add(words)
        kept.append(sentence)
    return "".join(kept).strip()


def clean_completion(text: str, limit: int, sentence_limit: int | None = None) -> str:
    """Generated text as staff see it: one paragraph, no stray markers, no sentence said twice,
    within `limit`, and within `sentence_limit` cut at a sentence end where one is given."""
    text = re.sub("|".join(map(re.escape, MARKERS)), " ", text)
    text = text.strip().strip('"').strip()
    if text and text[-1].isalnum():  # generation stops at the sentence's full stop, which is not kept
        text += "。" if _CJK.match(text[-1]) else "."
    text = drop_repeated_sentences(text)
    if sentence_limit is not None:
        text = cut_at_sentence(text, sentence_limit)
    return cut_at_word(text, limit)


PAST_CUT_MARGIN = max(map(len, MARKERS)) + 1
"""How many visible characters past a cut a decoder goes before stopping: a marker split across
the stop would still be blanked out, and `cut_at_sentence` looks one character past its limit."""


def visible_characters(pieces: Sequence[str]) -> np.ndarray:
    """Per token (its vocabulary piece): how many characters it surely adds to a completion after
    `clean_completion`, a lower bound (no whitespace, no quotes, nothing from markup or byte pieces).
    Once a text holds `limit + PAST_CUT_MARGIN` of them its cut at `limit` is final, so decoding it
    further changes nothing staff see; except where `drop_repeated_sentences` removes a sentence
    said twice, which leaves that draft shorter than a longer decode would have made it."""
    return np.array([0 if re.fullmatch(r"<[^<>]*>", piece) else
                     sum(not c.isspace() and c not in '"\u2581' for c in piece) for piece in pieces], "int32")
