"""Run the whole ChatLens system on this machine: Pub/Sub server, topics, and the services.

Starts the local Pub/Sub-compatible server, creates the topics and subscriptions, then the
services listed below, each as a child process in its own process group; their output is
prefixed with their name. Ctrl-C (or SIGTERM) stops every child, leaving no orphans.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from chatlens.config import DEFAULT_PROJECT


@dataclass
class Service:
    name: str
    argv: list[str]
    process: subprocess.Popen | None = field(default=None, repr=False)


def chatlens_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "chatlens.cli", *args]


class Supervisor:
    """Starts child processes, prefixes their output, and stops them all together."""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.services: list[Service] = []

    def start(self, service: Service) -> Service:
        service.process = subprocess.Popen(
            service.argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )
        threading.Thread(target=self._relay, args=(service,), daemon=True).start()
        self.services.append(service)
        return service

    @staticmethod
    def _relay(service: Service) -> None:
        for line in service.process.stdout:  # type: ignore[union-attr]
            print(f"[{service.name}] {line}", end="", flush=True)

    def failed(self) -> Service | None:
        return next((s for s in self.services if s.process and s.process.poll() not in (None, 0)), None)

    def stop(self, grace: float = 10.0) -> None:
        for service in reversed(self.services):
            if service.process and service.process.poll() is None:
                os.killpg(service.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for service in self.services:
            if service.process is None:
                continue
            try:
                service.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(service.process.pid, signal.SIGKILL)
                service.process.wait()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=8085, help="local Pub/Sub server port (default: %(default)s)")
    parser.add_argument("--project", default=DEFAULT_PROJECT, help="project id (default: %(default)s)")
    parser.add_argument("--once", action="store_true", help="set everything up, print the plan and stop")


def run(args: argparse.Namespace) -> int:
    from chatlens.pubsub.admin import ensure_layout
    from chatlens.pubsub.emulator import wait_ready

    host = f"localhost:{args.port}"
    env = {**os.environ, "PUBSUB_EMULATOR_HOST": host, "CHATLENS_PROJECT": args.project, "PYTHONUNBUFFERED": "1"}
    supervisor = Supervisor(env)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    try:
        supervisor.start(Service("pubsub", chatlens_argv("pubsub-emulator", "--port", str(args.port))))
        wait_ready(host, timeout=30)
        os.environ["PUBSUB_EMULATOR_HOST"] = host
        created = ensure_layout(args.project)
        print(f"Pub/Sub server on {host}; project {args.project}: {len(created)} resources created")
        print("The demo runs: the local Pub/Sub server (above), `chatlens pipeline` (Gemma on Beam),\n"
              "`chatlens dashboard` (the review queue) and `chatlens simulate` (realistic chats).")
        if args.once:
            return 0
        print("Ctrl-C stops everything.")
        while (failed := supervisor.failed()) is None:
            time.sleep(0.5)
        print(f"{failed.name} exited with status {failed.process.returncode}; stopping", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nstopping…")
        return 0
    finally:
        supervisor.stop()
