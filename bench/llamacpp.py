"""llama.cpp on the same GGUF, serving chats as its server does: continuous batching.

What a user would pick to run Gemma 3 270M on a CPU, for `bench/inference.py --systems llamacpp`:
llama.cpp (through llama-cpp-python's bindings to its C API; `pip install -e '.[llamacpp]'`
compiles it) with `slots` sequences decoded side by side. As in `llama-server --parallel N
--cont-batching`, one `llama_decode` call per step carries each busy slot's next token and the
whole prompt of a chat joining a free slot; a slot is freed (its cache cells removed) as soon as
its chat has its tokens, and the next waiting chat takes it. Greedy, a fixed token budget per
chat (end-of-text does not stop it), so both systems write the same number of tokens.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np


def _quiet(level, text, user_data) -> None:
    """llama.cpp's log callback: nothing is logged."""


def _log_callback():
    import llama_cpp

    return llama_cpp.llama_log_callback(_quiet)


_QUIET = None  # made on first use, kept alive for as long as llama.cpp may call it


@dataclass
class Slot:
    chat: int
    position: int  # where the slot's next fed token goes
    budget: int  # tokens to write
    started: float
    next_token: int = -1  # the last token written, fed on the next step
    written: list[int] = field(default_factory=list)


class LlamaCppServer:
    """A llama.cpp context with `slots` parallel sequences over one unified KV cache."""

    def __init__(self, gguf_path: str, slots: int, context: int, threads: int):
        import llama_cpp as L

        self.L = L
        global _QUIET
        _QUIET = _QUIET or _log_callback()
        L.llama_log_set(_QUIET, None)  # its loading and graph notes would bury the bench's table
        L.llama_backend_init()
        params = L.llama_model_default_params()
        self.model = L.llama_model_load_from_file(gguf_path.encode(), params)
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {gguf_path}")
        self.vocabulary = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        c = L.llama_context_default_params()
        c.n_ctx, c.n_seq_max, c.kv_unified = context, slots, True
        c.n_batch = c.n_ubatch = min(context, 2048)
        c.n_threads = c.n_threads_batch = threads
        self.ctx = L.llama_init_from_model(self.model, c)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not make a context")
        self.slots = slots
        self.batch_size = c.n_batch
        self.batch = L.llama_batch_init(self.batch_size, 0, 1)

    def close(self) -> None:
        self.L.llama_batch_free(self.batch)
        self.L.llama_free(self.ctx)
        self.L.llama_model_free(self.model)

    def _decode(self, entries: Sequence[tuple[int, int, int, bool]]) -> None:
        """One llama_decode of (token, position, sequence, wants logits) entries."""
        b = self.batch
        for i, (token, position, sequence, logits) in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token, position, 1, logits
            b.seq_id[i][0] = sequence
        b.n_tokens = len(entries)
        if self.L.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")

    def _greedy(self, output: int) -> int:
        logits = self.L.llama_get_logits_ith(self.ctx, output)
        return int(np.argmax(np.ctypeslib.as_array(ctypes.cast(logits, ctypes.POINTER(ctypes.c_float)),
                                                   shape=(self.vocabulary,))))

    def serve(self, prompts: Sequence[list[int]], budgets: Sequence[int],
              done: Callable[[int, float], None] = lambda chat, seconds: None) -> list[list[int]]:
        """Every prompt's greedy continuation of its budget's tokens, `slots` at a time; `done(chat,
        seconds)` as each finishes, with the seconds from its prompt's first step to its last token."""
        memory = self.L.llama_get_memory(self.ctx)
        self.L.llama_memory_clear(memory, True)
        waiting = list(range(len(prompts)))
        busy: dict[int, Slot] = {}  # sequence id -> its chat's slot
        out: list[list[int]] = [[] for _ in prompts]
        while waiting or busy:
            entries, readers = [], []  # readers: (sequence, entry index whose logits give its next token)
            for sequence, slot in busy.items():  # each busy slot's last token, fed to read the next
                entries.append((slot.next_token, slot.position, sequence, True))
                readers.append((sequence, len(entries) - 1))
                slot.position += 1
            for sequence in (s for s in range(self.slots) if s not in busy):
                if not waiting or len(entries) + len(prompts[waiting[0]]) > self.batch_size:
                    break
                chat = waiting.pop(0)
                prompt = prompts[chat]
                busy[sequence] = Slot(chat, len(prompt), budgets[chat], time.perf_counter())
                entries += [(t, p, sequence, p == len(prompt) - 1) for p, t in enumerate(prompt)]
                readers.append((sequence, len(entries) - 1))
            self._decode(entries)
            for sequence, output in readers:
                slot = busy[sequence]
                slot.next_token = self._greedy(output)
                slot.written.append(slot.next_token)
                if len(slot.written) >= slot.budget:  # its last token needs no step of its own
                    out[slot.chat] = slot.written
                    done(slot.chat, time.perf_counter() - slot.started)
                    self.L.llama_memory_seq_rm(memory, sequence, -1, -1)
                    del busy[sequence]
        return out
