"""Scores for the three outputs, as pure functions over plain values (what `chatlens eval` prints).

- sentiment: accuracy, macro-F1, per-class F1, the confusion matrix, and the expected
  calibration error (ECE) of the confidence;
- text: ROUGE-L F against the gold (Google's `rouge-score`, with a Unicode word tokenizer so
  accented words count in every language), **grounded** (every number and every capitalised
  name in the text also appears in the chat), the language (`py3langid`), placeholders, and
  whether a reply names a specific problem from the customer's messages.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import cache, lru_cache

from chatlens.contracts import SENTIMENT_LABELS

LABELS = tuple(SENTIMENT_LABELS)  # -1, 0, 1
# Languages whose month, weekday and language names an English summary may translate.
TRANSLATED_LANGUAGES = ("en", "fr", "es", "de", "it", "pt", "nl", "pl", "tr", "sv")
ECE_BINS = 10

_WORD = re.compile(r"\w+", re.UNICODE)
SEPARATORS = ".,:/"  # between digits, part of one number: 21:30, 3,50, 12/03
_NUMBER = re.compile(rf"\d+(?:[{SEPARATORS}]\d+)*")
_SENTENCE_START = re.compile(r"(?:^|[.!?¡¿:;\n]\s*|[\"“«(]\s*)$")
_NAME = re.compile(r"[^\W\d_][\w'’&-]*", re.UNICODE)
_PLACEHOLDER = re.compile(r"\[[^\]\n]{1,40}\]|\{[^}\n]{1,40}\}|<[A-Za-z_ ]{2,40}>|\bX{3,}\b|_{3,}")
# Capitalised words that are grammar, not names.
_NOT_NAMES = {"I", "I'm", "I've", "I'll", "I'd", "U", "OK", "Ok"}
# Languages that capitalise every noun: there only mixed-case and all-caps words count as names.
_NOUN_CAPITALISING = {"de"}


# ---- sentiment ------------------------------------------------------------------------------
def sentiment_scores(truth: Sequence[int], predicted: Sequence[int]) -> dict:
    """Accuracy, macro-F1, F1 per class and the confusion matrix (rows: truth, columns: prediction)."""
    confusion = [[0, 0, 0] for _ in LABELS]
    for t, p in zip(truth, predicted, strict=True):
        confusion[t + 1][p + 1] += 1
    f1s = []
    for k in range(3):
        true_positive = confusion[k][k]
        predicted_k = sum(row[k] for row in confusion)
        actual_k = sum(confusion[k])
        precision = true_positive / predicted_k if predicted_k else 0.0
        recall = true_positive / actual_k if actual_k else 0.0
        f1s.append(2 * precision * recall / (precision + recall) if precision + recall else 0.0)
    total = sum(map(sum, confusion))
    return {
        "n": total,
        "accuracy": round(sum(confusion[k][k] for k in range(3)) / total, 4) if total else 0.0,
        "macro_f1": round(sum(f1s) / 3, 4),
        "f1": {SENTIMENT_LABELS[label]: round(f, 4) for label, f in zip(LABELS, f1s)},
        "confusion": confusion,
    }


def expected_calibration_error(confidences: Sequence[float], correct: Sequence[bool], bins: int = ECE_BINS
                               ) -> float:
    """Mean |accuracy - confidence| over equal-width confidence bins, weighted by bin size."""
    if not confidences:
        return 0.0
    members: dict[int, list[int]] = {}
    for i, confidence in enumerate(confidences):
        members.setdefault(min(int(confidence * bins), bins - 1), []).append(i)
    error = 0.0
    for indices in members.values():
        accuracy = sum(correct[i] for i in indices) / len(indices)
        confidence = sum(confidences[i] for i in indices) / len(indices)
        error += len(indices) / len(confidences) * abs(accuracy - confidence)
    return round(error, 4)


# ---- text -----------------------------------------------------------------------------------
class _UnicodeWords:
    """rouge-score's default tokenizer drops every non-ASCII letter; this one keeps words whole."""

    def tokenize(self, text: str) -> list[str]:
        return _WORD.findall(text.lower())


