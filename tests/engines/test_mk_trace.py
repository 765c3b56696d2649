"""scripts/device/mk_trace.py: the megakernel's LB_MK_TRACE stamps summarised per interval and layer type."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("mk_trace", ROOT / "scripts" / "device" / "mk_trace.py")
assert _spec and _spec.loader
mk_trace = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mk_trace)

GHZ = 2.0  # cycles per ns: 2,000 cycles = 1 us


def _trace_line(layers: list[list[tuple[int, int]]], lm_us: float) -> str:
    """One block's line: per layer (slot, us since the layer's start) pairs; unwritten slots negative."""
    t, start = [], 0
    for stamps in layers:
        row = [-1] * 16
        for slot, us in stamps:
            row[slot] = start + int(us * 2000)
        start = max(row) + 2000  # the next layer starts 1 us after this one's last stamp
        t += row
    return "block 0: " + " ".join(map(str, t + [start, start + int(lm_us * 2000)]))


FUSED = [(0, 0), (1, 1.5), (2, 9.0), (3, 9.0), (6, 10.0), (7, 10.5), (8, 12.5), (4, 13.0), (5, 14.0),
         (13, 15.0), (9, 16.0), (12, 21.0), (10, 25.0), (11, 26.5)]


def test_fused_layers_are_named_by_type(tmp_path: Path) -> None:
    path = tmp_path / "trace.txt"
    path.write_text(_trace_line([FUSED, FUSED], lm_us=120.0) + "\n")
    res = mk_trace.trace_summary(path, GHZ, ["linear_attention", "full_attention"])["block 0"]
    dn, att = res["deltanet"], res["attention"]
    assert dn["in gemv+epilogue"] == pytest.approx(7.5)
    assert dn["deltanet: step + gated norm"] == pytest.approx(2.0)
    assert att["attention: wait for chunks"] == pytest.approx(2.0)
    assert dn["gate/up"] == pytest.approx(5.0) and dn["down + atomics"] == pytest.approx(4.0)
    assert dn["to next layer"] == pytest.approx(1.0)
    assert dn["layer"] == pytest.approx(27.5)
    assert res["lm head"] == pytest.approx(120.0)
    # the slot pairs are named, none left as "a->b"
    assert not [k for k in dn if "->" in k and not k.startswith("barrier")]


def test_attention_chunk_stamps_split_the_chunk(tmp_path: Path) -> None:
    # a block that runs a chunk also stamps 14 (q/k normalised and roped) and 15 (warp 0's K/V rows done)
    chunk = [(0, 0), (1, 1.5), (2, 7.0), (3, 7.0), (6, 8.0), (14, 9.5), (15, 12.0), (7, 14.0), (8, 15.5),
             (4, 19.5), (5, 21.0), (13, 21.2), (9, 22.5), (12, 27.5), (10, 31.5), (11, 33.0)]
    path = tmp_path / "trace.txt"
    path.write_text(_trace_line([chunk], lm_us=120.0) + "\n")
    att = mk_trace.trace_summary(path, GHZ, ["full_attention"])["block 0"]["attention"]
    assert att["attention: chunk q/k norm + rope"] == pytest.approx(1.5)
    assert att["attention: chunk K/V rows (warp 0)"] == pytest.approx(2.5)
    assert att["attention: chunk warp merge + record"] == pytest.approx(2.0)
    assert att["attention: wait for chunks"] == pytest.approx(1.5)
    assert not [k for k in att if "->" in k and not k.startswith("barrier")]


def test_unfused_stages_keep_their_names(tmp_path: Path) -> None:
    stamps = [(k, 1.0 * k) for k in range(15)]
    path = tmp_path / "trace.txt"
    path.write_text(_trace_line([stamps], lm_us=100.0) + "\n")
    res = mk_trace.trace_summary(path, GHZ)["block 0"]["layer"]
    assert res["out gemv"] == pytest.approx(1.0)
    assert res["down gemv"] == pytest.approx(1.0)
    assert "mixer" in res and "deltanet: inputs round trip" not in res


def test_layer_types_from_config_or_interval(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"num_hidden_layers": 8,
                                                                        "full_attention_interval": 4}}))
    assert mk_trace.layer_types(tmp_path) == ["linear_attention"] * 3 + ["full_attention"] + \
        ["linear_attention"] * 3 + ["full_attention"]
    listed = ["full_attention", "linear_attention"]
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 2, "layer_types": listed}))
    assert mk_trace.layer_types(tmp_path) == listed
