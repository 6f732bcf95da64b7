"""`chatlens dashboard` as a person runs it: a real process, stopped with SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

import httpx
from app_fixtures import PASSWORD, free_port, sqlite_url, wait_until

from chatlens.config import DEFAULT_PROJECT
from chatlens.pubsub.admin import ensure_layout


def test_dashboard_command_serves_and_stops_cleanly_on_sigterm(tmp_path, pubsub_server):
    ensure_layout(DEFAULT_PROJECT, emulator_host=pubsub_server)
    url, port = sqlite_url(tmp_path), free_port()
    env = {**os.environ, "PUBSUB_EMULATOR_HOST": pubsub_server, "CHATLENS_SUBSCRIBER_PROBE_SECONDS": "1"}
    add = subprocess.run([sys.executable, "-m", "cli", "users", "--database-url", url, "add", "ann",
                          "--password-stdin"], input=f"{PASSWORD}\n", text=True, capture_output=True, env=env)
    assert add.returncode == 0, add.stderr
    process = subprocess.Popen(
        [sys.executable, "-m", "cli", "-v", "dashboard", "--port", str(port), "--database-url", url],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output: list[str] = []
    reader = threading.Thread(target=lambda: output.extend(process.stdout), daemon=True)
    reader.start()
    base = f"http://127.0.0.1:{port}"
    try:
        def ready() -> bool:
            try:
                return httpx.get(f"{base}/readyz", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_until(ready, 30, 0.2, "the dashboard to be ready")
        with httpx.Client(base_url=base, timeout=10) as client:
            client.post("/api/session", json={"username": "ann", "password": PASSWORD}).raise_for_status()
            with client.stream("GET", "/api/events") as stream:  # an open live stream must not hold up the stop
                next(stream.iter_lines())
                process.send_signal(signal.SIGTERM)
                # A clean shutdown exits 0 (uvicorn alone re-raises the signal: status 143).
                assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
        reader.join(5)
    text = "".join(output)
    assert f"ChatLens dashboard on http://127.0.0.1:{port}/" in text
    assert "Traceback" not in text, text
    assert "dashboard ready" in text and "dashboard stopped" in text, text
