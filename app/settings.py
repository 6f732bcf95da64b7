"""Dashboard settings: one pydantic-settings model, read from CHATLENS_* env vars and `.env`.

The Pub/Sub names default to `chatlens.config.LAYOUT`, so the dashboard, the pipeline and
`chatlens pubsub-init` agree without anyone repeating a subscription id.
"""

from __future__ import annotations

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from chatlens.config import DEFAULT_PROJECT, LAYOUT, subscription_path


class DashboardSettings(BaseSettings):
    """Everything the dashboard process can be told; see app/README.md for the table."""

    model_config = SettingsConfigDict(
        env_prefix="CHATLENS_", env_file=".env", extra="ignore", validate_by_name=True
    )

    database_url: str = Field(
        "sqlite:///chatlens-dashboard.db",
        description="SQLAlchemy URL of the dashboard database (SQLite file, PostgreSQL, ...).",
    )
    project: str = Field(DEFAULT_PROJECT, description="Google Cloud project of the subscriptions.")
    insights_subscription: str = Field(
        LAYOUT.insights_subscription, description="Subscription id on the results topic."
    )
    deadletter_subscription: str = Field(
        LAYOUT.deadletter_subscription, description="Subscription id on the dead-letter topic."
    )
    pubsub_emulator_host: str | None = Field(
        None,
        validation_alias=AliasChoices("CHATLENS_PUBSUB_EMULATOR_HOST", "PUBSUB_EMULATOR_HOST"),
        description="host:port of a local Pub/Sub server; unset means Google Cloud with ADC.",
    )
    subscribe: bool = Field(True, description="Run the Pub/Sub subscribers inside the web process.")
    subscriber_max_messages: int = Field(200, ge=1, description="Flow control: messages leased at once.")
    subscriber_workers: int = Field(4, ge=1, description="Threads that store received messages.")
    subscriber_lease_seconds: int = Field(
        10, ge=10, le=600,
        description="Ack deadline the stream asks for (extended while a message is stored); "
        "messages a stopped dashboard still held come back after this long.",
    )
    subscriber_probe_seconds: float = Field(
        10.0, gt=0, description="How often an idle subscriber checks that Pub/Sub answers."
    )
    subscriber_max_backoff_seconds: float = Field(
        30.0, gt=0, description="Longest wait between attempts to re-open a failed stream."
    )
    host: str = Field("127.0.0.1", description="Address the web server binds to.")
    port: int = Field(8000, ge=0, le=65535, description="Port the web server listens on.")
    session_secret: SecretStr | None = Field(
        None,
        description="Key for session-token hashes and the login CSRF cookie; "
        "generated once and stored in the database when unset.",
    )
    session_hours: float = Field(12.0, gt=0, description="How long a login lasts without activity.")
    session_max_hours: float = Field(
        24.0, gt=0, description="How long a login lasts at most, however active (then log in again)."
    )
    cookie_secure: bool = Field(False, description="Send cookies only over HTTPS (set behind TLS).")
    login_max_failures: int = Field(5, ge=1, description="Failed logins per account and client address before a lockout (4x that per account).")
    login_lockout_seconds: float = Field(
        30.0, ge=0, description="First lockout; doubles with every further failure, up to 15 minutes."
    )
    login_window_seconds: float = Field(
        900.0, gt=0, description="Failures older than this are forgotten."
    )
    search_backend: str = Field(
        "auto", pattern="^(auto|fts5|like)$",
        description="Full-text search: 'fts5' (SQLite), 'like' (any database) or 'auto'.",
    )
    event_retention: int = Field(
        10_000, ge=100, description="Live-update events kept for reconnecting browsers."
    )
    event_poll_seconds: float = Field(
        1.0, gt=0, description="How often the live-update hub looks for events of other processes."
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="Proxy addresses or networks (e.g. the Ingress) whose X-Forwarded-For gives the client address.",
    )
    max_body_bytes: int = Field(1_048_576, ge=1024, description="Largest request body accepted (bigger: 413).")
    page_size: int = Field(200, ge=10, le=1000, description="Chats shown in the queue at once.")
    reply_library: str | None = Field(
        None,
        description="File the dashboard writes the team's reply library to (at start and after every change), "
        "for the pipeline's --reply-library; unset: not written.",
    )

    def insights_subscription_path(self) -> str:
        return subscription_path(self.project, self.insights_subscription)

    def deadletter_subscription_path(self) -> str:
        return subscription_path(self.project, self.deadletter_subscription)
