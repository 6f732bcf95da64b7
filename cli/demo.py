"""Run the whole ChatLens system on this machine: Pub/Sub server, topics, and the services.

Starts the local Pub/Sub-compatible server, creates the topics and subscriptions, then the
services listed below, each as a child process in its own process group; their output is
prefixed with their name. Ctrl-C (or SIGTERM) stops every child, leaving no orphans.
If the Pub/Sub server dies it is started again, and a watchdog re-creates the topics and
subscriptions it lost (its state is in memory); the dashboard and pipelines reconnect.
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
from pathlib import Path

from chatlens.config import DEFAULT_PROJECT


@dataclass
class Service:
    name: str
    argv: list[str]
    process: subprocess.Popen | None = field(default=None, repr=False)
    lines: int = 0  # lines of output so far (the simulator prints one per chat sent)
    quiet: bool = False  # count the output instead of printing it
    restart: bool = False  # start it again when it exits (after it ran at least MIN_UPTIME_S)
    started_at: float = 0.0
    restarts: int = 0


def chatlens_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "cli", *args]


MIN_UPTIME_S = 5.0  # a restartable service that exits sooner than this after its start has failed


class ProcessGroup:
    """The demo's child processes as one group: starts them, prefixes their output, restarts the
    ones that may be, and stops them all together. (Not "Supervisor": that is a dashboard role.)"""

    def __init__(self, env: dict[str, str]):
        self.env = env
        self.services: list[Service] = []

    def start(self, service: Service) -> Service:
        service.process = subprocess.Popen(
            service.argv, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )
        service.started_at = time.monotonic()
        threading.Thread(target=self._relay, args=(service,), daemon=True).start()
        if service not in self.services:
            self.services.append(service)
        return service

    def revive(self) -> list[Service]:
        """Start the restartable services that exited again (the Pub/Sub server: it is what the
        others reconnect to); returns them. One that exited within MIN_UPTIME_S is left failed."""
        revived = []
        for service in self.services:
            if (service.restart and service.process and service.process.poll() is not None
                    and time.monotonic() - service.started_at >= MIN_UPTIME_S):
                print(f"[{service.name}] exited with status {service.process.returncode}; starting it again",
                      flush=True)
                service.restarts += 1
                revived.append(self.start(service))
        return revived

    @staticmethod
    def _relay(service: Service) -> None:
        for line in service.process.stdout:  # type: ignore[union-attr]
            service.lines += 1
            if not service.quiet:
                print(f"[{service.name}] {line}", end="", flush=True)

    def failed(self) -> Service | None:
        return next((s for s in self.services if s.process and s.process.poll() not in (None, 0)
                     and not (s.restart and time.monotonic() - s.started_at >= MIN_UPTIME_S)), None)

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


def _interrupt(signum, frame) -> None:
    """SIGTERM stops the demo the way Ctrl-C does: every child is stopped in `finally`."""
    raise KeyboardInterrupt


def metric_sum(text: str, name: str) -> float:
    """Sum of every sample of one metric family in Prometheus text."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#") and line[len(name)] in " {")


def status_line(dashboard: str, simulated: int) -> str:
    import httpx

    try:
        text = httpx.get(f"{dashboard}/metrics", timeout=5).text
    except httpx.HTTPError:
        return f"sent {simulated} chats; dashboard not answering yet"
    analysed = metric_sum(text, "chatlens_dashboard_insights_stored")
    dead = metric_sum(text, "chatlens_dashboard_errors_stored")
    lag = metric_sum(text, "chatlens_dashboard_lag_seconds{subscriber=\"insights\"}")
    return f"sent {simulated} chats · analysed {analysed:.0f} windows · dead-lettered {dead:.0f} · lag {lag:.0f} s"


