"""The dashboard's Prometheus metrics, collected at scrape time with `prometheus_client`.

Counters from the subscribers are per process; queue sizes and action totals come from
the database, so they agree whichever process is scraped.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily

from app.context import AppContext
from app.crud import audit, chats
from app.crud import errors as error_rows

PREFIX = "chatlens_dashboard"
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4


def _family(kind: type, name: str, help_text: str, samples: list[tuple[dict[str, str], float]]) -> Metric:
    labels = sorted({key for sample_labels, _ in samples for key in sample_labels})
    family = kind(f"{PREFIX}_{name}", help_text, labels=labels)
    for sample_labels, value in samples:
        family.add_metric([sample_labels[key] for key in labels], value)
    return family


class DashboardCollector:
    """Reads the subscribers' counters and the database's totals on every scrape."""

    def __init__(self, ctx: AppContext) -> None:
        self.ctx = ctx

    def collect(self) -> Iterator[Metric]:
        ctx = self.ctx
        statuses = [s.status() for s in ctx.subscribers]
        yield _family(CounterMetricFamily, "messages_received", "Pub/Sub messages handled, by subscription and outcome.",
                      [({"subscriber": s.name, "outcome": outcome}, count)
                       for s in statuses for outcome, count in s.outcomes.items()])
        yield _family(CounterMetricFamily, "insights_received", "ChatInsight messages stored (first delivery).",
                      [({}, sum(s.outcomes.get("stored", 0) for s in statuses if s.name == "insights"))])
        yield _family(GaugeMetricFamily, "lag_seconds", "Seconds from Pub/Sub publish to commit, last message.",
                      [({"subscriber": s.name}, s.lag_seconds_last) for s in statuses
                       if s.lag_seconds_last is not None])
        lag = SummaryMetricFamily(f"{PREFIX}_publish_to_commit_seconds",
                                  "Seconds from Pub/Sub publish to commit, all messages.", labels=["subscriber"])
        for s in statuses:
            lag.add_metric([s.name], count_value=s.received, sum_value=s.lag_seconds_sum)
        yield lag
        yield _family(GaugeMetricFamily, "subscriber_up", "1 while the subscriber's stream is running.",
                      [({"subscriber": s.name}, 1 if s.state == "running" else 0) for s in statuses])
        yield _family(GaugeMetricFamily, "subscriber_failing",
                      "Messages in a row that failed to store (0 after a success).",
                      [({"subscriber": s.name}, s.failing) for s in statuses])
        yield _family(GaugeMetricFamily, "subscriber_degraded", "1 while storing keeps failing (as /readyz says).",
                      [({"subscriber": s.name}, 1 if s.degraded() else 0) for s in statuses])
        yield _family(CounterMetricFamily, "subscriber_reconnects", "Times a stream ended and was opened again.",
                      [({"subscriber": s.name}, s.reconnects) for s in statuses])
        yield _family(GaugeMetricFamily, "last_message_timestamp_seconds", "Unix time of the last message stored.",
                      [({"subscriber": s.name}, s.last_message_at.timestamp()) for s in statuses
                       if s.last_message_at])
        with ctx.db.read() as session:
            queue = chats.open_counts(session)
            actions = audit.action_counts(session)
            errors = error_rows.counts(session)
            stored = chats.insight_count(session)
        yield _family(GaugeMetricFamily, "queue_size", "Open chats (not handled) by sentiment.",
                      [({"sentiment": name}, count) for name, count in queue.items()])
        yield _family(GaugeMetricFamily, "insights_stored", "ChatInsight rows in the database.", [({}, stored)])
        yield _family(CounterMetricFamily, "actions", "Review actions in the audit log, by action.",
                      [({"action": action}, count) for action, count in sorted(actions.items())])
        yield _family(GaugeMetricFamily, "errors_stored", "Dead letters and invalid messages kept, by kind.",
                      [({"kind": kind}, count) for kind, count in sorted(errors.items())])
        yield _family(GaugeMetricFamily, "live_listeners", "Browsers connected to the live stream.",
                      [({}, ctx.hub.listeners if ctx.hub else 0)])


def render(ctx: AppContext) -> bytes:
    """The Prometheus text exposition (format 0.0.4) of this dashboard, read now."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(DashboardCollector(ctx))
    return generate_latest(registry)
