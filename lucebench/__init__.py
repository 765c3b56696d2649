"""lucebench: benchmark and reproducibility suite for local LLM inference engines."""

__version__ = "0.1.0"
