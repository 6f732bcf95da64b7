"""The decoding loop's rows between its calls: which chat each row holds, each row's inputs, and
the state the loop carries for it (`one_pass`'s continuous batching).

A call's chats decode a few rows side by side. A row whose chat is done leaves its outputs here;
a waiting chat joins in its place (its prompt prefilled into that row of the loop's cache), and
the loop goes on with the rows still decoding: no row waits for the batch's longest chat.
All rows write at the loop's one position (one in-place write a layer and step; a write per row
was a scatter, 24% slower a step here); a chat joins at that position, its prompt's keys rotated
on to end there, and reads its own positions only (`first`). Rotary attention sees relative
positions alone, so a chat's tokens do not depend on when it joined or beside whom (up to
rounding)."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import numpy as np

from pipeline.model.decoding import grounding

SUMMARY, REPLY_CUE, REPLY, DONE = 0, 1, 2, 3  # a row's phase while decoding


def _carried(size: int, steps: int, numbers) -> dict:
    """The loop's state for `size` rows that hold no chat (`DONE`), as numpy arrays."""
    zeros = np.zeros(size, "int32")
    return {"phase": zeros + DONE, "count": zeros, "shown": zeros, "cue_at": zeros, "written": zeros,
            "tokens": np.zeros((size, steps), "int32"), "phases": np.full((size, steps), DONE, "int32"),
            "believed": np.zeros((size, steps), "float32"),
            "number": () if numbers is None else jax.tree.map(np.asarray, grounding.NumberState.start(numbers))}


@dataclass
class LoopRows:
    """The rows of one call's decoding loop. `carried` is the loop's per-row state (each phase,
    token counts, tokens written, their phases and log-probabilities, the number grounding's state),
    passed in and returned by every loop call."""

    chat: np.ndarray  # (R,) the chat each row holds, -1 for none
    first: np.ndarray  # (R,) each row's chat's first position: before it, padding or another chat's
    wants_reply: np.ndarray  # (R,)
    numbers: np.ndarray | None  # (R, MAX_NUMBERS, MAX_CHARACTERS + 1): each row's chat's numbers
    carried: dict
    position: int  # where the loop writes next, every row alike

    @classmethod
    def empty(cls, size: int, steps: int, ground_numbers: bool, position: int) -> LoopRows:
        numbers = grounding.number_table([""] * size) if ground_numbers else None
        return cls(np.full(size, -1), np.zeros(size, "int32"), np.zeros(size, bool), numbers,
                   _carried(size, steps, numbers), position)

    def free(self) -> list[int]:
        """Rows that hold no chat."""
        return np.flatnonzero(self.chat < 0).tolist()

    def busy(self) -> bool:
        return bool(np.any(self.chat >= 0))

    def join(self, row: int, chat: int, first: int, wants_reply: bool, numbers) -> None:
        """Chat `chat` decodes in `row` (its prompt prefilled there from position `first` on, to end at
        the loop's position: `one_pass`'s prefill), its state that of a row not begun."""
        self.chat[row], self.first[row], self.wants_reply[row] = chat, first, wants_reply
        if numbers is not None:
            self.numbers[row] = numbers
        steps = self.carried["tokens"].shape[1]
        fresh = _carried(1, steps, None if numbers is None else numbers[None])
        fresh["phase"][:] = SUMMARY
        self.carried = jax.tree.map(lambda old, new: _set_row(old, row, new[0]), self.carried, fresh)

    def finished(self) -> list[tuple[int, int]]:
        """(row, chat) of the rows whose chat is done; they hold none after this."""
        finished = (self.carried["phase"] == DONE) & (self.chat >= 0)
        done = [(row, int(self.chat[row])) for row in np.flatnonzero(finished)]
        for row, _ in done:
            self.chat[row] = -1
        return done

    def written(self, row: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A row's tokens, their phases and their log-probabilities, as the loop wrote them."""
        return self.carried["tokens"][row], self.carried["phases"][row], self.carried["believed"][row]


def _set_row(array: np.ndarray, row: int, value) -> np.ndarray:
    array = np.array(array)  # the loop's outputs are read-only views
    array[row] = value
    return array
