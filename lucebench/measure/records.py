"""Conversion of measurement results (plain dataclasses and dicts) into result-schema models.

Kept apart from nvml.py / power.py / power_limit.py so those run where pydantic is not installed.
"""

from __future__ import annotations

from typing import Any

from lucebench.measure.energy import EnergyResult
from lucebench.measure.power_limit import LimitState
from lucebench.results.schema import PhaseEnergy, PowerState


def phase_energy(result: EnergyResult) -> PhaseEnergy:
    """The schema model of one phase's energy (Sample.energy[phase])."""
    return PhaseEnergy(**result.to_dict())


def energy_result(stored: PhaseEnergy) -> EnergyResult:
    """The energy record of a stored phase energy (the inverse of `phase_energy`)."""
    return EnergyResult(**stored.model_dump())


def power_state(gpu_state: dict[str, Any] | None = None, *, limit: LimitState | None = None,
                requested_limit_w: float | None = None, idle_power_w: float | None = None) -> PowerState:
    """The cell's PowerState from `read_gpu_state` (read during the cell), the guard's `LimitState` (when a
    limit was requested and applied) and the measured idle power. Values read during the cell win over
    the guard's read-back, which is older."""
    fields: dict[str, Any] = {}
    if limit is not None:
        fields.update(limit.to_dict())
    elif requested_limit_w is not None:
        fields["requested_limit_w"] = requested_limit_w
    for key, value in (gpu_state or {}).items():
        if value is not None:
            fields[key] = value
    fields["idle_power_w"] = idle_power_w
    return PowerState(**fields)