@lru_cache(maxsize=1)
def _rouge():
    from rouge_score import rouge_scorer

    return rouge_scorer.RougeScorer(["rougeL"], tokenizer=_UnicodeWords())


def rouge_l(prediction: str, reference: str) -> float:
    """ROUGE-L F-measure of one prediction against one gold text."""
    return _rouge().score(reference, prediction)["rougeL"].fmeasure


def numbers(text: str) -> set[str]:
    """The numbers a text states: digits, joined by single separators."""
    return {n.rstrip(SEPARATORS) for n in _NUMBER.findall(text)}


def names(text: str, language: str | None = "en") -> set[str]:
    """Capitalised words that are not the first of a sentence: the names a text asserts."""
    found = set()
    for match in _NAME.finditer(text):
        if _SENTENCE_START.search(text[: match.start()]):
            continue
        word = match.group().rstrip("'’-&")
        if word.endswith(("'s", "’s")):
            word = word[:-2]
        # Each part of a compound ("PixelForge-Konto") is judged on its own.
        found.update(part for part in word.split("-") if _is_name(part, language))
    return found


def _is_name(word: str, language: str | None) -> bool:
    if not word or not word[0].isupper() or word in _NOT_NAMES:
        return False
    if word.isupper() and word.isalpha() and len(word) <= 4:
        return False  # generic acronyms (SMS, GPS, PIN); codes with digits are numbers
    if language in _NOUN_CAPITALISING and not any(c.isupper() for c in word[1:]):
        return False  # German capitalises every noun: only mixed-case words are names
    return True


@cache
def _translations() -> dict[str, set[str]]:
    """English month, weekday and language names -> their names in the corpus languages.

    An English summary of an Italian chat says "February" for "febbraio": a translation,
    not an invented fact, so it counts as grounded when any translation is in the chat.
    """
    import babel  # here, not at the top: the dashboard image imports this module's command, not babel

    english = babel.Locale("en")
    tables = [
        lambda loc: loc.months["format"]["wide"],
        lambda loc: loc.days["format"]["wide"],
        lambda loc: {code: loc.languages.get(code, "") for code in TRANSLATED_LANGUAGES},
    ]
    found: dict[str, set[str]] = {}
    for table in tables:
        for key, name in table(english).items():
            found[name] = {table(babel.Locale(code))[key].lower() for code in TRANSLATED_LANGUAGES} - {""}
    return found


def ungrounded(text: str, transcript: str, language: str | None = "en") -> list[str]:
    """Numbers and names in `text` that the chat never mentions (names compared case-insensitively)."""
    chat_numbers = numbers(transcript)
    lowered = transcript.lower()
    missing = sorted(n for n in numbers(text) if n not in chat_numbers)
    missing += sorted(name for name in names(text, language)
                      if name.lower() not in lowered
                      and not any(t in lowered for t in _translations().get(name, ())))
    return missing


def language_of(text: str) -> str:
    import py3langid

    return py3langid.classify(text)[0]


def placeholder(text: str) -> str | None:
    """The first template placeholder (`[Name]`, `{order}`, `XXX`) in a draft, if any."""
    match = _PLACEHOLDER.search(text)
    return match.group() if match else None


def document_frequency(texts: Iterable[str]) -> tuple[Counter, int]:
    """In how many of `texts` each word occurs, and how many texts there were."""
    counts: Counter = Counter()
    total = 0
    for text in texts:
        counts.update(set(_WORD.findall(text.lower())))
        total += 1
    return counts, total


def problem_terms(reply: str, customer_text: str, frequency: tuple[Counter, int], rare: float = 0.05
                  ) -> list[str]:
    """Specific words of the customer's messages that the reply repeats.

    Specific: a number, or a word of 4+ letters found in under `rare` of the chats (so
    "sorry", "order" or "problem" never count, "refund", "Lisbon" or "charger" may).
    """
    counts, total = frequency
    said = set(_WORD.findall(customer_text.lower()))
    terms = []
    for word in dict.fromkeys(_WORD.findall(reply.lower())):
        if word not in said:
            continue
        if word.isdigit() or (len(word) >= 4 and counts[word] < rare * total):
            terms.append(word)
    return terms
