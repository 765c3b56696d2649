"""`lucebench compare`."""

from lucebench.cli import app  # noqa: F401
