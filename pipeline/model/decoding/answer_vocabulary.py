"""The tokens a tuned model may write while decoding: a few tens of thousands of the vocabulary's.

A decoding step projects each row on every row of the vocabulary: Gemma 3's 262,144 x 640, 335 MB
of bfloat16 read every step, ~30 ms of a one-chat step here. What a ChatLens model writes are the
words of the answers it was tuned on and of the chat it reads, so the decoder projects only on:
- the tokens of its training chats and answers, as its manifest lists them (`answer_vocabulary`);
- the tokenizer's first `COMMON_PIECES` pieces (SentencePiece keeps its common ones first);
- the batch's prompts, as written and in lower, title and upper case ("Refund" where the chat
  says "REFUND");
- the format's own tokens, digits and number separators (`always`).
Where the model's own choice lies among them, which it did for 99.6% of the tokens it wrote on
`dev`, the token is the one the whole vocabulary gives; elsewhere it is the best of them. A token's
probability is its share among them: the model's, constrained, as the number grounding constrains it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

# numpy is imported where used: this module is read by the dashboard's commands (training/adapters.py).

COMMON_PIECES = 8192
SIZES = (32768, 65536)
"""The candidates of a batch are padded to one of these (one decoding program each); a batch
whose candidates outnumber the last decodes over the whole vocabulary."""


def encode(tokens: Iterable[int]) -> str:
    """Sorted token ids as ranges, "0-8191 8200 8213-8215": one line of a manifest."""
    runs: list[list[int]] = []
    for token in sorted(set(tokens)):
        if runs and token == runs[-1][1] + 1:
            runs[-1][1] = token
        else:
            runs.append([token, token])
    return " ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def decode(text: str) -> tuple[int, ...]:
    """`encode`'s ranges back to sorted token ids."""
    tokens = []
    for run in text.split():
        first, _, last = run.partition("-")
        tokens.extend(range(int(first), int(last or first) + 1))
    return tuple(tokens)


@dataclass(frozen=True)
class AnswerVocabulary:
    """The tokens of a model's training chats and answers, and the tokenizer's common pieces."""

    tokens: tuple[int, ...]

    @classmethod
    def of_texts(cls, tokenize: Callable[[str], list[int]], texts: Iterable[str],
                 common: int = COMMON_PIECES) -> AnswerVocabulary:
        """From the texts a model was tuned on (its chats' messages and its answers), each tokenized
        as it follows a space in a prompt or an answer."""
        tokens = set(range(common))
        for text in texts:
            tokens.update(tokenize(" " + " ".join(text.split())))
        return cls(tuple(sorted(tokens)))

    @classmethod
    def from_json(cls, data: dict | None) -> AnswerVocabulary | None:
        return cls(decode(data["tokens"])) if data else None

    def to_json(self) -> dict:
        return {"tokens": encode(self.tokens), "count": len(self.tokens)}

    def candidates(self, tokenize: Callable[[str], list[int]], prompts: Sequence[Sequence[int]],
                   texts: Sequence[str], always: Iterable[int], vocabulary_size: int
                   ) -> tuple[Any, Any] | None:
        """A batch's candidates (numpy): sorted token ids padded (with the last, repeated) to one of `SIZES`,
        and which of them are real; None where they would not fit the last (decode over all)."""
        tokens = set(self.tokens).union(always, *prompts)
        for text in set(texts):  # a batch padded with a repeated chat tokenizes it once
            for variant in {text.lower(), text.title(), text.upper()}:
                tokens.update(tokenize(variant))
        tokens = sorted(t for t in tokens if 0 <= t < vocabulary_size)
        size = next((s for s in SIZES if s >= len(tokens)), None)
        if size is None or size >= vocabulary_size:
            return None
        import numpy as np

        ids = np.full(size, tokens[-1], "int32")
        ids[: len(tokens)] = tokens
        return ids, np.arange(size) < len(tokens)

