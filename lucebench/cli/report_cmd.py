"""`lucebench report`."""

from lucebench.cli import app  # noqa: F401
