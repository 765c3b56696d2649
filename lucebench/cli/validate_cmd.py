"""`lucebench validate`."""

from lucebench.cli import app  # noqa: F401
