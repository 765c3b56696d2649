"""Workloads: dataset suites (HumanEval, GSM8K, Math500), synthetic pp/tg, long-context needles.

The runner calls `prepare_workload` (lucebench.suites.loader) and receives token ids that every engine
of a comparison sees identically; `workload_identity` fingerprints that work so different workloads are
never compared; `score` (lucebench.suites.scoring) and `compare_outputs` (lucebench.suites.lossless)
judge the outputs.
"""

from lucebench.suites.base import PreparedWorkload, Prompt
from lucebench.suites.identity import workload_identity
from lucebench.suites.loader import prepare_workload
from lucebench.suites.lossless import compare_outputs
from lucebench.suites.registry import SuiteRef, list_suites, resolve_suite
from lucebench.suites.scoring import score

__all__ = [
           "PreparedWorkload",
           "Prompt",
           "SuiteRef",
           "compare_outputs",
           "list_suites",
           "prepare_workload",
           "resolve_suite",
           "score",
           "workload_identity",
]
