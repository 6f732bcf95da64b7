"""Schemathesis against a live dashboard: every operation of /openapi.json, generated requests
(valid and invalid) sent as an agent and as a supervisor with their session cookie and CSRF
token, through a real uvicorn on a real database; no answer may be a server error.

The budget is bounded (MAX_EXAMPLES per operation and mode; CHATLENS_FUZZ_EXAMPLES for a
deeper run) and derandomized, so a run is repeatable and adds well under a minute. A failure
names the operation and gives a curl command to reproduce it.
"""

from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from tests.support.app import dashboard_settings, make_insight, running_server, staffed_database, store

from app.crud import audit
from app.crud.ingest import ingest_dead_letter, ingest_insight
from app.db import Database
from app.main import create_app
from chatlens.contracts import DeadLetter

MAX_EXAMPLES = int(os.environ.get("CHATLENS_FUZZ_EXAMPLES", "10"))  # a deeper run: CHATLENS_FUZZ_EXAMPLES=200
CHATS = ("c-1", "c-2", "c-3")
ROLES = ("alice", "sam")  # an agent, a supervisor
LEFT_OUT = {
    ("GET", "/api/events"): "an event stream: it answers only when the session ends",
    ("DELETE", "/api/session"): "logout: it would end the sessions the other requests use",
}


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """(database URL, base URL, {username: (session cookie, CSRF token)}) of a running dashboard with some chats."""
    url, tokens = staffed_database("sqlite", tmp_path_factory.mktemp("fuzz"))
    store(url, *(make_insight(chat_id, sentiment=sentiment) for chat_id, sentiment in zip(CHATS, (-1, 0, 1))))
    db = Database(url)
    ingest_insight(db, b'{"chat_id": "broken"}', message_id="m-bad")
    letter = DeadLetter.from_exception(b"not json", "parse", ValueError("bad input"))
    ingest_dead_letter(db, letter.model_dump_json().encode(), message_id="m-dl")
    db.dispose()
    with running_server(create_app(dashboard_settings(url))) as base:
        yield url, base, tokens


def test_no_generated_request_gets_a_server_error(live):
    url, base, tokens = live
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    labels = {(op.method.upper(), op.path) for op in operations}
    assert set(LEFT_OUT) <= labels and ("PUT", "/api/chats/{chat_id}/draft") in labels
    failures: list[str] = []
    tested = 0
    for operation in operations:
        if (operation.method.upper(), operation.path) in LEFT_OUT:
            continue
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
                      phases=[Phase.explicit, Phase.generate, Phase.shrink],
                      suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode))
            def run(case) -> None:
                for username in ROLES:
                    token, csrf = tokens[username]
                    case.call_and_validate(base_url=base, headers={"X-CSRF-Token": csrf},
                                           cookies={"chatlens_session": token}, checks=[not_a_server_error],
                                           timeout=30)
                    if (case.path_parameters or {}).get("chat_id") not in (None, *CHATS):
                        # A generated id is hardly ever a stored chat's: the same request on one, too.
                        case.path_parameters["chat_id"] = CHATS[len(case.path_parameters["chat_id"]) % len(CHATS)]
                        case.call_and_validate(base_url=base, headers={"X-CSRF-Token": csrf},
                                               cookies={"chatlens_session": token}, checks=[not_a_server_error],
                                               timeout=30)

            try:
                run()
            except Unsatisfiable:  # nothing in it can be made invalid (no body, free-text parameters)
                continue
            except Exception as error:  # noqa: BLE001 - collected, so one run reports every operation
                failures.append(f"{operation.label} ({mode.value}): {error}")
            tested += 1
    assert tested >= 15 + 8
    assert not failures, "\n\n".join(failures)
    db = Database(url)
    with db.read() as session:  # the generated requests reached stored chats, not only 404s
        actions = audit.action_counts(session)
    db.dispose()
    assert actions.get("copy", 0) > 0 and sum(actions.values()) > 10, actions
