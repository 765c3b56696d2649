#!/usr/bin/env bash
# The fused MLP's cross-block reduction alone (1,024 fixed-point REDs a block, grid barrier, read-back), flat and
# pre-summed in thread block clusters of 2/4/8 through distributed shared memory; also whether a cooperative
# launch accepts a cluster dimension. Builds scripts/device/cluster_probe.cu into /tmp and runs it (~5 s).
#   OUT=/tmp/out bash scripts/device/cluster_probe.sh [iterations]   (needs sm_90)
# Writes $OUT/cluster_probe.txt. Only runs kernels: clocks, power limits, persistence and compute mode are never touched.
set -euo pipefail
ITERS=${1:-2000}
OUT=${OUT:-/tmp/out}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN=/tmp/cluster_probe_sm90
mkdir -p "$OUT"
nvcc -O3 -std=c++17 -arch=sm_90 "$HERE/cluster_probe.cu" -o "$BIN"
timeout 120 "$BIN" "$ITERS" | tee "$OUT/cluster_probe.txt"
