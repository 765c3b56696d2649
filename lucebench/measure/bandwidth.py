"""Device memory bandwidth, the denominator of the decode roofline (bytes per token / bandwidth).

Measured where torch with a GPU is importable (a large device-to-device copy; bytes read + written per
second, median of repeats), else a datasheet value from the table below, labelled as such.
"""

from __future__ import annotations

import importlib.util
import re
import statistics
import time
from dataclasses import dataclass

_GB = 1e9

# (name pattern as NVML/ROCm reports it, lower case; GB/s; source). Longest patterns are tried first and
# must match as whole words, so "rtx 3090 ti" wins over "rtx 3090" and "a10" never matches "a100".
DATASHEET_GBPS: list[tuple[str, float, str]] = [
    ("rtx 2080 ti", 616, "NVIDIA GeForce RTX 2080 Ti spec"),
    ("rtx 3060", 360, "NVIDIA GeForce RTX 3060 spec (12 GB)"),
    ("rtx 3070", 448, "NVIDIA GeForce RTX 3070 spec"),
    ("rtx 3080", 760, "NVIDIA GeForce RTX 3080 spec (10 GB)"),
    ("rtx 3080 ti", 912, "NVIDIA GeForce RTX 3080 Ti spec"),
    ("rtx 3090", 936, "NVIDIA GeForce RTX 3090 spec"),
    ("rtx 3090 ti", 1008, "NVIDIA GeForce RTX 3090 Ti spec"),
    ("rtx 4070", 504, "NVIDIA GeForce RTX 4070 spec"),
    ("rtx 4080", 716.8, "NVIDIA GeForce RTX 4080 spec"),
    ("rtx 4080 super", 736, "NVIDIA GeForce RTX 4080 SUPER spec"),
    ("rtx 4090", 1008, "NVIDIA GeForce RTX 4090 spec"),
    ("rtx 5080", 960, "NVIDIA GeForce RTX 5080 spec"),
    ("rtx 5090", 1792, "NVIDIA GeForce RTX 5090 spec"),
    ("rtx a5000", 768, "NVIDIA RTX A5000 datasheet"),
    ("rtx a6000", 768, "NVIDIA RTX A6000 datasheet"),
    ("rtx 6000 ada generation", 960, "NVIDIA RTX 6000 Ada datasheet"),
    ("rtx pro 6000 blackwell", 1792, "NVIDIA RTX PRO 6000 Blackwell datasheet"),
    ("tesla t4", 320, "NVIDIA T4 datasheet"),
    ("t4", 320, "NVIDIA T4 datasheet"),
    ("tesla v100-sxm2-16gb", 900, "NVIDIA V100 datasheet (SXM2)"),
    ("tesla v100-sxm2-32gb", 900, "NVIDIA V100 datasheet (SXM2)"),
    ("a10", 600, "NVIDIA A10 datasheet"),
    ("a10g", 600, "AWS/NVIDIA A10G spec"),
    ("l4", 300, "NVIDIA L4 datasheet"),
    ("l40", 864, "NVIDIA L40 datasheet"),
    ("l40s", 864, "NVIDIA L40S datasheet"),
    ("a100-sxm4-40gb", 1555, "NVIDIA A100 datasheet (40 GB SXM)"),
    ("a100-pcie-40gb", 1555, "NVIDIA A100 datasheet (40 GB PCIe)"),
    ("a100-sxm4-80gb", 2039, "NVIDIA A100 datasheet (80 GB SXM)"),
    ("a100 80gb pcie", 1935, "NVIDIA A100 datasheet (80 GB PCIe)"),
    ("h100 pcie", 2000, "NVIDIA H100 datasheet (PCIe)"),
    ("h100 80gb hbm3", 3350, "NVIDIA H100 datasheet (SXM)"),
    ("h100 sxm5 80gb", 3350, "NVIDIA H100 datasheet (SXM)"),
    ("h100 nvl", 3900, "NVIDIA H100 datasheet (NVL)"),
    ("h200", 4800, "NVIDIA H200 datasheet"),
    ("h200 nvl", 4800, "NVIDIA H200 datasheet (NVL)"),
    ("gh200 480gb", 4000, "NVIDIA GH200 datasheet (96 GB HBM3)"),
    ("b200", 8000, "NVIDIA DGX B200 / HGX B200 spec"),
    ("mi250x", 3276.8, "AMD Instinct MI250X spec"),
    ("mi300x", 5300, "AMD Instinct MI300X spec"),
    ("rx 7900 xtx", 960, "AMD Radeon RX 7900 XTX spec"),
]


@dataclass(frozen=True)
class Bandwidth:
    """Memory bandwidth in bytes/s and where the number comes from ("measured: ..." or "datasheet: ...")."""

    bytes_per_s: float
    source: str


def datasheet_bandwidth(gpu_name: str) -> Bandwidth | None:
    """The vendor's peak memory bandwidth for a GPU name as NVML reports it, or None if not in the table."""
    name = " ".join(gpu_name.lower().split())
    for pattern, gbps, source in sorted(DATASHEET_GBPS, key=lambda row: -len(row[0])):
        if re.search(rf"(?<![a-z0-9]){re.escape(pattern)}(?![a-z0-9])", name):
            return Bandwidth(gbps * _GB, f"datasheet: {source}")
    return None


def measure_copy_bandwidth(device_index: int, *, size_bytes: int | None = None, repeats: int = 20,
                           warmup_s: float = 0.3) -> float | None:
    """Device memory bandwidth in bytes/s (read + written) from a large device-to-device copy timed with
    CUDA events, median of ``repeats`` after ``warmup_s`` seconds of the same copy. None where torch or a
    CUDA/ROCm device is not available.

    The buffer is 1 GiB (or a quarter of the free memory if less), far beyond any cache.
    """
    if importlib.util.find_spec("torch") is None:
        return None
    import torch  # heavy: only imported when asked to measure

    if not torch.cuda.is_available() or device_index >= torch.cuda.device_count():
        return None
    device = torch.device("cuda", device_index)
    with torch.cuda.device(device):
        free, _ = torch.cuda.mem_get_info(device)
        n = size_bytes or min(1 << 30, free // 4)
        n -= n % 4096
        if n <= 0:
            return None
        src = torch.empty(n, dtype=torch.uint8, device=device)
        src.fill_(1)
        dst = torch.empty_like(src)
        # Warm up for a fixed time, not a count: a card found idle (SM clock ~345 MHz on an H200) needs tens
        # of ms to clock up, and three 1 GiB copies (~1.5 ms) measured 3.5% low there (an H200, 2026-11-21).
        deadline, warm = time.perf_counter() + warmup_s, 0
        while warm < 3 or time.perf_counter() < deadline:
            dst.copy_(src)
            torch.cuda.synchronize(device)
            warm += 1
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        del src, dst
        torch.cuda.empty_cache()
    return 2 * n / statistics.median(times)


def memory_bandwidth(device_index: int, gpu_name: str | None, *, measure: bool = True) -> Bandwidth | None:
    """Measured bandwidth when ``measure`` and torch can, else the datasheet value, else None."""
    if measure:
        value = measure_copy_bandwidth(device_index)
        if value is not None:
            return Bandwidth(value, "measured: torch device-to-device copy of 1 GiB, median of 20 after 0.3 s of warm-up")
    return datasheet_bandwidth(gpu_name) if gpu_name else None
