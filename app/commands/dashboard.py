"""Run the support dashboard (web UI, JSON API and Pub/Sub subscribers).

Settings come from CHATLENS_* environment variables and `.env` (see app/README.md);
the options below override them. Stop it with Ctrl-C or SIGTERM: subscribers finish
what they hold (commit, then ack) and the rest is left to Pub/Sub to redeliver.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default 8000)")
    parser.add_argument("--database-url", help="SQLAlchemy URL (default sqlite:///chatlens-dashboard.db)")
    parser.add_argument("--project", help="Google Cloud project of the subscriptions")
    parser.add_argument("--insights-subscription", help="subscription id on the results topic")
    parser.add_argument("--deadletter-subscription", help="subscription id on the dead-letter topic")
    parser.add_argument("--no-subscribe", action="store_true", help="serve the UI only, pull nothing")


def run(args: argparse.Namespace) -> int:
    import logging

    from app.main import create_app
    from app.server import DashboardServer
    from app.settings import DashboardSettings

    overrides = {
        key: value for key, value in {
            "host": args.host, "port": args.port, "database_url": args.database_url,
            "project": args.project, "insights_subscription": args.insights_subscription,
            "deadletter_subscription": args.deadletter_subscription,
        }.items() if value is not None
    }
    if args.no_subscribe:
        overrides["subscribe"] = False
    settings = DashboardSettings(**overrides)
    level = logging.getLevelName(logging.getLogger().getEffectiveLevel()).lower()
    server = DashboardServer(create_app(settings), settings.host, settings.port,
                             log_level=level if level in ("debug", "info") else "info")
    print(f"ChatLens dashboard on http://{settings.host}:{server.config.port}/  (Ctrl-C stops)", flush=True)
    server.run()
    return 0
