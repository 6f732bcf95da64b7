"""The one vocabulary of model tasks, shared by the handlers, the remote backend and the prompts.

A `StrEnum`, so a Task compares, hashes, formats and pickles as its plain string
("analyze" == Task.ANALYZE): prompt files, metrics namespaces and stored results keep
their names.
"""

from __future__ import annotations

from enum import StrEnum


class Task(StrEnum):
    ANALYZE = "analyze"  # ChatWindow -> WindowAnalysis: sentiment, summary, reply draft where selected
    SENTIMENT = "sentiment"  # ChatWindow -> (P(negative), P(neutral), P(positive))
    SUMMARY = "summary"
    REPLY = "reply"


PROMPT_TASKS = (Task.SENTIMENT, Task.SUMMARY, Task.REPLY)
"""The tasks with a prompt template of their own (prompts/<variant>/<task>.txt)."""
