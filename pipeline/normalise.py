"""Chat text as the tuned model reads it: handles, links and e-mail addresses become markers.

An anonymised handle (`@115911`) or a tracking link holds digits that are no fact of the
customer's case, and a small model copies them into summaries as order numbers and amounts.
So from prompt format 2 on they reach the model as `@user`, `<link>` and `<email>`, in training
and serving alike; the decoder's number grounding reads the prompt, so their digits can never be
written. The dashboard and the stored chat keep the raw text.
"""

from __future__ import annotations

import re

EMAIL = r"[\w.+-]+@[\w-]+(?:\.[\w-]+)*\.[A-Za-z]{2,}"
LINK = r"(?:https?://|www\.)[^\s<>\"']+"
HANDLE = r"(?<![\w@])@\w[\w.]*(?<!\.)"
HASHTAG = r"#(?=[^\W\d])\w+"

_MARKERS = ((re.compile(EMAIL), "<email>"), (re.compile(LINK, re.IGNORECASE), "<link>"), (re.compile(HANDLE), "@user"))


def normalise(text: str) -> str:
    """`text` with every e-mail address, link and handle replaced by its marker."""
    for pattern, marker in _MARKERS:
        text = pattern.sub(marker, text)
    return text
