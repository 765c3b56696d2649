"""`lucebench build`."""

from lucebench.cli import app  # noqa: F401
