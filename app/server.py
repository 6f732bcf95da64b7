"""Running the app under uvicorn, for `chatlens dashboard` and for tests that need a real server.

On SIGTERM/Ctrl-C uvicorn waits for open responses before the lifespan shutdown; live
event streams never finish by themselves, so the server ends them first. A clean shutdown
exits 0: uvicorn would re-raise the signal afterwards (status 143), which orchestrators and
people read as a crash.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI

GRACEFUL_SECONDS = 5


class DashboardServer(uvicorn.Server):
    """A uvicorn server that closes the live streams as soon as it is asked to stop."""

    def __init__(self, app: FastAPI, host: str, port: int, log_level: str = "info") -> None:
        self.dashboard = app
        super().__init__(uvicorn.Config(
            app, host=host, port=port, log_level=log_level, lifespan="on", proxy_headers=False,
            timeout_graceful_shutdown=GRACEFUL_SECONDS, access_log=log_level == "debug",
        ))

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """Like uvicorn's, without re-raising the signal once the shutdown is done."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame) -> None:  # type: ignore[no-untyped-def]
        self.close_streams()
        super().handle_exit(sig, frame)

    def close_streams(self) -> None:
        hub = getattr(self.dashboard.state.ctx, "hub", None)
        if hub is not None:
            hub.close_threadsafe()

    def stop(self) -> None:
        """Ask a server running in another thread to shut down cleanly."""
        self.close_streams()
        self.should_exit = True
