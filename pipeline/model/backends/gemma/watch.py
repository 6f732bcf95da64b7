"""Model updates without restarting the job: find the newest preset matching a file pattern.

Beam's own mechanism is RunInference's `watch_model_pattern`: `WatchFilePattern` turns
new files into a model-metadata side input and RunInference calls the handler's
`update_model_path`. The pipeline uses it on Dataflow and other portable runners. The
local BundleBasedDirectRunner cannot run it: `PeriodicImpulse` is a splittable DoFn it
does not expand in streaming, and it only releases a side input once the side input's
watermark passes the end of the main input's window, which for the global window of a
model-metadata side input never happens. So on local runners the handler looks for new
presets itself with `PresetWatch`, following the same rules:

- the pattern matches a file inside a preset directory, e.g. `/models/*/config.json` or
  `gs://bucket/presets/*/metadata.json`; the preset is the directory holding the match;
- only matches that appear or change after the watch started count (the job starts on
  `--model`), and the newest of them wins;
- write a new preset somewhere else and move it in (or upload the matched file last),
  so the watch never sees a half-written one.
"""

from __future__ import annotations

import logging
import posixpath
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

WATCH_INTERVAL_SECS = 60
"""How often the watch looks for new presets unless told (`--model-watch-interval-secs`)."""
PRESET_FILES = ("config.json", "metadata.json", "chatlens.json", "model.weights.h5", "tokenizer.json")


def preset_of(path: str) -> str:
    """The preset directory for a model path: a path that names a file of a preset means its directory."""
    stripped = path.rstrip("/")
    if posixpath.basename(stripped) in PRESET_FILES:
        return posixpath.dirname(stripped)
    return stripped


class PresetWatch:
    """Polls a file pattern (local or any Beam filesystem) for a newer model preset."""

    def __init__(self, pattern: str, interval_secs: float = 60.0, since: float | None = None,
                 clock: Callable[[], float] = time.time):
        """`since`: when the job started (default now); matches changed before it are the baseline."""
        self.pattern = pattern
        self.interval_secs = interval_secs
        self._clock = clock
        self._since = clock() if since is None else since
        self._next_check = 0.0
        self._known: dict[str, float] | None = None  # path -> modification time, as last seen
        self._latest: tuple[float, str] | None = None

    def latest(self) -> str | None:
        """The preset of the newest new or changed match since the watch started (None: none yet).

        Checks the file system at most once per `interval_secs`; between checks it
        answers from memory, so calling it for every batch costs nothing.
        """
        now = self._clock()
        if now >= self._next_check:
            self._next_check = now + self.interval_secs
            self._scan()
        return self._latest[1] if self._latest else None

    def _scan(self) -> None:
        from apache_beam.io.filesystems import FileSystems

        try:
            matches = FileSystems.match([self.pattern])[0].metadata_list
        except Exception as error:  # noqa: BLE001 - a bad scan must not fail inference
            log.warning("model watch %s: %s", self.pattern, error)
            return
        first = self._known is None
        known = self._known or {}
        for meta in matches:
            changed = meta.last_updated_in_seconds
            new = changed > self._since if first else known.get(meta.path) != changed
            if new and (self._latest is None or changed >= self._latest[0]):
                self._latest = (changed, preset_of(meta.path))
        self._known = {meta.path: meta.last_updated_in_seconds for meta in matches}
