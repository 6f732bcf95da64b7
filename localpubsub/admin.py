"""Create the project's Pub/Sub topics and subscriptions (chatlens.config.LAYOUT).

Talks to the emulator given by --emulator-host or PUBSUB_EMULATOR_HOST, or, with
neither, to Google Cloud Pub/Sub with application-default credentials. What already
exists counts as success, so it is safe to run at every start.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading

from chatlens.config import LAYOUT, PubSubLayout, subscription_path, topic_path

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--project", help="Google Cloud project id (default: CHATLENS_PROJECT, else chatlens-local)")
    parser.add_argument(
        "--emulator-host",
        metavar="HOST:PORT",
        help="Pub/Sub emulator to use (default: PUBSUB_EMULATOR_HOST; neither: real Pub/Sub)",
    )
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for the emulator to answer (default 30)"
    )


def run(args: argparse.Namespace) -> int:
    from google.api_core.exceptions import GoogleAPIError

    from chatlens.config import get_settings
    from localpubsub.emulator import wait_ready

    project = args.project or get_settings().project
    emulator = args.emulator_host or os.environ.get("PUBSUB_EMULATOR_HOST")
    target = emulator or "Google Cloud Pub/Sub"
    try:
        if emulator:
            wait_ready(emulator, args.timeout)
        created = ensure_layout(project, emulator_host=args.emulator_host)
    except (TimeoutError, ConnectionError, GoogleAPIError) as error:
        print(f"pubsub-init: {error}", file=sys.stderr)
        return 1
    for path in created:
        print(f"created {path}")
    total = len(LAYOUT.topics()) + len(LAYOUT.subscriptions())
    print(f"Pub/Sub layout of project {project} ready on {target}: {len(created)} created, {total - len(created)} existed")
    return 0


def ensure_layout(project: str, layout: PubSubLayout = LAYOUT, *, emulator_host: str | None = None) -> list[str]:
    """Create `layout`'s topics, then its subscriptions, in `project`; return the paths created.

    `emulator_host` defaults to PUBSUB_EMULATOR_HOST; without either, real Pub/Sub is used.
    Existing resources are left as they are (a subscription attached to another
    topic is only warned about: recreating it would drop its backlog), except that a
    subscription of `layout.dead_letter_topics()` without that dead-letter policy gets it.
    """
    from google.api_core.exceptions import AlreadyExists

    publisher, subscriber = admin_clients(emulator_host)
    created: list[str] = []
    try:
        for topic_id in layout.topics():
            path = topic_path(project, topic_id)
            try:
                publisher.create_topic(name=path)
                created.append(path)
            except AlreadyExists:
                log.debug("%s already exists", path)
        for subscription_id, topic_id in layout.subscriptions().items():
            path, topic = subscription_path(project, subscription_id), topic_path(project, topic_id)
            request: dict = {"name": path, "topic": topic}
            policy = _dead_letter_policy(project, layout, subscription_id)
            if policy:
                request["dead_letter_policy"] = policy
            try:
                subscriber.create_subscription(request=request)
                created.append(path)
            except AlreadyExists:
                existing = subscriber.get_subscription(subscription=path)
                if existing.topic != topic:
                    log.warning("%s exists but is attached to %s, not %s", path, existing.topic, topic)
                elif policy and existing.dead_letter_policy.dead_letter_topic != policy["dead_letter_topic"]:
                    # made before the policy existed: give it one (its backlog stays)
                    subscriber.update_subscription(request={
                        "subscription": {"name": path, "dead_letter_policy": policy},
                        "update_mask": {"paths": ["dead_letter_policy"]}})
                    log.info("%s: dead-letter policy set (%s)", path, policy["dead_letter_topic"])
    finally:
        publisher.transport.close()
        subscriber.close()
    return created


def _dead_letter_policy(project: str, layout: PubSubLayout, subscription_id: str) -> dict | None:
    topic_id = layout.dead_letter_topics().get(subscription_id)
    if topic_id is None:
        return None
    return {"dead_letter_topic": topic_path(project, topic_id), "max_delivery_attempts": layout.max_delivery_attempts}


def admin_clients(emulator_host: str | None = None):
    """A (PublisherClient, SubscriberClient) pair for `emulator_host` or PUBSUB_EMULATOR_HOST.

    An explicit host gets its own insecure channel, so the environment is left alone.
    """
    from google.cloud import pubsub_v1

    if not emulator_host:
        return pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()

    import grpc
    from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
    from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

    publisher = pubsub_v1.PublisherClient(transport=PublisherGrpcTransport(channel=grpc.insecure_channel(emulator_host)))
    subscriber = pubsub_v1.SubscriberClient(
        transport=SubscriberGrpcTransport(channel=grpc.insecure_channel(emulator_host))
    )
    return publisher, subscriber


class LayoutWatchdog:
    """Keeps `layout` on a local Pub/Sub server whose state can vanish under running services.

    The local server keeps topics and subscriptions in memory, so a restart comes back empty;
    the dashboard's and the pipeline's subscribers then find nothing to reopen, and
    publishers get NOT_FOUND. Every `interval` seconds this lists the project's topics and
    subscriptions (a server that does not answer is skipped) and, when any is missing,
    creates the layout again. `chatlens demo` runs one; `check()` is one look.
    """

    def __init__(self, project: str, emulator_host: str, layout: PubSubLayout = LAYOUT, *, interval: float = 1.0):
        self.project, self.emulator_host, self.layout, self.interval = project, emulator_host, layout, interval
        self.restorations = 0  # how often the layout was re-created
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def missing(self) -> list[str]:
        """Paths of the layout the server lacks; raises when the server does not answer."""
        publisher, subscriber = admin_clients(self.emulator_host)
        try:
            project = f"projects/{self.project}"
            topics = {t.name for t in publisher.list_topics(request={"project": project}, retry=None, timeout=5)}
            subscriptions = {s.name for s in subscriber.list_subscriptions(
                request={"project": project}, retry=None, timeout=5)}
        finally:
            publisher.transport.close()
            subscriber.close()
        wanted = [topic_path(self.project, t) for t in self.layout.topics()]
        wanted += [subscription_path(self.project, s) for s in self.layout.subscriptions()]
        return [path for path in wanted if path not in topics | subscriptions]

    def check(self) -> list[str]:
        """Re-create the layout if the server lacks any of it; returns what was created."""
        from google.api_core.exceptions import GoogleAPIError

        try:
            if not self.missing():
                return []
            created = ensure_layout(self.project, self.layout, emulator_host=self.emulator_host)
        except GoogleAPIError as error:  # down or restarting: look again next time
            log.debug("layout watchdog: %s", error)
            return []
        if created:
            self.restorations += 1
            log.warning("Pub/Sub server at %s lost its layout (restarted?): re-created %d resource(s)",
                        self.emulator_host, len(created))
        return created

    def start(self) -> LayoutWatchdog:
        self._thread = threading.Thread(target=self._run, name="pubsub-layout-watchdog", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.check()
            except Exception:  # noqa: BLE001 - a watchdog that dies helps nobody
                log.exception("layout watchdog")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
