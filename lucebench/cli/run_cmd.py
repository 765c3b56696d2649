"""`lucebench run`."""

from lucebench.cli import app  # noqa: F401
