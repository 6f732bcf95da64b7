"""A throwaway PostgreSQL server for the test run: a cluster in a temporary directory, on a free
port, stopped and deleted at the end. Uses Debian's `postgresql` package (the Makefile installs it).

PostgreSQL refuses to run as root; as root the cluster belongs to the package's `postgres` user.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class PostgresUnavailable(RuntimeError):
    pass


def _binaries() -> Path:
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise PostgresUnavailable("no initdb: install Debian's postgresql package (make test does)")
    return Path(found[-1]).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def throwaway_postgres() -> Iterator[str]:
    """Start a server; yield its SQLAlchemy URL (database `postgres`, user `postgres`, trust auth)."""
    bin_dir = _binaries()
    root = Path(tempfile.mkdtemp(prefix="chatlens-pg-"))
    data = root / "data"
    as_user: list[str] = []
    if os.geteuid() == 0:
        as_user = ["runuser", "-u", "postgres", "--"]
        shutil.chown(root, "postgres")
    port = _free_port()

    def run(*args: str) -> None:
        done = subprocess.run([*as_user, *args], capture_output=True, text=True, timeout=120)
        if done.returncode:
            raise PostgresUnavailable(f"{args[0]} failed: {done.stderr.strip()[-2000:]}")

    try:
        run(str(bin_dir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "--no-sync",
            "-E", "UTF8", "--locale=C")
        run(str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-w", "-t", "60",
            "-o", f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
            "start")
        try:
            yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
        finally:
            run(str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop")
    finally:
        shutil.rmtree(root, ignore_errors=True)
