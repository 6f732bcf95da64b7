"""The team's reply library as the pipeline reads it: a file, read again when it changes.

Supervisors edit the library in the dashboard, which writes it whole to one file
(`CHATLENS_REPLY_LIBRARY`); the pipeline is pointed at the same file (`--reply-library`, a local
path or any Beam filesystem, e.g. `gs://bucket/reply-library.json`) and looks at its modification
time at most once per `interval_secs`, so an edit reaches the drafts within a minute without a
restart. A file that cannot be read or is not a library keeps the last good one (logged), and
the shipped library serves until a first good read: a bad edit never stops the drafts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from chatlens.contracts import ReplyLibrary
from chatlens.replies import DEFAULT_LIBRARY, read_library

log = logging.getLogger(__name__)

CHECK_INTERVAL_SECS = 30.0


class ReplyLibraryFile:
    """`current()`: the library in `path` (None: the shipped one), as of its last change."""

    def __init__(self, path: str | None = None, interval_secs: float = CHECK_INTERVAL_SECS,
                 clock: Callable[[], float] = time.monotonic):
        self.path = path
        self.interval_secs = interval_secs
        self._clock = clock
        self._lock = threading.Lock()
        self._library = read_library(DEFAULT_LIBRARY)
        self._seen: float | None = None  # the file's modification time when last read
        self._next_check = 0.0

    def current(self) -> ReplyLibrary:
        if self.path is None:
            return self._library
        with self._lock:
            now = self._clock()
            if now >= self._next_check:
                self._next_check = now + self.interval_secs
                self._refresh()
            return self._library

    def _refresh(self) -> None:
        from apache_beam.io.filesystems import FileSystems

        try:
            changed = FileSystems.match([self.path])[0].metadata_list[0].last_updated_in_seconds
            if changed == self._seen:
                return
            with FileSystems.open(self.path) as source:
                library = ReplyLibrary.model_validate_json(source.read())
        except Exception as error:  # noqa: BLE001 - keep drafting from the last good library
            log.warning("reply library %s not read, still using the one read before: %s", self.path, error)
            return
        self._library, self._seen = library, changed
        log.info("reply library %s: %d macros", self.path, len(library.macros))
