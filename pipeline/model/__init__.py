"""Gemma model sources: the bundled GGUF (converted once, cached) or keras-hub presets."""
