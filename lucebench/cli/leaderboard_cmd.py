"""`lucebench leaderboard`."""

from lucebench.cli import app  # noqa: F401
