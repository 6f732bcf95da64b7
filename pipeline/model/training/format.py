"""The one prompt-and-answer format the tuned Gemma learns and is decoded with.

A chat becomes one token sequence that yields all three outputs in a single pass:

    <bos>{prompts/tuned/chat.txt with the fenced transcript}   (ends with "Mood:")
     negative|neutral|positive                                (one token: the label)
    \\nSummary: {summary}\\n
    Reply: {reply}<eos>                                        (only where a reply is wanted)

The prompt and the fixed cues ("\\nSummary:", "Reply:") are given, never learnt: only the
label, the summary, the reply and their terminators carry loss. At inference the same
sequence is built left to right on one attention cache: the label probabilities are read
at the end of the prompt, then the summary is decoded, then the reply where selected.
Segments are tokenized one by one and concatenated, so training and decoding see exactly
the same token boundaries.

Prompt formats (an adapter's manifest names the one it learnt, `prompt_format`; 1 without it):
1. `prompts/tuned/chat.txt`, lines `customer: text`.
2. `prompts/tuned/chat-v2.txt`, which says who each speaker is, lines `Customer: text` /
   `Agent: text`, and handles, links and e-mail addresses as markers (`pipeline/normalise.py`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import lru_cache

from chatlens.contracts import SENTIMENT_LABELS, ChatWindow
from pipeline.corpus import MAX_GOLD_SUMMARY_CHARS
from pipeline.normalise import normalise
from pipeline.prompts import PROMPTS_DIR, fit_transcript, neutralise, transcript_lines

LABELS = tuple(f" {name}" for name in SENTIMENT_LABELS.values())  # index = sentiment + 1
SUMMARY_CUE = "\nSummary:"
SUMMARY_END = "\n"
REPLY_CUE = "Reply:"
MAX_PROMPT_TOKENS = 1024
SUMMARY_TOKENS = 96
SUMMARY_CHARS = MAX_GOLD_SUMMARY_CHARS  # what the format taught; a longer summary has run on
REPLY_TOKENS = 192
# A reply draft ends at its last whole sentence within 320 characters. Chosen on `dev` from the shipped
# adapter's replies (predictions kept by `chatlens eval --predictions`): grounded 91.5 -> 95.8% at an
# unchanged ROUGE-L (0.247); the small model's invented specifics sit in its later sentences.
REPLY_CHARS = 320
ANSWERS = ("label", "summary", "reply")
PREAMBLE_PROBES = ("", "x", " x", "\n", "\n\n", "Customer: hi", "customer: hi", "1", ">>>", "<", "\t")
PROMPT_FORMATS = (1, 2)
LATEST_FORMAT = PROMPT_FORMATS[-1]  # what `chatlens tune` teaches
_TEMPLATES = {1: "chat.txt", 2: "chat-v2.txt"}
_SPEAKERS = {1: None, 2: {"customer": "Customer", "agent": "Agent", "bot": "Bot"}}


@lru_cache(maxsize=None)
def template(prompt_format: int = 1) -> str:
    name = _TEMPLATES[check_format(prompt_format)]
    text = (PROMPTS_DIR / "tuned" / name).read_text(encoding="utf-8").removesuffix("\n")
    if text.count("{transcript}") != 1 or not text.endswith("Mood:"):
        raise ValueError(f"prompts/tuned/{name} must hold {{transcript}} once and end with 'Mood:'")
    return text


def check_format(prompt_format: int) -> int:
    if prompt_format not in PROMPT_FORMATS:
        raise ValueError(f"unknown prompt format {prompt_format!r}: this ChatLens knows {PROMPT_FORMATS}")
    return prompt_format


def transcript(messages, prompt_format: int = 1) -> list[str]:
    """The chat's lines as prompt format `prompt_format` writes them."""
    clean = neutralise if prompt_format == 1 else (lambda text: neutralise(normalise(text)))
    return transcript_lines(messages, _SPEAKERS[check_format(prompt_format)], clean)


