"""Numbers come from the chat: a constraint on the decoder, so that a summary or a reply never
states an order number, an amount, a date or a phone number the chat does not hold.

A small model that cannot find a number writes a plausible one, and staff would send it on. A
number is what the eval's grounding check reads (`scoring.numbers`): digits, joined by single
`. , : /` (21:30, 3,50, 12/03). Gemma's tokenizers write digits one token each, so while decoding
each row follows which of its chat's numbers the digits written so far begin, like a walk down
a trie:
- a digit is allowed where it continues one of them (or starts one);
- a separator is allowed where it continues one, or where the number before it is complete (the
  full stop after "order 58140."); after the latter, no digit may follow;
- any other token is allowed only where no number is open or the open one is complete.
Tokens that hold digits any other way (byte fallbacks, other scripts' numerals, the markup of
special tokens) are never written: the tokenizer has a single-digit token for each digit.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from pipeline.scoring import SEPARATORS, numbers

ALPHABET = "0123456789" + SEPARATORS  # a number's characters; their index is their code
END = -1  # past a number's last character (and unused rows)
OTHER, NEVER = -1, -2  # tokens that write no digit; tokens that hold a digit other than as one token
MAX_NUMBERS = 128  # per chat: past them, later numbers cannot be written
MAX_CHARACTERS = 24  # a longer number cannot be written (a card number has 19 digits)


def token_codes(pieces: Sequence[str]) -> np.ndarray:
    """Per token id: its character's code in `ALPHABET` if it is one digit or one separator,
    `OTHER` if it holds no digit, `NEVER` if it holds a digit some other way."""
    codes = np.full(len(pieces), OTHER, "int32")
    for token, piece in enumerate(pieces):
        if len(piece) == 1 and piece in ALPHABET:
            codes[token] = ALPHABET.index(piece)
        elif any(c.isdigit() for c in piece):
            codes[token] = NEVER
    if any((codes == digit).sum() != 1 for digit in range(10)):
        raise ValueError("the tokenizer has no single-digit token for every digit: numbers cannot be grounded")
    return codes


def symbol_ids(codes: np.ndarray) -> np.ndarray:
    """The token that writes each `ALPHABET` character alone, -1 where there is none."""
    return np.array([np.flatnonzero(codes == code)[0] if (codes == code).any() else -1
                     for code in range(len(ALPHABET))], "int32")


def number_table(texts: Iterable[str]) -> np.ndarray:
    """(rows, MAX_NUMBERS, MAX_CHARACTERS + 1): each text's numbers as `ALPHABET` codes, `END` after
    each and in unused rows; the last column is always `END`."""
    texts = list(texts)
    table = np.full((len(texts), MAX_NUMBERS, MAX_CHARACTERS + 1), END, "int32")
    for row, text in enumerate(texts):
        found = sorted(n for n in numbers(text) if len(n) <= MAX_CHARACTERS and set(n) <= set(ALPHABET))
        for k, number in enumerate(found[:MAX_NUMBERS]):
            table[row, k, : len(number)] = [ALPHABET.index(c) for c in number]
    return table


@jax.tree_util.register_dataclass
@dataclass(frozen=True)
class NumberState:
    """Per row: characters of the open number written (0: none open), which of the chat's numbers
    they begin, whether the last was a separator, and whether the number was complete before it.
    A pytree: it rides in the decoding loop's carry."""

    written: jax.Array  # (B,) int32
    alive: jax.Array  # (B, MAX_NUMBERS) bool
    after_separator: jax.Array  # (B,) bool
    complete_before: jax.Array  # (B,) bool

    @classmethod
    def start(cls, table) -> NumberState:
        """No number open, every one of the chat's possible."""
        batch = table.shape[0]
        return cls(jnp.zeros((batch,), "int32"), table[:, :, 0] != END, jnp.zeros((batch,), bool),
                   jnp.ones((batch,), bool))

    def _next(self, table):
        """Each chat number's character after the written ones, (B, MAX_NUMBERS)."""
        return jnp.take_along_axis(table, self.written[:, None, None], axis=2)[:, :, 0]

    def may_end(self, table):
        """Whether each row may write something other than a digit or separator now: no number is
        open, or the open one is complete. A decoder that stops a text at its length limit waits
        for this, so that no number is left cut."""
        return self._may_end(self._next(table))

    def _may_end(self, following):
        complete = jnp.any(self.alive & (following == END), axis=1)
        return (self.written == 0) | jnp.where(self.after_separator, self.complete_before, complete)

    def mask(self, logits, table, codes, symbols):
        """`logits` (B, V) with every token that would write a number outside the chat at -inf.
        `symbols`: the token of each `ALPHABET` character, -1 where the tokenizer has none (`symbol_ids`)."""
        following = self._next(table)
        may_end = self._may_end(following)
        continues = jnp.any(self.alive[:, :, None] & (following[:, :, None] == jnp.arange(len(ALPHABET))), axis=1)
        in_number = (self.written > 0) & ~self.after_separator
        allowed = continues.at[:, 10:].set(jnp.where(in_number[:, None], continues[:, 10:] | may_end[:, None],
                                                     may_end[:, None]))
        masked = jnp.where((codes == OTHER)[None, :] & may_end[:, None], logits, -jnp.inf)
        present = symbols >= 0
        ids = jnp.where(present, symbols, 0)
        return masked.at[:, ids].set(jnp.where(allowed & present, logits[:, ids], masked[:, ids]))

    def advance(self, token, table, codes) -> NumberState:
        """The state after each row wrote `token` (B,)."""
        code = codes[token]
        following = self._next(table)
        in_number = (self.written > 0) & ~self.after_separator
        digit = (code >= 0) & (code < 10)
        separator = (code >= 10) & in_number
        carries_on = digit | separator
        start = NumberState.start(table)
        return NumberState(
            written=jnp.where(carries_on, self.written + 1, 0),
            alive=jnp.where(carries_on[:, None], self.alive & (following == code[:, None]), start.alive),
            after_separator=separator,
            complete_before=jnp.where(separator, self._may_end(following), True))
