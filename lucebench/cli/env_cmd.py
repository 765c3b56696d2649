"""`lucebench env`."""

from lucebench.cli import app  # noqa: F401