@dataclass(frozen=True)
class Vocabulary:
    """The token ids of the format's fixed parts, for one tokenizer."""

    tokenize: Callable[[str], list[int]]
    bos: int
    eos: int
    labels: tuple[int, int, int]
    summary_cue: tuple[int, ...]
    summary_end: int
    reply_cue: tuple[int, ...]
    prompt_format: int = 1

    @classmethod
    def of(cls, tokenize: Callable[[str], list[int]], bos: int, eos: int, prompt_format: int = 1) -> Vocabulary:
        labels = [tokenize(label) for label in LABELS]
        if any(len(ids) != 1 for ids in labels):
            raise ValueError(f"each label must be one token: {labels}")
        end = tokenize(SUMMARY_END)
        if len(end) != 1:
            raise ValueError("the summary terminator must be one token")
        return cls(tokenize, bos, eos, tuple(ids[0] for ids in labels), tuple(tokenize(SUMMARY_CUE)), end[0],
                   tuple(tokenize(REPLY_CUE)), check_format(prompt_format))

    def prompt(self, window: ChatWindow, budget: int = MAX_PROMPT_TOKENS) -> tuple[list[int], bool]:
        """BOS + the fenced chat, cut from its oldest messages to `budget` tokens; and whether it was cut."""
        head, tail = template(self.prompt_format).split("{transcript}")
        fixed = 1 + len(self.tokenize(head)) + len(self.tokenize(tail)) + 2  # newlines a cut may add

        def fits(transcript: str) -> bool:
            return fixed + len(self.tokenize(transcript)) <= budget

        text, cut = fit_transcript(transcript(window.messages, self.prompt_format), fits)
        return [self.bos, *self.tokenize(head + text + tail)], cut

    def preamble(self) -> tuple[int, ...]:
        """The tokens every prompt starts with: BOS and the template's text before the transcript, up
        to where a transcript's first characters could join its last token (the common start of the
        template's tokens before a few different transcripts). A decoder computes their keys and
        values once, and checks each prompt starts with them."""
        head = template(self.prompt_format).split("{transcript}")[0]
        return (self.bos, *os.path.commonprefix([self.tokenize(head + probe) for probe in PREAMBLE_PROBES]))

    def answer(self, label: int, summary: str, reply: str | None, learn: Collection[str] = ANSWERS
               ) -> tuple[list[int], list[bool]]:
        """The answer tokens after the prompt, and which of them carry loss (the parts in `learn`)."""
        tokens: list[int] = [self.labels[label + 1]]
        learnt = ["label" in learn]
        summary_ids = self.tokenize(" " + summary.strip())[:SUMMARY_TOKENS]
        for ids, loss in ((self.summary_cue, False), (summary_ids, "summary" in learn),
                          ((self.summary_end,), "summary" in learn)):
            tokens += ids
            learnt += [loss] * len(ids)
        if reply:
            body = self.tokenize(" " + " ".join(reply.split()))[:REPLY_TOKENS - 1]
            for ids, loss in ((self.reply_cue, False), (body, "reply" in learn), ((self.eos,), "reply" in learn)):
                tokens += ids
                learnt += [loss] * len(ids)
        return tokens, learnt


@dataclass(frozen=True)
class TrainingSequence:
    """One chat as the model learns it: inputs, next-token targets and where loss counts."""

    token_ids: list[int]
    targets: list[int]
    loss_mask: list[bool]

    def __len__(self) -> int:
        return len(self.token_ids)


def training_sequence(vocabulary: Vocabulary, window: ChatWindow, label: int, summary: str, reply: str | None,
                      learn: Collection[str] = ANSWERS) -> TrainingSequence:
    """Prompt + answer, shifted by one: position i predicts token i + 1; loss only on the answers in `learn`."""
    prompt, _ = vocabulary.prompt(window)
    answer, learnt = vocabulary.answer(label, summary, reply, learn)
    tokens = prompt + answer
    loss = [False] * len(prompt) + learnt
    return TrainingSequence(tokens[:-1], tokens[1:], loss[1:])

