"""`lucebench generate`."""

from lucebench.cli import app  # noqa: F401
