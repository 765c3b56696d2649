"""`lucebench models`."""

from lucebench.cli import app  # noqa: F401
