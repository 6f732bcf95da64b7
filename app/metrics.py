"""Prometheus text exposition, written by hand: a handful of series needs no library.

Counters from the subscribers are per process; queue sizes and action totals come from
the database, so they agree whichever process is scraped.
"""

from __future__ import annotations

from collections.abc import Iterable

from app.context import AppContext
from app.crud import audit, chats
from app.crud import errors as error_rows

PREFIX = "chatlens_dashboard"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{key}="{_escape(str(val))}"' for key, val in labels.items()) + "}"


class Exposition:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str,
               samples: Iterable[tuple[dict[str, str], float]]) -> None:
        full = f"{PREFIX}_{name}" + ("_total" if kind == "counter" else "")
        self.lines.append(f"# HELP {full} {help_text}")
        self.lines.append(f"# TYPE {full} {kind}")
        for labels, value in samples:
            self.lines.append(f"{full}{_labels(labels)} {float(value):g}")

    def summary(self, name: str, help_text: str,
                samples: Iterable[tuple[dict[str, str], float, int]]) -> None:
        """A summary without quantiles: `_sum` and `_count` per label set."""
        full = f"{PREFIX}_{name}"
        self.lines.append(f"# HELP {full} {help_text}")
        self.lines.append(f"# TYPE {full} summary")
        for labels, total, count in samples:
            self.lines.append(f"{full}_sum{_labels(labels)} {float(total):g}")
            self.lines.append(f"{full}_count{_labels(labels)} {count}")

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def render(ctx: AppContext) -> str:
    out = Exposition()
    statuses = [s.status() for s in ctx.subscribers]
    out.family("messages_received", "counter", "Pub/Sub messages handled, by subscription and outcome.",
               [({"subscriber": s.name, "outcome": outcome}, count)
                for s in statuses for outcome, count in s.outcomes.items()])
    insights = [s for s in statuses if s.name == "insights"]
    out.family("insights_received", "counter", "ChatInsight messages stored (first delivery).",
               [({}, sum(s.outcomes.get("stored", 0) for s in insights))])
    out.family("lag_seconds", "gauge", "Seconds from Pub/Sub publish to commit, last message.",
               [({"subscriber": s.name}, s.lag_seconds_last) for s in statuses
                if s.lag_seconds_last is not None])
    out.summary("publish_to_commit_seconds", "Seconds from Pub/Sub publish to commit, all messages.",
                [({"subscriber": s.name}, s.lag_seconds_sum, s.received) for s in statuses])
    out.family("subscriber_up", "gauge", "1 while the subscriber's stream is running.",
               [({"subscriber": s.name}, 1 if s.state == "running" else 0) for s in statuses])
    out.family("subscriber_reconnects", "counter", "Times a stream ended and was opened again.",
               [({"subscriber": s.name}, s.reconnects) for s in statuses])
    out.family("last_message_timestamp_seconds", "gauge", "Unix time of the last message stored.",
               [({"subscriber": s.name}, s.last_message_at.timestamp()) for s in statuses
                if s.last_message_at])
    with ctx.db.read() as session:
        queue = chats.open_counts(session)
        actions = audit.action_counts(session)
        errors = error_rows.counts(session)
        stored = chats.insight_count(session)
    out.family("queue_size", "gauge", "Open chats (not handled) by sentiment.",
               [({"sentiment": name}, count) for name, count in queue.items()])
    out.family("insights_stored", "gauge", "ChatInsight rows in the database.", [({}, stored)])
    out.family("actions", "counter", "Review actions in the audit log, by action.",
               [({"action": action}, count) for action, count in sorted(actions.items())])
    out.family("errors_stored", "gauge", "Dead letters and invalid messages kept, by kind.",
               [({"kind": kind}, count) for kind, count in sorted(errors.items())])
    out.family("live_listeners", "gauge", "Browsers connected to the live stream.",
               [({}, ctx.hub.listeners if ctx.hub else 0)])
    return out.text()
