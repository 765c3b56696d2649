"""The runner: cells -> engine subprocesses -> samples, energy and metrics -> results.json."""
