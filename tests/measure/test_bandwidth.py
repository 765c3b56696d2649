"""Datasheet bandwidth table and the measured path where no GPU is present."""

from __future__ import annotations

import pytest

from lucebench.measure.bandwidth import datasheet_bandwidth, measure_copy_bandwidth, memory_bandwidth


@pytest.mark.parametrize("name, gbps", [
    ("NVIDIA GeForce RTX 3090", 936), ("NVIDIA GeForce RTX 3090 Ti", 1008), ("NVIDIA GeForce RTX 4090", 1008),
    ("NVIDIA GeForce RTX 5090", 1792), ("NVIDIA A100-SXM4-80GB", 2039), ("NVIDIA A100 80GB PCIe", 1935),
    ("NVIDIA H100 80GB HBM3", 3350), ("NVIDIA H100 PCIe", 2000), ("NVIDIA H200", 4800), ("NVIDIA H200 NVL", 4800),
    ("NVIDIA A10", 600), ("NVIDIA L40S", 864), ("NVIDIA L4", 300), ("Tesla T4", 320),
])
def test_datasheet_lookup(name, gbps):
    bw = datasheet_bandwidth(name)
    assert bw is not None and bw.bytes_per_s == gbps * 1e9 and bw.source.startswith("datasheet: ")


@pytest.mark.parametrize("name", ["NVIDIA A100-SXM4-64GB", "NVIDIA GH200 144G HBM3e", "Quadro P4000", ""])
def test_unknown_cards_are_not_guessed(name):
    # "a10" must not match an A100 variant, nor "h200" a GH200
    assert datasheet_bandwidth(name) is None


def test_no_cuda_means_no_measurement_and_datasheet_fallback():
    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        assert measure_copy_bandwidth(0, size_bytes=1 << 26, repeats=3) > 1e10
    else:
        assert measure_copy_bandwidth(0) is None
        bw = memory_bandwidth(0, "NVIDIA H200")
        assert bw is not None and bw.bytes_per_s == 4.8e12 and bw.source.startswith("datasheet")
        assert memory_bandwidth(0, None) is None
