"""Local Pub/Sub: a gRPC server compatible with `google.pubsub.v1`, and layout setup.

`localpubsub.emulator` runs the server (`EmulatorServer`), `localpubsub.admin`
creates the topics and subscriptions of `chatlens.config.LAYOUT` (`ensure_layout`).
Nothing heavy is imported here, so that `chatlens --help` stays fast.
"""
