"""Keep a first run quiet: hide log lines a user can do nothing about, keep every other one.

Two sources of noise, one filter each:
- Python loggers: Beam's "no GCS / no apitools" notes (the `dataflow` extra is optional), its
  "Resource module is not available" (RunInference's memory probe: Beam sets `resource` to None
  when an unrelated optional import fails) and google-api-core's "Background thread did not
  exit" when a Pub/Sub stream is closed on stop.
  `install_log_filters()` drops exactly those records.
- Native libraries: TensorFlow (under tensorflow-text) is a CUDA build; on a machine without a GPU it
  writes "Could not find cuda drivers" on import and "failed call to cuInit" on its first op, and
  sentencepiece notes "precompiled_charsmap is empty" for Gemma's tokenizer, and TensorFlow's
  oneDNN note ("custom operations are on") comes on every import, all straight to file
  descriptor 2. `native_noise_filtered()` passes fd 2 through a line filter while that happens;
  the CUDA lines are kept where an NVIDIA device exists (there they matter).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

NOT_ACTIONABLE = re.compile(
    r"Failed to import GCSFileSystem|apitools not found|Resource module is not available for current platform"
    r"|Background thread did not exit"
)
# sentencepiece's note on Gemma's tokenizer; TensorFlow's "oneDNN custom operations are on" (an INFO
# line about float round-off, printed on import whatever TF_CPP_MIN_LOG_LEVEL a later process sets)
ALWAYS_NOISE = rb"precompiled_charsmap is empty|oneDNN custom operations are on"
NO_GPU_NOISE = (rb"absl::InitializeLog\(\) is called are written to STDERR|cudart_stub\.cc.*Could not find cuda drivers"
                rb"|failed call to cuInit|Unable to register cu(DNN|FFT|BLAS) factory")


class NotActionable(logging.Filter):
    """Drops the records NOT_ACTIONABLE names."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not NOT_ACTIONABLE.search(record.getMessage())


def install_log_filters() -> None:
    """Add the filter to every handler of the root logger (records of every logger reach them)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, NotActionable) for f in handler.filters):
            handler.addFilter(NotActionable())


def gpu_present() -> bool:
    return any(Path("/dev").glob("nvidia[0-9]*"))


_FD2 = threading.RLock()  # fd 2 is the process's: one filter at a time, nested calls reuse it
_active: list[bool] = []


@contextmanager
def native_noise_filtered() -> Iterator[None]:
    """Pass fd 2 through a line filter while the body runs; CUDA lines pass where a GPU exists."""
    with _FD2:
        if _active:
            yield
            return
        _active.append(True)
        try:
            with _filtered_fd2():
                yield
        finally:
            _active.pop()


@contextmanager
def _filtered_fd2() -> Iterator[None]:
    noise = re.compile(ALWAYS_NOISE if gpu_present() else ALWAYS_NOISE + b"|" + NO_GPU_NOISE)
    sys.stderr.flush()
    saved = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)

    def forward() -> None:
        with os.fdopen(read_end, "rb") as lines:
            for line in lines:
                if not noise.search(line):
                    os.write(saved, line)

    forwarder = threading.Thread(target=forward, name="chatlens-native-stderr", daemon=True)
    forwarder.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # closes the pipe's last write end: the forwarder reads to the end
        forwarder.join(5)
        os.close(saved)
