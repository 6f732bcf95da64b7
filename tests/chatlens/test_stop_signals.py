"""StopSignals: a stop request reaches a command's main thread whichever thread the kernel hands it to."""

from __future__ import annotations

import signal
import threading
import time

from chatlens.stop_signals import StopSignals


def test_a_sigterm_handed_to_another_thread_still_ends_the_wait():
    # gRPC and Beam run many threads; `threading.Event.wait()` in the main thread never wakes
    # for a signal the kernel gives one of them (the emulator once ignored SIGTERM in CI).
    def deliver_to_this_thread():
        time.sleep(0.2)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

    with StopSignals() as stop:
        threading.Thread(target=deliver_to_this_thread, daemon=True).start()
        started = time.monotonic()
        assert stop.wait(timeout=10)
        assert time.monotonic() - started < 5
    assert stop.received == [signal.SIGTERM]
    assert stop.name == "SIGTERM"


def test_a_wait_ends_on_its_timeout_or_event_and_the_old_handlers_come_back():
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    finished = threading.Event()
    with StopSignals() as stop:
        assert signal.getsignal(signal.SIGTERM) != before[signal.SIGTERM]
        assert stop.wait(timeout=0.3) is False
        threading.Timer(0.2, finished.set).start()
        assert stop.wait(timeout=10, until=finished) is True
    assert stop.received == [] and stop.name == ""
    assert {sig: signal.getsignal(sig) for sig in before} == before
