"""The model, by job: `loading/` (a spec to a keras-hub model), `decoding/` (a model to labels,
summaries and replies), `training/` (the corpus to an adapter), `backends/` (what the pipeline's
model stage runs), `types.py` (the shared vocabulary). README.md here says which file does what."""
