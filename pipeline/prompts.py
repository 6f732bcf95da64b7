"""Versioned prompt templates from `prompts/`, and the fencing of untrusted chat text.

Chat text is data, never instructions: every message becomes one line `role: text` inside a
fence, with newlines folded, fence markers and the model's control tokens neutralised, so a
customer cannot close the fence, fake an agent line or open a model turn. Long chats are cut
from the oldest messages (with a visible marker) to fit the model's context.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from chatlens.contracts import ChatMessage
from pipeline.model.types import PROMPT_TASKS, Task
from pipeline.package_data import shipped

PROMPTS_DIR = Path(os.environ.get("CHATLENS_PROMPTS_DIR") or shipped("prompts"))  # package data in a wheel
TASKS = PROMPT_TASKS
VARIANTS = ("completion", "chat")
OMITTED_MARKER = "[earlier messages omitted]"

_CONTROL_TOKEN = re.compile(
    r"<\s*(/?)\s*(start_of_turn|end_of_turn|bos|eos|pad|unk|mask|start_of_image|end_of_image|chat)\s*>",
    re.IGNORECASE,
)
_FENCE = re.compile(r"<{3,}|>{3,}")
_LINE_BREAKS = re.compile(r"\s*[\r\n\u2028\u2029]+\s*")


def neutralise(text: str) -> str:
    """Make untrusted text inert inside a prompt, keeping it readable for the model."""
    text = _CONTROL_TOKEN.sub(lambda m: f"({m.group(1)}{m.group(2)})", text)
    text = _FENCE.sub(lambda m: "‹" * len(m.group()) if m.group()[0] == "<" else "›" * len(m.group()), text)
    return _LINE_BREAKS.sub(" / ", text).strip()


def transcript_lines(messages: Sequence[ChatMessage], speakers: dict[str, str] | None = None,
                     clean: Callable[[str], str] = neutralise) -> list[str]:
    """One `speaker: text` line per message; `speakers` renames the senders, `clean` fences the text."""
    return [f"{(speakers or {}).get(message.sender, message.sender)}: {clean(message.text)}" for message in messages]


def fit_transcript(lines: Sequence[str], fits: Callable[[str], bool]) -> tuple[str, bool]:
    """The longest suffix of `lines` that `fits`, and whether older lines were dropped.

    Binary search over how many of the oldest lines to drop, so a long chat costs a few
    tokenizer calls, not one per message. The newest line is always kept (cut if need be).
    """
    full = "\n".join(lines)
    if fits(full):
        return full, False

    def with_marker(start: int) -> str:
        return "\n".join([OMITTED_MARKER, *lines[start:]])

    low, high = 1, len(lines) - 1  # the smallest number of oldest lines to drop that fits
    while low < high:
        middle = (low + high) // 2
        if fits(with_marker(middle)):
            high = middle
        else:
            low = middle + 1
    if low < len(lines) and fits(with_marker(low)):
        return with_marker(low), True
    newest = lines[-1]
    while len(newest) > 16 and not fits(f"{OMITTED_MARKER}\n{newest} …"):
        newest = newest[: len(newest) * 3 // 4]
    return f"{OMITTED_MARKER}\n{newest} …", True


@dataclass(frozen=True)
class PromptSet:
    """One variant (completion or chat) of the prompt templates, with its scoring labels."""

    version: str
    variant: str
    templates: dict[str, str]
    labels: tuple[str, str, str]
    calibration: tuple[str, ...]
    stop: dict[str, tuple[str, ...]]  # task -> strings that end its generated answer
    answer_prefix: dict[str, str]  # task -> opening the template ends with; part of the answer

    def render(self, task: str, transcript: str) -> str:
        return self.templates[task].replace("{transcript}", transcript)

    def overhead(self, task: str) -> str:
        """The template without a transcript: what every prompt of this task costs."""
        return self.render(task, "")


@lru_cache
def load_prompts(variant: str, directory: Path = PROMPTS_DIR) -> PromptSet:
    if variant not in VARIANTS:
        raise ValueError(f"unknown prompt variant {variant!r}; expected one of {VARIANTS}")
    manifest = tomllib.loads((directory / "prompts.toml").read_text(encoding="utf-8"))
    section = manifest[variant]
    templates = {}
    for task in TASKS:
        text = (directory / section["templates"] / f"{task}.txt").read_text(encoding="utf-8")
        if text.count("{transcript}") != 1:
            raise ValueError(f"{variant}/{task}.txt must contain {{transcript}} exactly once")
        templates[task] = text.removesuffix("\n")  # the editor's final newline is not prompt text
    labels = tuple(section["labels"])
    if len(labels) != 3:
        raise ValueError("a prompt variant needs exactly three labels: negative, neutral, positive")
    generated = (Task.SUMMARY, Task.REPLY)  # the tasks whose answer the model writes out
    prefixes = {task: section["answer_prefix"].get(task, "") for task in generated}
    for task, prefix in prefixes.items():
        if not templates[task].endswith(prefix):
            raise ValueError(f"{variant}/{task}.txt must end with its answer prefix {prefix!r}")
    return PromptSet(
        version=f"{manifest['version']}/{variant}",
        variant=variant,
        templates=templates,
        labels=labels,  # type: ignore[arg-type]
        calibration=tuple(section["calibration"]),
        stop={task: tuple(section["stop"][task]) for task in generated},
        answer_prefix=prefixes,
    )
