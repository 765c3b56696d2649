"""A run resumed on another machine keeps the environment of the cells measured before (Result.move_to)."""

from __future__ import annotations

from lucebench.reports.build import build_report
from lucebench.reports.cells import collect
from lucebench.results.io import load_result
from lucebench.results.schema import environment_key
from lucebench.results.validate import errors, validate_result


def _other_machine(fab):
    env = fab.environment(gpu="NVIDIA H200", driver="580.159.04")
    env.hostname = "lent-machine"
    env.gpus[0].uuid = "GPU-1111"
    return env


def test_same_machine_replaces_the_environment(fab):
    r = fab.gpu_result()
    again = fab.environment()
    again.gpus[0].memory_bandwidth_bytes_s = 9.1e11  # measured again: a value, not identity
    assert r.move_to(again) is None
    assert r.environment is again and r.other_environments == {}
    assert all(c.environment_id is None for c in r.cells)


def test_same_machine_keeps_the_bandwidth_measured_first(fab):
    # the cells measured before computed their roofline with the first measurement: a resumed run keeps it,
    # so that every cell of the run has the same denominator
    r = fab.gpu_result()
    r.environment.gpus[0].memory_bandwidth_bytes_s = 4.064e12
    r.environment.gpus[0].memory_bandwidth_source = "measured: first call"
    again = fab.environment()
    again.gpus[0].memory_bandwidth_bytes_s = 4.209e12
    again.gpus[0].memory_bandwidth_source = "measured: second call"
    assert r.move_to(again) is None
    gpu = r.environment.gpus[0]
    assert (gpu.memory_bandwidth_bytes_s, gpu.memory_bandwidth_source) == (4.064e12, "measured: first call")
    # nothing measured before: the new measurement stands
    r = fab.gpu_result()
    r.environment.gpus[0].memory_bandwidth_bytes_s = None
    again = fab.environment()
    again.gpus[0].memory_bandwidth_bytes_s = 4.209e12
    r.move_to(again)
    assert r.environment.gpus[0].memory_bandwidth_bytes_s == 4.209e12


def test_another_machine_measures_its_own_bandwidth(fab):
    r = fab.gpu_result()
    r.environment.gpus[0].memory_bandwidth_bytes_s = 9.36e11
    other = _other_machine(fab)
    other.gpus[0].memory_bandwidth_bytes_s = 4.2e12
    key = r.move_to(other)
    assert r.environment.gpus[0].memory_bandwidth_bytes_s == 4.2e12
    assert r.other_environments[key].gpus[0].memory_bandwidth_bytes_s == 9.36e11


def test_another_machine_keeps_the_earlier_cells_environment(fab):
    r = fab.gpu_result()
    before = r.environment
    n = len(r.cells)
    key = r.move_to(_other_machine(fab))
    assert key == environment_key(before)
    assert r.other_environments == {key: before}
    assert all(c.environment_id == key for c in r.cells) and len(r.cells) == n
    assert r.environment_of(r.cells[0]) is before
    assert r.environment.gpus[0].name == "NVIDIA H200"
    assert errors(validate_result(r)) == []
    # report rows keep the card each cell ran on
    assert {v.card for v in collect([r])} == {"NVIDIA GeForce RTX 3090"}


def test_cells_measured_again_drop_the_earlier_environment(fab):
    r = fab.gpu_result()
    key = r.move_to(_other_machine(fab))
    remeasured = r.cells[0].model_copy(update={"environment_id": None})
    r.cells = [remeasured]
    r.prune_environments()
    assert key not in r.other_environments and r.environment_of(remeasured) is r.environment


def test_unknown_environment_key_is_an_error(fab):
    r = fab.gpu_result()
    r.cells[0].environment_id = "deadbeef0000"
    assert "$.cells[0].environment_id" in {p.path for p in errors(validate_result(r))}


def test_report_shows_every_machine_and_round_trips(fab, write_result, tmp_path):
    r = fab.gpu_result()
    r.move_to(_other_machine(fab))
    moved = r.cells[-1].model_copy(update={"environment_id": None})  # one cell measured on the new machine
    r.cells[-1] = moved
    path = write_result(r)
    back = load_result(path)
    assert back.other_environments.keys() == r.other_environments.keys()
    md = build_report([back], tmp_path / "rep").markdown.read_text()
    assert "## Environment: NVIDIA H200" in md and "earlier machine" in md
    assert f"| cells measured here | {moved.id} |" in md
