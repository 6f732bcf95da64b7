"""Settings shared by every ChatLens process, read once from env vars and `.env`.

The Pub/Sub resource names here are the single source of truth: `chatlens pubsub-init`,
the pipeline's defaults, the dashboard's subscribers, docker-compose and the tests all
read them from this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_PROJECT = "chatlens-local"  # Beam rejects project ids shorter than 6 characters.


@dataclass(frozen=True)
class PubSubLayout:
    """Topic and subscription ids (not full paths) of one ChatLens deployment."""

    windows_topic: str = "chat-windows"
    windows_subscription: str = "chat-windows-pipeline"
    messages_topic: str = "chat-messages"
    messages_subscription: str = "chat-messages-pipeline"
    insights_topic: str = "chat-insights"
    insights_subscription: str = "chat-insights-dashboard"
    deadletter_topic: str = "chat-deadletter"
    deadletter_subscription: str = "chat-deadletter-dashboard"
    undeliverable_topic: str = "chat-dashboard-undeliverable"
    """Where Pub/Sub moves a message the dashboard failed to store `max_delivery_attempts` times."""
    undeliverable_subscription: str = "chat-dashboard-undeliverable-hold"
    """Keeps those messages (nobody consumes it) for an operator to look at and publish again."""
    max_delivery_attempts: int = 10
    """Deliveries of one message to the dashboard before Pub/Sub gives up on it (5 to 100)."""

    def topics(self) -> list[str]:
        return [self.windows_topic, self.messages_topic, self.insights_topic, self.deadletter_topic,
                self.undeliverable_topic]

    def subscriptions(self) -> dict[str, str]:
        """Subscription id -> topic id."""
        return {
            self.windows_subscription: self.windows_topic,
            self.messages_subscription: self.messages_topic,
            self.insights_subscription: self.insights_topic,
            self.deadletter_subscription: self.deadletter_topic,
            self.undeliverable_subscription: self.undeliverable_topic,
        }

    def held_subscriptions(self) -> set[str]:
        """Subscriptions that keep messages for people, consumed by no service."""
        return {self.undeliverable_subscription}

    def dead_letter_topics(self) -> dict[str, str]:
        """Subscription id -> the topic id of its dead-letter policy: the dashboard's subscriptions,
        so that a message it keeps failing to store (for a reason of its own: the database) is
        not redelivered forever. The pipeline's are left without one: a runner acknowledges its
        input when a bundle commits, and its own dead letters carry the reason."""
        return {self.insights_subscription: self.undeliverable_topic,
                self.deadletter_subscription: self.undeliverable_topic}


LAYOUT = PubSubLayout()


class Settings(BaseSettings):
    """Process-wide settings; every field can be set as CHATLENS_<NAME> or in `.env`."""

    model_config = SettingsConfigDict(env_prefix="CHATLENS_", env_file=".env", extra="ignore")

    project: str = Field(DEFAULT_PROJECT, description="Google Cloud project id (min 6 characters).")
    model: str = Field("gemma3-270m", description="Model: 'gemma3-270m', a keras-hub preset dir or handle.")
    cache: Path = Field(Path.home() / ".cache" / "chatlens", description="Where converted models are cached.")
    reply_library: str | None = Field(None, description="The team's reply macros: the file the dashboard writes "
                                      "and the pipeline reads (unset: the pipeline uses the library ChatLens ships).")


@lru_cache
def get_settings() -> Settings:
    return Settings()


def topic_path(project: str, topic: str) -> str:
    return f"projects/{project}/topics/{topic}"


def subscription_path(project: str, subscription: str) -> str:
    return f"projects/{project}/subscriptions/{subscription}"
