"""`lucebench submit`."""

from lucebench.cli import app  # noqa: F401
