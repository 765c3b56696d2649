"""Workloads: dataset suites (HumanEval, GSM8K, Math500), synthetic pp/tg, long-context needles.

The runner calls `prepare_workload` (lucebench.suites.loader) and receives token ids that every engine
of a comparison sees identically.
"""

from lucebench.suites.base import PreparedWorkload, Prompt

__all__ = ["Prompt", "PreparedWorkload"]
