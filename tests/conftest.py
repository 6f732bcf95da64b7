"""Shared pytest fixtures."""

from __future__ import annotations

import pytest


@pytest.fixture
def pubsub_server():
    """A fresh in-process Pub/Sub emulator on a free port; yields its "host:port".

    Point clients at it with `monkeypatch.setenv("PUBSUB_EMULATOR_HOST", pubsub_server)`.
    """
    from chatlens.pubsub.emulator import EmulatorServer

    with EmulatorServer("localhost", 0) as server:
        yield server.address
