"""The transforms of the ChatLens pipeline, one module per concern.

    windows mode:  Envelope ─ ValidateWindows ──────────────┐
    messages mode: Envelope ─ ValidateMessages ─ Sessionize ─┴─ DeduplicateWindows ─ AnalyzeWindows ─► insights
                   invalid input ──────────────────────────────► dead letters (stage "validate")
                   duplicates ─────────────────────────────────► settled (acknowledged, no output)
                   model and post-processing failures ─────────► dead letters ("inference", "postprocess")

- `records`: the values between the steps. An `Envelope` is one raw input message; a
  `TaggedWindow` is a ChatWindow with its `Origin` (what the insight and a dead letter
  need, and the ids of the input messages the outcome settles); every stage ends in an
  `Output`: a ChatInsight or a DeadLetter, its Pub/Sub attributes, and the source ids it
  settles. Nothing read is dropped without one, except duplicates, which settle their
  source ids without a new output (and early session firings that are not a valid window
  yet: a later firing covers them).
- `validate`, `sessions`, `dedup`, `batching`, `insights`, `dead_letters`: the steps.
- `analyze`: `AnalyzeWindows` (the model stage) and `AnalyzeChats`, the whole graph between
  reading and publishing. `pipeline/graph.py` puts Pub/Sub around it (`pipeline/io/`),
  `chatlens analyze` (batch.py) files.

Importing these modules has no side effects.
"""
