"""Shared pytest fixtures."""

from __future__ import annotations

import os

import pytest

from pipeline.model.environment import use_default_env

use_default_env()  # as every entry point does: before anything imports keras or JAX

# The real-Gemma fixtures are session-scoped: registered once here, so every module shares one
# converted model (a module that imported them would get its own copy: 2.3 GB and minutes each).
pytest_plugins = ["tests.support.models"]


_SERVER = pytest.StashKey()


@pytest.fixture
def pubsub_server(request):
    """A fresh in-process Pub/Sub emulator on a free port; yields its "host:port".

    Point clients at it with `monkeypatch.setenv("PUBSUB_EMULATOR_HOST", pubsub_server)`.
    Under `@pytest.mark.pubsub_worst_case` it delivers as badly as at-least-once allows
    (localpubsub.state.WorstCase: out of order, 2% of messages twice); the seed is printed,
    and CHATLENS_TEST_PUBSUB_SEED replays one.
    """
    import random

    from localpubsub.emulator import EmulatorServer
    from localpubsub.state import WorstCase

    worst_case = None
    if request.node.get_closest_marker("pubsub_worst_case"):
        seed = int(os.environ.get("CHATLENS_TEST_PUBSUB_SEED") or random.randrange(2**31))
        worst_case = WorstCase(seed=seed)
        print(f"\nPub/Sub worst-case delivery, seed {seed} (CHATLENS_TEST_PUBSUB_SEED={seed} replays it)")
    with EmulatorServer("localhost", 0, worst_case=worst_case) as server:
        request.node.stash[_SERVER] = server
        yield server.address
        if worst_case is not None:
            print(f"\nPub/Sub worst-case delivery (seed {seed}): {server.worst_case_summary()}")


@pytest.fixture
def pubsub_broker(request, pubsub_server):
    """`pubsub_server`'s broker (localpubsub.state): for tests that must order what the server
    does against what a client does."""
    return request.node.stash[_SERVER].broker


@pytest.fixture
def spontaneous_copies(request, pubsub_server):
    """How many worst-case spontaneous copies `pubsub_server` has delivered so far, all
    subscriptions together: the most duplicates an at-least-once subscriber may have seen."""
    server = request.node.stash[_SERVER]
    return lambda: server.broker.delivery_stats()["duplicates"]


@pytest.fixture
def emulator(pubsub_server, monkeypatch):
    """`pubsub_server` with ChatLens's topics and subscriptions in the tests' project, and
    PUBSUB_EMULATOR_HOST pointing at it (the pipeline and replay tests' Pub/Sub)."""
    from localpubsub.admin import ensure_layout
    from tests.support.pipeline import PROJECT

    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", pubsub_server)
    ensure_layout(PROJECT)
    return pubsub_server


@pytest.fixture(scope="session", autouse=True)
def postgres_for_the_run():
    """CHATLENS_TEST_DATABASE_URL for the PostgreSQL variants: the one given, else a throwaway
    server started for this run (tests/support/postgres.py); without one they fail, never skip."""
    if os.environ.get("CHATLENS_TEST_DATABASE_URL"):
        yield
        return
    from tests.support.postgres import PostgresUnavailable, throwaway_postgres

    try:
        with throwaway_postgres() as url:
            os.environ["CHATLENS_TEST_DATABASE_URL"] = url
            yield
            os.environ.pop("CHATLENS_TEST_DATABASE_URL", None)
    except PostgresUnavailable as error:
        os.environ["CHATLENS_TEST_POSTGRES_ERROR"] = str(error)
        yield
