"""`lucebench datasets`."""

from lucebench.cli import app  # noqa: F401
