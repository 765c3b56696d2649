"""The engine registry against the CMake project: every bundled engine type names an executable that
engines/ builds, and a type whose executable is not built says so in one message instead of failing later."""
from __future__ import annotations

import dataclasses

from lucebench.engines.build import BUNDLED_ENGINES
from lucebench.engines.registry import ENGINE_TYPES


def test_every_bundled_engine_type_has_its_executable_built():
    bundled = {name: t for name, t in ENGINE_TYPES.items() if t.kind == "bundled"}
    assert set(bundled) == {"ar", "megakernel", "dflash", "pflash"}
    for name, t in bundled.items():
        assert t.executable == BUNDLED_ENGINES[name]
        assert t.unavailable() is None


def test_a_type_whose_executable_is_not_built_says_why():
    ghost = dataclasses.replace(ENGINE_TYPES["pflash"], name="ghost", executable="lucebench-ghost")
    reason = ghost.unavailable()
    assert reason is not None and "engine type 'ghost' has no executable" in reason and "lucebench-ghost" in reason
