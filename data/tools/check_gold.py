"""Checks a source file's gold against the eval's own rules: grounding of numbers and names, reply language.

check_source.py is stdlib-only and catches numbers; this one runs the project's scorers
(`pipeline.scoring`), so a gold answer the eval would call ungrounded or in the wrong
language is caught while its chat is still being written.

Usage: .venv/bin/python data/tools/check_gold.py data/source/t1.jsonl [more files]
Exit 1 when any line fails.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from data.tools.build import window_of  # noqa: E402
from pipeline import scoring  # noqa: E402
from pipeline.evaluate import transcript_text  # noqa: E402


def problems(record: dict) -> list[str]:
    transcript = transcript_text(window_of(record))  # the text the eval checks against
    found = []
    missing = scoring.ungrounded(record["summary"], transcript)
    if missing:
        found.append(f"summary names or numbers not in the chat: {missing}")
    if scoring.language_of(record["summary"]) != "en":
        found.append("summary is not recognised as English")
    if record["reply"]:
        missing = scoring.ungrounded(record["reply"], transcript, record["language"])
        if missing:
            found.append(f"reply names or numbers not in the chat: {missing}")
        language = scoring.language_of(record["reply"])
        if language != record["language"]:
            found.append(f"reply is recognised as {language!r}, not {record['language']!r}")
    return found


def main(paths: list[str]) -> int:
    failed = 0
    for path in paths:
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            if line.strip():
                record = json.loads(line)
                for problem in problems(record):
                    failed += 1
                    print(f"{record['id']}: {problem}")
        print(f"== {path}: {failed} problems so far")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
