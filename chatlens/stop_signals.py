"""Wait in a long-running command's main thread until SIGTERM or Ctrl-C asks it to stop.

Python runs a signal handler in the main thread, between two bytecodes, once that thread runs
again. A handler that calls `threading.Event.set()` while the main thread sleeps in
`Event.wait()` fails two ways: when the kernel hands the signal to another thread (gRPC and Beam
start many), nothing wakes the main thread, so the handler never runs; and when the signal
lands while the main thread holds the event's own lock inside `wait()`, `set()` waits for that
lock forever. A CI run saw `chatlens pubsub-emulator` ignore SIGTERM. So the handler here only
records the signal, and the main thread looks for it a few times a second.
"""

from __future__ import annotations

import signal
import threading
import time

POLL_S = 0.1  # how late a stop may be noticed


class StopSignals:
    """Catch SIGTERM and SIGINT while in the `with` block; `received` lists those that came."""

    def __init__(self, signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
        self.signals = signals
        self.received: list[int] = []
        self._previous: dict[int, object] = {}

    def __enter__(self) -> StopSignals:
        self._previous = {sig: signal.signal(sig, self._record) for sig in self.signals}
        return self

    def __exit__(self, *exc_info) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _record(self, signum: int, _frame) -> None:
        self.received.append(signum)  # no lock: see the module's docstring

    def wait(self, timeout: float | None = None, until: threading.Event | None = None) -> bool:
        """True once a signal came or `until` is set; False when `timeout` seconds passed first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.received and not (until is not None and until.is_set()):
            left = POLL_S if deadline is None else min(POLL_S, deadline - time.monotonic())
            if left <= 0:
                return False
            time.sleep(left)
        return True

    @property
    def name(self) -> str:
        """The first signal's name, e.g. SIGTERM ('' before any came)."""
        return signal.Signals(self.received[0]).name if self.received else ""
