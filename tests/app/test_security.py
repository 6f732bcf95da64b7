"""Dashboard security: escaping, CSRF, authentication, roles, throttling, sessions."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from unittest import mock

import httpx
import pytest
from tests.support.app import (
    PASSWORD,
    dashboard_settings,
    make_insight,
    running_server,
    sign_in,
    staffed_database,
    store,
)
from fastapi.testclient import TestClient

from app import security
from app.crud import users
from app.crud.ingest import ingest_dead_letter, ingest_insight
from app.db import Database
from app.main import create_app
from chatlens.contracts import DeadLetter

SCRIPT = "<script>alert('xss')</script>"
IMG = '"><img src=x onerror=alert(1)>'


@pytest.fixture
def staffed(tmp_path):
    return staffed_database("sqlite", tmp_path)


@pytest.fixture
def app(staffed):
    url = staffed[0]
    store(url, make_insight("evil", sentiment=-1, texts=[("customer", SCRIPT), ("customer", IMG)],
                            summary=f"Summary {IMG}", reply=f"Reply {SCRIPT}"),
          make_insight("calm", sentiment=0))
    return create_app(dashboard_settings(url))


@pytest.fixture
def anon(app):
    with TestClient(app) as client:
        yield client


@pytest.fixture
def client_for(app, staffed, anon):
    def make(username: str) -> TestClient:
        return sign_in(TestClient(app), staffed[1], username)
    return make


def assert_inert(html: str) -> None:
    """Neither payload is markup; at least one of them is on the page, as text."""
    assert SCRIPT not in html and "<img src=x" not in html and "onerror=alert(1)>" not in html
    assert ("&lt;script&gt;alert(&#39;xss&#39;)&lt;/script&gt;" in html
            or "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;" in html)


def test_chat_text_is_escaped_everywhere_it_is_shown(client_for, staffed):
    db = Database(staffed[0])
    ingest_insight(db, f'{{"chat_id": "bad", "note": "{SCRIPT}"}}'.encode(), message_id="m-1")
    letter = DeadLetter.from_exception(f"{IMG}{SCRIPT}".encode(), "parse", ValueError(IMG + SCRIPT))
    ingest_dead_letter(db, letter.model_dump_json().encode(), message_id="m-2")
    db.dispose()

    agent = client_for("alice")
    sam = client_for("sam")
    agent.post("/api/chats/evil/reject", json={"version": 1, "reason": SCRIPT + IMG})
    for client, path in [(agent, "/"), (agent, "/chats/evil"), (agent, "/?q=script"),
                         (sam, "/audit"), (sam, "/errors"), (sam, "/chats/evil")]:
        page = client.get(path)
        assert page.status_code == 200, path
        assert_inert(page.text)
    detail = agent.get("/chats/evil", headers={"HX-Request": "true", "HX-Target": "detail"}).text
    assert "Reply &lt;script&gt;alert(&#39;xss&#39;)&lt;/script&gt;</textarea>" in detail
    assert "<html" not in detail  # the htmx partial is only the review pane


def test_pages_forbid_inline_scripts_and_framing(anon):
    headers = anon.get("/login").headers
    assert "script-src 'self'" in headers["content-security-policy"]
    assert "unsafe-inline" not in headers["content-security-policy"]
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize(("method", "path", "body"), [
    ("put", "/api/chats/calm/draft", {"json": {"text": "hi", "version": 1}}),
    ("post", "/api/chats/calm/approve", {"json": {"version": 1}}),
    ("post", "/api/chats/calm/handled", {}),
    ("post", "/chats/calm/handled", {"data": {}}),
    ("post", "/chats/calm/draft", {"data": {"version": "1", "text": "hi"}}),
    ("post", "/logout", {"data": {}}),
    ("delete", "/api/session", {}),
])
def test_changes_without_the_csrf_token_are_refused(client_for, method, path, body):
    client = client_for("alice")
    good = client.headers.pop("X-CSRF-Token")
    assert getattr(client, method)(path, **body).status_code == 403
    client.headers["X-CSRF-Token"] = "not-" + good
    assert getattr(client, method)(path, **body).status_code == 403
    assert client.get("/api/chats/calm").json()["version"] == 1  # nothing changed
    assert client.get("/api/session").status_code == 200  # still logged in


def test_csrf_token_in_a_form_field_is_accepted(client_for, staffed):
    client = client_for("alice")
    csrf = client.headers.pop("X-CSRF-Token")
    response = client.post("/chats/calm/handled", data={"csrf_token": csrf}, follow_redirects=False)
    assert response.status_code == 303


@pytest.mark.parametrize("path", ["/", "/chats/calm", "/audit", "/errors", "/?status=all"])
def test_html_pages_send_strangers_to_the_login_page(anon, path):
    response = anon.get(path, follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["location"].startswith("/login?next=/")


@pytest.mark.parametrize(("method", "path"), [
    ("get", "/api/chats"), ("get", "/api/chats/calm"), ("get", "/api/audit"), ("get", "/api/events"),
    ("post", "/api/chats/calm/handled"), ("put", "/api/chats/calm/draft"), ("get", "/api/session"),
])
def test_the_api_answers_strangers_with_401(anon, method, path):
    assert getattr(anon, method)(path).status_code == 401


def test_htmx_requests_of_strangers_are_redirected_by_header(anon):
    response = anon.get("/partials/queue", headers={"HX-Request": "true"})
    assert response.status_code == 401 and response.headers["hx-redirect"].startswith("/login")


@pytest.mark.parametrize("path", ["/audit", "/errors", "/api/audit", "/api/errors"])
def test_agents_cannot_see_supervisor_pages(client_for, path):
    assert client_for("alice").get(path).status_code == 403
    assert client_for("sam").get(path).status_code == 200


def test_login_form_sets_an_httponly_session_and_logout_ends_it(anon):
    form = anon.get("/login?next=/chats/calm")
    token = form.text.split('name="csrf_token" value="')[1].split('"')[0]
    response = anon.post("/login", data={"username": "alice", "password": PASSWORD, "csrf_token": token,
                                         "next": "/chats/calm"}, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/chats/calm"
    cookie = response.headers["set-cookie"]
    assert "chatlens_session=" in cookie and "HttpOnly" in cookie and "SameSite=lax" in cookie.replace("Lax", "lax")
    page = anon.get("/")
    assert page.status_code == 200 and "alice" in page.text
    csrf = page.text.split('name="csrf-token" content="')[1].split('"')[0]
    assert anon.post("/logout", data={"csrf_token": csrf}, follow_redirects=False).status_code == 303
    assert anon.get("/", follow_redirects=False).status_code == 303


def test_login_form_needs_its_own_csrf_token(anon):
    response = anon.post("/login", data={"username": "alice", "password": PASSWORD, "csrf_token": "forged"})
    assert response.status_code == 403 and "form expired" in response.text
    assert anon.get("/api/session").status_code == 401


def test_login_redirects_only_within_the_site(anon):
    form = anon.get("/login")
    token = form.text.split('name="csrf_token" value="')[1].split('"')[0]
    response = anon.post("/login", data={"username": "bob", "password": PASSWORD, "csrf_token": token,
                                         "next": "https://evil.example/"}, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/"
    for target in ["//evil.example/", "javascript:alert(1)", "/\\evil.example", "/queue"]:
        response = anon.get("/login", params={"next": target}, follow_redirects=False)
        assert response.headers["location"] == ("/queue" if target == "/queue" else "/"), target


def test_json_login_wants_json(anon):
    response = anon.post("/api/session", content=f'{{"username": "alice", "password": "{PASSWORD}"}}',
                         headers={"Content-Type": "text/plain"})
    assert response.status_code in (415, 422)
    assert anon.get("/api/session").status_code == 401


def test_brute_force_logins_are_locked_out(anon, app):
    for _ in range(5):
        assert anon.post("/api/session", json={"username": "alice", "password": "guess"}).status_code == 401
    locked = anon.post("/api/session", json={"username": "alice", "password": PASSWORD})
    assert locked.status_code == 429 and int(locked.headers["retry-after"]) > 0
    assert "Try again in" in locked.json()["detail"]
    # Another account from the same address is still usable (its own key is clean).
    assert anon.post("/api/session", json={"username": "bob", "password": PASSWORD}).status_code == 200
    # The HTML form says the same, with a status a script can see.
    browser = TestClient(app)
    form = browser.get("/login")
    token = form.text.split('name="csrf_token" value="')[1].split('"')[0]
    page = browser.post("/login", data={"username": "alice", "password": PASSWORD, "csrf_token": token})
    assert page.status_code == 429 and "Too many failed logins" in page.text


def test_wrong_passwords_and_unknown_users_look_the_same(anon):
    wrong = anon.post("/api/session", json={"username": "alice", "password": "nope-nope"})
    unknown = anon.post("/api/session", json={"username": "mallory", "password": "nope-nope"})
    assert wrong.status_code == unknown.status_code == 401
    assert wrong.json() == unknown.json()


def test_disabling_a_user_ends_their_sessions(client_for, staffed):
    bob = client_for("bob")
    assert bob.get("/api/chats").status_code == 200
    db = Database(staffed[0])
    users.set_disabled(db, "bob")
    db.dispose()
    assert bob.get("/api/chats").status_code == 401
    assert bob.post("/api/session", json={"username": "bob", "password": PASSWORD}).status_code == 401


def test_session_cookie_is_opaque_and_only_its_hash_is_stored(staffed):
    from sqlalchemy import select

    from app.models import UserSession

    token = staffed[1]["alice"][0]
    db = Database(staffed[0])
    with db.read() as session:
        stored = list(session.scalars(select(UserSession.token_hash)))
    db.dispose()
    assert len(token) >= 40 and token not in stored and len(stored) == 3


def test_a_generated_session_secret_is_stored_and_shared_by_processes(tmp_path):
    from sqlalchemy import select

    from app.models import AppSecret

    url = staffed_database("sqlite", tmp_path)[0]
    first = create_app(dashboard_settings(url, session_secret=None))
    with TestClient(first) as client:
        client.post("/api/session", json={"username": "alice", "password": PASSWORD}).raise_for_status()
        cookie = client.cookies["chatlens_session"]
    second = create_app(dashboard_settings(url, session_secret=None))
    with TestClient(second) as client:
        client.cookies.set("chatlens_session", cookie)
        assert client.get("/api/session").json()["username"] == "alice"
    db = Database(url)
    with db.read() as session:
        secret = session.scalar(select(AppSecret.value).where(AppSecret.name == "session_secret"))
    db.dispose()
    assert secret and len(secret) >= 48


@pytest.mark.parametrize("path", ["/api/chats?offset=9223372036854775808", "/api/audit?before_id=9223372036854775808",
                                  "/api/errors?before_id=9223372036854775808", "/audit?before_id=9223372036854775808",
                                  "/errors?before_id=9223372036854775808", "/api/chats?offset=2147483648"])
def test_huge_offsets_and_ids_are_refused_not_overflowed(client_for, path):
    assert client_for("sam").get(path).status_code == 422


def test_an_unexpected_error_answers_500_with_the_security_headers_and_no_details(client_for, staffed):
    sam = client_for("sam")
    with Database(staffed[0]).engine.begin() as connection:  # a broken database: a real server-side failure
        connection.exec_driver_sql("DROP TABLE audit_log")
    response = sam.get("/api/audit")
    assert response.status_code == 500
    assert response.json() == {"detail": "internal error"}
    assert response.headers["x-frame-options"] == "DENY" and "content-security-policy" in response.headers


def test_request_bodies_over_the_limit_get_413_before_they_are_read(anon):
    big = b'{"username": "alice", "password": "' + b"x" * 2_000_000 + b'"}'
    declared = anon.post("/api/session", content=big, headers={"Content-Type": "application/json"})
    assert declared.status_code == 413 and declared.headers["x-content-type-options"] == "nosniff"
    chunked = anon.post("/api/session", content=(big[i:i + 65536] for i in range(0, len(big), 65536)),
                        headers={"Content-Type": "application/json"})
    assert chunked.status_code == 413
    assert anon.post("/api/session", json={"username": "alice", "password": PASSWORD}).status_code == 200


def test_json_answers_are_never_cached(anon, client_for):
    login = anon.post("/api/session", json={"username": "alice", "password": PASSWORD})
    assert login.headers["cache-control"] == "no-store"
    alice = client_for("alice")
    assert alice.get("/api/chats/evil").headers["cache-control"] == "no-store"
    assert alice.get("/api/chats").headers["cache-control"] == "no-store"


real_hasher = security._hasher


def watching_verify(verify):
    """Route argon2 verifications through `verify`, which calls the real hasher and takes notes."""
    return mock.patch.object(security, "_hasher", mock.Mock(wraps=real_hasher, verify=verify))


def test_parallel_wrong_passwords_are_checked_no_more_times_than_the_limit(staffed):
    """The race the audit found: 12 parallel wrong passwords were all verified (limit 5)."""
    url = staffed[0]
    app = create_app(dashboard_settings(url))
    verified = []

    def counting_verify(*args):
        verified.append(1)
        return real_hasher.verify(*args)

    with running_server(app) as base, watching_verify(counting_verify):
        def attempt(_):
            return httpx.post(f"{base}/api/session", json={"username": "alice", "password": "wrong-guess"},
                              timeout=60).status_code

        with ThreadPoolExecutor(12) as pool:
            codes = list(pool.map(attempt, range(12)))
    assert sorted(set(codes)) == [401, 429] and codes.count(401) == 5
    assert len(verified) == 5


def test_argon2_verifications_run_at_most_four_at_once():
    running, peak, lock = 0, 0, threading.Lock()

    def watched_verify(*args):
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        try:
            return real_hasher.verify(*args)
        finally:
            with lock:
                running -= 1

    stored = security.hash_password("correct horse")
    with watching_verify(watched_verify), ThreadPoolExecutor(16) as pool:
        assert all(pool.map(lambda _: security.verify_password(stored, "correct horse"), range(16)))
    assert peak == security.MAX_CONCURRENT_VERIFICATIONS


def test_lockouts_follow_the_account_and_the_client_not_the_shared_proxy_address(staffed):
    """Behind a proxy every client has its address: one client's failures lock neither other users
    nor the same user on another client; X-Forwarded-For counts only from a trusted proxy."""
    url = staffed[0]

    def login(base, username, password, client):
        return httpx.post(f"{base}/api/session", json={"username": username, "password": password},
                          headers={"X-Forwarded-For": client}, timeout=30).status_code

    with running_server(create_app(dashboard_settings(url, trusted_proxies=["127.0.0.1"]))) as base:
        for _ in range(5):
            assert login(base, "alice", "wrong-guess", "203.0.113.7") == 401
        assert login(base, "alice", PASSWORD, "203.0.113.7") == 429  # this client is locked out
        assert login(base, "alice", PASSWORD, "198.51.100.2") == 200  # alice elsewhere is not
        for name in ("bob", "sam"):  # 25 mixed-user failures from one client used to lock everyone
            for _ in range(4):
                assert login(base, name, "wrong-guess", "203.0.113.7") == 401
        assert login(base, "bob", PASSWORD, "198.51.100.2") == 200
    with running_server(create_app(dashboard_settings(url))) as base:  # no trusted proxy: header ignored
        for _ in range(5):
            login(base, "bob", "wrong-guess", "192.0.2.1")
        assert login(base, "bob", PASSWORD, "192.0.2.2") == 429


# What Python's json module accepts but JSON does not (or a database cannot store): each used to
# reach the validation handler, which echoed it back and could not encode it (500).
STRANGE_JSON = {
    "NaN": b"NaN", "Infinity": b"Infinity", "-Infinity": b"-Infinity", "1e999": b"1e999",
    "lone surrogate": b'"\\ud800 alone"', "raw surrogate bytes": b'"\xed\xa0\x80"',
}


@pytest.mark.parametrize("value", STRANGE_JSON.values(), ids=STRANGE_JSON.keys())
def test_strange_json_values_are_refused_with_422_in_every_json_body(client_for, app, value):
    sam = client_for("sam")
    operations = [(method, path.replace("{chat_id}", "calm")) for path, item in app.openapi()["paths"].items()
                  for method, operation in item.items()
                  if "application/json" in operation.get("requestBody", {}).get("content", {})]
    assert ("post", "/api/session") in operations and ("put", "/api/chats/calm/draft") in operations
    fields = ("version", "text", "reason", "assignee", "corrected", "username", "password")
    body = b"{" + b", ".join(b'"%s": %s' % (name.encode(), value) for name in fields) + b"}"
    for method, path in operations:
        response = sam.request(method.upper(), path, content=body, headers={"Content-Type": "application/json"})
        assert response.status_code == 422, (method, path, response.text)
        assert response.json()["detail"], (method, path)
    assert sam.get("/api/chats/calm").json()["version"] == 1  # nothing changed


def test_control_characters_in_a_path_are_escaped_in_the_error_log(client_for, staffed, caplog):
    sam = client_for("sam")
    with Database(staffed[0]).engine.begin() as connection:  # a real server-side failure
        connection.exec_driver_sql("DROP TABLE chats")
    with caplog.at_level(logging.ERROR):
        response = sam.get("/api/chats/calm%1B%5B2J%0Bvt%C2%85nel%E2%80%A8ls")
    assert response.status_code == 500
    logged = caplog.text
    assert "unhandled error on GET /api/chats/calm" in logged
    for char in ("\x1b", "\x0b", "\x85", "\u2028"):
        assert char not in logged, repr(char)
    assert "\\x1b[2J\\x0bvt\\x85nel\\u2028ls" in logged


@pytest.mark.parametrize(("who", "path", "status"), [
    (None, "/readyz", 200), (None, "/healthz", 200), (None, "/openapi.json", 200),
    ("alice", "/audit", 403), ("sam", "/errors?before_id=0", 422), (None, "/chats/calm", 401),
])
def test_json_answers_of_probes_schema_and_page_routes_are_never_cached(anon, client_for, who, path, status):
    client = client_for(who) if who else anon
    response = client.get(path, headers={"Accept": "application/json"}, follow_redirects=False)
    assert response.status_code == status and response.headers["content-type"].startswith("application/json")
    assert response.headers["cache-control"] == "no-store"


@pytest.mark.parametrize(("username", "password", "reason"), [
    ("carol", "password", "one of the most common passwords"),
    ("carol", " " * 8, "too easy to guess"),
    ("carol", "qwertyuiop12", "one of the most common passwords"),
    ("carol", "Summer2024!", "too easy to guess"),
    ("carol.smith", "carol.smith!", "too easy to guess"),  # the username says it
    ("carol", "x" * 1025, "at most 1024 characters"),  # login could never accept it
    ("carol", "short", "at least 8 characters"),
])
def test_weak_or_overlong_new_passwords_are_refused_with_a_reason(tmp_path, username, password, reason):
    db = Database(f"sqlite:///{tmp_path / 'users.db'}")
    db.upgrade()
    with pytest.raises(users.Invalid, match=reason):
        users.create_user(db, username, password)
    assert users.list_users(db) == []
    users.create_user(db, username, PASSWORD)  # a strong one is fine
    db.dispose()


def test_a_new_password_login_would_refuse_is_refused(anon):
    """One length rule: the longest password a user may set is the longest login accepts."""
    longest = "correct horse battery staple ".ljust(security.MAX_PASSWORD_CHARS, "x")
    assert security.check_new_password(longest, ["alice"]) is None
    assert anon.post("/api/session", json={"username": "alice", "password": longest}).status_code == 401
    assert anon.post("/api/session", json={"username": "alice", "password": longest + "x"}).status_code == 422


def test_sessions_end_after_an_absolute_lifetime_however_active(client_for, staffed):
    from datetime import datetime, timedelta, timezone

    from sqlalchemy import select, update

    from app.models import User, UserSession

    alice = client_for("alice")
    assert alice.get("/api/session").status_code == 200
    db = Database(staffed[0])
    now = datetime.now(timezone.utc)
    # Made 23.8 hours ago, about to expire unused: a use extends it to the 24-hour limit, no further.
    with db.writing() as session:
        session.execute(update(UserSession).values(created_at=now - timedelta(hours=23.8),
                                                   expires_at=now + timedelta(minutes=1)))
        session.commit()
    assert alice.get("/api/session").status_code == 200
    with db.read() as session:
        row = session.scalar(select(UserSession).join(User).where(User.username == "alice"))
        assert now + timedelta(minutes=1) < row.expires_at <= row.created_at + timedelta(hours=24)
    with db.writing() as session:  # a day and an hour old, its sliding expiry still ahead
        session.execute(update(UserSession).values(created_at=now - timedelta(hours=25),
                                                   expires_at=now + timedelta(hours=11)))
        session.commit()
    db.dispose()
    assert alice.get("/api/session").status_code == 401


def test_login_throttle_rows_are_deleted_once_their_window_and_lockout_are_over(staffed):
    from datetime import datetime, timedelta, timezone

    from sqlalchemy import select, update

    from app.crud import throttle
    from app.models import LoginThrottle

    db = Database(staffed[0])
    throttle.claim(db, "gone", "203.0.113.1", 5, 30, 900)
    for _ in range(5):
        throttle.claim(db, "locked", "203.0.113.1", 5, 3600, 900)
    long_ago = datetime.now(timezone.utc) - timedelta(hours=1)
    with db.writing() as session:  # every window over; "locked" from that client still locked out for an hour
        session.execute(update(LoginThrottle).values(first_failure_at=long_ago))
        session.commit()
    throttle.claim(db, "new", "203.0.113.2", 5, 30, 900)
    with db.read() as session:
        keys = set(session.scalars(select(LoginThrottle.key)))
    db.dispose()
    assert keys == {"user:locked|client:203.0.113.1", "user:new|client:203.0.113.2", "user:new"}
