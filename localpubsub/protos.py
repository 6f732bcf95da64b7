"""The raw protobuf classes shipped inside google-cloud-pubsub.

`google.pubsub_v1.types.X` are proto-plus wrappers; `.pb()` gives the protobuf class
that gRPC (de)serializes, so the emulator needs no generated stubs of its own.
"""

from __future__ import annotations

from google.pubsub_v1 import types


def raw(name: str):
    """The protobuf class behind google-cloud-pubsub's proto-plus type `name`."""
    return getattr(types, name).pb()


Topic = raw("Topic")
Subscription = raw("Subscription")
PubsubMessage = raw("PubsubMessage")
PullResponse = raw("PullResponse")
StreamingPullRequest = raw("StreamingPullRequest")
StreamingPullResponse = raw("StreamingPullResponse")
