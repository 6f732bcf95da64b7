"""What one running dashboard holds: settings, database, live-update hub and subscribers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from app.db import Database
from app.live import EventHub
from app.settings import DashboardSettings
from app.subscriber import StreamSubscriber

FEED_ORDER = ("stopped", "reconnecting", "starting", "running")  # worst first


@dataclass
class AppContext:
    settings: DashboardSettings
    db: Database
    hub: EventHub | None = None
    subscribers: list[StreamSubscriber] = field(default_factory=list)
    secret: str = ""

    def feed_state(self) -> str:
        """The worst subscriber state ("off" when the process does not subscribe)."""
        if not self.settings.subscribe:
            return "off"
        if not self.subscribers:
            return "stopped"
        states = [s.status().state for s in self.subscribers]
        return min(states, key=lambda state: FEED_ORDER.index(state) if state in FEED_ORDER else 0)

    def feed_status(self) -> dict[str, Any]:
        """Small and stable (no counters) so the live stream only sends it when it changes."""
        return {
            "feed": self.feed_state(),
            "subscribers": {s.status().name: s.status().state for s in self.subscribers},
        }
