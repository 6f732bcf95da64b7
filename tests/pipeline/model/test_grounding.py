"""The number-grounding constraint of the decoder (pipeline/model/decoding/grounding.py), step by step."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from pipeline.model.decoding import grounding
from pipeline.scoring import numbers

# A toy vocabulary: words, a space, the separators, the digits, and tokens that hold digits otherwise.
PIECES = ["<end>", "order", " ", "at", ".", ",", ":", "/", *"0123456789", "x1", "٣", "<0x31>"]
CODES = grounding.token_codes(PIECES)
SYMBOLS = grounding.symbol_ids(CODES)
CHAT = "Order 58140 was due at 21:30 on 12/03; it cost 3,50 and 5."


def decode(logit_rows, table, ground: bool) -> str:
    """Greedy decoding of given logits with or without the constraint, for the chat of `table` and,
    beside it in the batch, a chat without numbers (which must then write none); the first's text."""
    table = jnp.concatenate([table, jnp.asarray(grounding.number_table(["no numbers at all"]))])
    state = grounding.NumberState.start(table)
    texts, ended = [[], []], [False, False]
    for logits in logit_rows:
        logits = jnp.asarray(np.stack([logits, logits]), "float32")
        if ground:
            logits = state.mask(logits, table, jnp.asarray(CODES), jnp.asarray(SYMBOLS))
        token = jnp.argmax(logits, axis=-1).astype("int32")
        state = state.advance(token, table, jnp.asarray(CODES))
        for row in (0, 1):
            ended[row] = ended[row] or PIECES[int(token[row])] == "<end>"
            if not ended[row]:
                texts[row].append(PIECES[int(token[row])])
    if ground:
        assert not numbers("".join(texts[1]))
    return "".join(texts[0])


def test_token_codes_sort_digits_separators_and_tokens_that_hide_digits():
    assert [CODES[PIECES.index(c)] for c in "0123456789.,:/"] == list(range(14))
    assert CODES[PIECES.index("order")] == grounding.OTHER
    assert all(CODES[PIECES.index(p)] == grounding.NEVER for p in ("x1", "٣", "<0x31>"))
    with pytest.raises(ValueError, match="single-digit token"):
        grounding.token_codes(["a", "12", "3"])


@pytest.mark.parametrize("seed", range(40))
def test_a_model_eager_to_write_numbers_writes_only_the_chats(seed):
    """Random logits leaning to digits and separators: unconstrained, they write numbers that are
    not in the chat; constrained, every number written is one of the chat's."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 1, (40, len(PIECES)))
    logits[:, 4:17] += 1.5  # separators and digits
    logits[:, -3:] += 1.0  # and the tokens that hide digits
    logits[:, 0] = -9.0
    logits[-10:, 0] = 20.0  # then the end, where a number may end
    table = jnp.asarray(grounding.number_table([CHAT]))
    grounded = decode(logits, table, ground=True)
    assert numbers(grounded) <= numbers(CHAT), grounded
    assert not any(p in grounded for p in ("x1", "٣", "<0x31>"))
    free = decode(logits, table, ground=False)
    assert not numbers(free) <= numbers(CHAT)  # the constraint is what kept them out


def test_a_number_ends_only_where_a_chat_number_ends():
    table = jnp.asarray(grounding.number_table([CHAT]))
    wants = {" ": 5.0, "2": 4.0, "1": 3.0, ".": 2.0, ":": 1.0}  # "21" then a full stop, if it could
    logits = np.full((6, len(PIECES)), -5.0)
    for piece, value in wants.items():
        logits[:, PIECES.index(piece)] = value
    logits[0, PIECES.index("2")] = 9.0
    logits[1, PIECES.index("1")] = 9.0
    # "21" is not a number of the chat, "21:30" is: it goes on to ":30" rather than end at "21."
    assert decode(logits, table, ground=True).startswith("21:3")
    assert decode(logits, table, ground=False).startswith("21 ")


def test_a_full_stop_after_a_complete_number_ends_it():
    table = jnp.asarray(grounding.number_table([CHAT]))
    logits = np.full((3, len(PIECES)), -5.0)
    logits[0, PIECES.index("5")] = 9.0  # "5" is a chat number (and begins 58140)
    logits[1, PIECES.index(".")] = 9.0
    logits[2, PIECES.index("3")] = 9.0  # "5.3" is not: after the full stop, no digit
    logits[2, PIECES.index("at")] = 1.0
    assert decode(logits, table, ground=True) == "5.at"


def test_number_table_rows_and_limits():
    table = grounding.number_table(["a 7 and 7, 80/90", "no numbers", "٣ and " + "9" * 40])
    assert table.shape == (3, grounding.MAX_NUMBERS, grounding.MAX_CHARACTERS + 1)
    assert (table[0, :2, :6].tolist() == [[7, -1, -1, -1, -1, -1], [8, 0, 13, 9, 0, -1]])
    assert (table[1:] == grounding.END).all()  # nothing to write: no number, none too long, none in other scripts

