"""ChatLens: streaming chat analysis with Gemma on Apache Beam."""

__version__ = "0.1.0"
