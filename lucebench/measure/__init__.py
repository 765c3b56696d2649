"""Measurement: NVML power and energy, the power-limit guard, GPU state, memory bandwidth, environment.

Modules (imported individually; this package imports nothing so that nvml/power/power_limit/energy/state
run on machines without pydantic):

* nvml: thin NVML wrapper with an injectable backend (fake: the simulated backend for tests)
* power: PowerSampler (energy of phase windows), measure_idle_power; energy: the window arithmetic, the one
  energy record (EnergyResult) and the one rule for summing windows (combine)
* power_limit: PowerLimitGuard, PowerLimitError, recover_stale_power_limits
* state: read_gpu_state; bandwidth: measured / datasheet memory bandwidth
* env: collect_environment; records: conversion to and from result-schema models
"""
