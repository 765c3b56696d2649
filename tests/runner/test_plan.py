"""`lucebench run --dry-run`: a time estimate for pp/tg cells before any model exists, and which cells skip."""

from __future__ import annotations

import re

from rich.console import Console

from lucebench.config import find_config, load_config
from lucebench.matrix import expand
from lucebench.runner.plan import print_plan


def _plan(name: str, backend: str, **kw) -> str:
    config = load_config(find_config(name)).config
    console = Console(record=True, width=400)
    print_plan(config, backend, expand(config, backend), console=console, **kw)
    return console.export_text()


def test_estimate_of_shipped_configs_is_not_zero():
    for name, backend in (("rtx3090", "cuda"), ("h200", "cuda"), ("quick-gpu", "cuda"), ("cpu-smoke", "cpu")):
        text = _plan(name, backend)
        m = re.search(r"estimated time of the cells ≈ ([0-9.]+) (min|s)", text)
        assert m and float(m.group(1)) > 0, (name, text[-400:])


def test_plan_says_which_cells_will_be_skipped():
    text = _plan("rtx3090", "cuda")
    assert "16 of 81 cells will be skipped: power limit needs --allow-power-limit (and root)" in text
    assert "dflash runs on" not in text  # the dflash cells run on cuda
    assert "pflash runs on" not in text  # the pflash cells run on cuda
    allowed = _plan("rtx3090", "cuda", allow_power_limit=True)
    assert "power limit needs" not in allowed
