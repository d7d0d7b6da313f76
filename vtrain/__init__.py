"""vtrain: a trace-driven simulator and validator for 3D-parallel LLM training."""

__version__ = "0.1.0"
