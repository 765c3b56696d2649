#!/usr/bin/env bash
# Latency floors of batch-1 decode (idle L2/DRAM hop, grid barrier, kernel boundary, dependent L2 hit
# under a DRAM stream). Builds scripts/device/latency_probe.cu into /tmp and runs it (~10 s on an H200).
#   OUT=/tmp/out bash scripts/device/latency_probe.sh [arch]     (arch default 90; needs sm_90+)
# Writes $OUT/latency_probe.json and prints the table (also kept in $OUT/latency_probe.txt).
# Only runs kernels: clocks, power limits, persistence and compute mode are never touched.
set -euo pipefail
ARCH=${1:-90}
OUT=${OUT:-/tmp/out}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN=/tmp/latency_probe_sm$ARCH
mkdir -p "$OUT"
nvcc -O3 -std=c++17 -arch="sm_$ARCH" -lineinfo "$HERE/latency_probe.cu" -o "$BIN"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu \
  --format=csv 2>/dev/null || true
timeout 120 "$BIN" "$OUT/latency_probe.json" | tee "$OUT/latency_probe.txt"