def create_staff(env: dict[str, str], state: Path) -> str | None:
    """A demo supervisor account; its password is printed once, when it is created."""
    import secrets

    marker = state / "staff-created"
    if marker.exists():
        return None
    password = secrets.token_urlsafe(12)
    subprocess.run(chatlens_argv("users", "add", "demo", "--role", "supervisor", "--password-stdin"),
                   input=password + "\n", text=True, env=env, check=True, capture_output=True)
    marker.touch()
    return password


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=8085, help="local Pub/Sub server port (default: %(default)s)")
    parser.add_argument("--dashboard-port", type=int, default=8000, help="dashboard port (default: %(default)s)")
    parser.add_argument("--project", default=DEFAULT_PROJECT, help="project id (default: %(default)s)")
    parser.add_argument("--rate", type=float, default=4.0, help="simulated chats per minute (default: %(default)s)")
    parser.add_argument("--state", type=Path, default=Path(".chatlens-demo"),
                        help="directory for the demo database and markers (default: %(default)s)")
    parser.add_argument("--once", action="store_true", help="set up Pub/Sub and the model, print the plan and stop")


def run(args: argparse.Namespace) -> int:
    from chatlens.config import get_settings
    from localpubsub.admin import ensure_layout
    from localpubsub.emulator import wait_ready

    host = f"localhost:{args.port}"
    dashboard = f"http://127.0.0.1:{args.dashboard_port}"
    args.state.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PUBSUB_EMULATOR_HOST": host, "CHATLENS_PROJECT": args.project, "PYTHONUNBUFFERED": "1",
           "CHATLENS_DATABASE_URL": f"sqlite:///{(args.state / 'dashboard.db').resolve()}",
           "CHATLENS_PORT": str(args.dashboard_port),
           # the macros supervisors edit in the dashboard, written there and read by the pipelines
           "CHATLENS_REPLY_LIBRARY": str((args.state / "reply-library.json").resolve())}
    processes = ProcessGroup(env)
    watchdog = None
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        print("preparing the embedded Gemma (converted once, then cached)…", flush=True)
        from pipeline.model.loading.sources import resolve_model

        source = resolve_model(get_settings().model)
        print(f"model ready: {source.model_id} at {source.preset}")
        # its topics, subscriptions and unacked messages are kept in the state directory: a restart,
        # of the server or of the demo, loses nothing
        processes.start(Service("pubsub", chatlens_argv("pubsub-emulator", "--port", str(args.port), "--data-dir",
                                                        str(args.state / "pubsub")), restart=True))
        wait_ready(host, timeout=30)
        os.environ["PUBSUB_EMULATOR_HOST"] = host
        created = ensure_layout(args.project)
        print(f"Pub/Sub server on {host}; project {args.project}: {len(created)} resources created")
        # should it come back empty all the same (its directory removed), the layout is made again
        watchdog = pubsub_watchdog(args.project, host).start()
        if args.once:
            print("`make demo` runs: this Pub/Sub server, `chatlens dashboard`, `chatlens pipeline` "
                  "(windows and messages mode) and `chatlens simulate`.")
            return 0
        password = create_staff(env, args.state)
        processes.start(Service("dashboard", chatlens_argv("dashboard")))
        for mode in ("windows", "messages"):
            processes.start(Service(f"pipeline-{mode}", chatlens_argv("pipeline", "--mode", mode)))
        simulate = processes.start(Service("simulate", chatlens_argv("simulate", "--rate", str(args.rate)),
                                           quiet=True))
        print(f"\nDashboard: {dashboard}  (user 'demo'"
              + (f", password {password} — shown once)" if password else ", password as printed on the first run)"))
        print("The pipelines load Gemma and compile for a minute or two before the first insights arrive.")
        print("Ctrl-C stops everything.\n", flush=True)
        next_status = time.monotonic() + 20
        while (failed := processes.failed()) is None:
            time.sleep(0.5)
            processes.revive()
            if time.monotonic() >= next_status:
                print(f"[status] {status_line(dashboard, simulate.lines)}", flush=True)
                next_status = time.monotonic() + 20
        print(f"{failed.name} exited with status {failed.process.returncode}; stopping", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nstopping…")
        return 0
    finally:
        if watchdog is not None:
            watchdog.stop()
        processes.stop()


def pubsub_watchdog(project: str, host: str):
    """The demo's LayoutWatchdog on its Pub/Sub server (it logs a warning at each re-creation)."""
    from localpubsub.admin import LayoutWatchdog

    return LayoutWatchdog(project, host, interval=1.0)
