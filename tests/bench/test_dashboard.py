"""bench/dashboard.py --quick still runs end to end: figures for both databases, nothing lost.

No timing is asserted (the machine is shared); only that every figure is there, every
insight was stored, every live client got every event and no request failed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENDPOINTS = ("queue page", "queue list", "api queue", "api chat")


@pytest.mark.slow  # bench/dashboard.py end to end: dashboard and Pub/Sub server subprocesses, both databases
def test_quick_dashboard_bench_stores_everything_and_reports_every_figure():
    server = os.environ.get("CHATLENS_TEST_DATABASE_URL")  # the run's PostgreSQL (conftest.py)
    if not server:
        pytest.fail("no PostgreSQL server: " + os.environ.get("CHATLENS_TEST_POSTGRES_ERROR", "none started"))
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "dashboard.py"), "--quick", "--postgres-url", server],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["bench"] == "dashboard" and summary["quick"] and summary["complete"]
    n, clients, live = summary["insights"], summary["sse_clients"], summary["sse_insights"]
    for kind in ("sqlite", "postgresql"):
        figures = summary[kind]
        assert figures["fill"]["chats"] == summary["chats"] - n - live
        ingest = figures["ingest"]
        assert ingest["published"] == ingest["stored"] == ingest["events_read"] == n
        assert ingest["lag"]["n"] == n and ingest["total_s"] > 0 and ingest["per_s"] > 0
        assert ingest["lag"]["p95_s"] is not None and ingest["dashboard_mean_lag_s"] is not None
        sse = figures["sse"]
        assert sse["connected"] == sse["received_all"] == clients and sse["stored"] == live and not sse["errors"]
        assert sse["delay_from_publish"]["n"] == sse["delay_from_commit"]["n"] == clients * live
        assert sse["delay_from_publish"]["p95_s"] is not None and sse["delay_from_commit"]["p95_s"] is not None
        latency = figures["latency"]
        assert latency["chats"] == summary["chats"]
        for name in ENDPOINTS:
            assert latency[name]["n"] == summary["requests"] and latency[name]["errors"] == 0, latency[name]
            assert latency[name]["p95_s"] is not None and latency[name]["per_s"] > 0
        assert figures["database"]["size_mb"] > 0 and figures["dashboard_exit_code"] == 0
    assert "queue page p50 / p95 (ms)" in done.stdout  # the table came before the JSON
