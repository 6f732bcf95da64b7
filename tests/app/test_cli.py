"""`chatlens dashboard` as a person runs it: a real process, stopped with SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import httpx
from tests.support.app import PASSWORD, dashboard_process, free_port, sqlite_url

from chatlens.config import DEFAULT_PROJECT
from localpubsub.admin import ensure_layout


def test_dashboard_command_serves_and_stops_cleanly_on_sigterm(tmp_path, pubsub_server):
    ensure_layout(DEFAULT_PROJECT, emulator_host=pubsub_server)
    url, port = sqlite_url(tmp_path), free_port()
    env = {**os.environ, "PUBSUB_EMULATOR_HOST": pubsub_server, "CHATLENS_SUBSCRIBER_PROBE_SECONDS": "1"}
    add = subprocess.run([sys.executable, "-m", "cli", "users", "--database-url", url, "add", "ann",
                          "--password-stdin"], input=f"{PASSWORD}\n", text=True, capture_output=True, env=env)
    assert add.returncode == 0, add.stderr
    command = [sys.executable, "-m", "cli", "-v", "dashboard", "--port", str(port), "--database-url", url]
    with dashboard_process(command, port, cwd=tmp_path, env=env) as (process, output):
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            client.post("/api/session", json={"username": "ann", "password": PASSWORD}).raise_for_status()
            with client.stream("GET", "/api/events") as stream:  # an open live stream must not hold up the stop
                next(stream.iter_lines())
                process.send_signal(signal.SIGTERM)
                # A clean shutdown exits 0 (uvicorn alone re-raises the signal: status 143).
                assert process.wait(timeout=20) == 0
    text = "".join(output)
    assert f"ChatLens dashboard on http://127.0.0.1:{port}/" in text
    assert "Traceback" not in text, text
    assert "dashboard ready" in text and "dashboard stopped" in text, text


def test_users_add_refuses_weak_and_overlong_passwords(tmp_path):
    url = sqlite_url(tmp_path)
    for password, reason in [("password", "common"), ("x" * 3000, "at most 1024 characters")]:
        add = subprocess.run([sys.executable, "-m", "cli", "users", "--database-url", url, "add", "ann",
                              "--password-stdin"], input=f"{password}\n", text=True, capture_output=True)
        assert add.returncode == 1 and reason in add.stderr, add.stderr
        assert "Traceback" not in add.stderr
