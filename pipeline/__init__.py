"""The Beam pipeline and the Gemma model code that runs on its workers."""
