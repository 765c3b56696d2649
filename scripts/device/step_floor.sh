#!/usr/bin/env bash
# Floors of one Qwen3.5-0.8B decode step's byte stream in one persistent kernel, by synchronisation structure
# (no barriers; the megakernel's 2 barriers a layer; 3 a layer with a prologue round trip each; the same chain
# with the weights streamed one stage ahead). Builds scripts/device/step_floor.cu into /tmp and runs it (~5 s).
#   OUT=/tmp/out bash scripts/device/step_floor.sh [arch] [tokens_per_launch]   (arch default 90; needs sm_90)
# Writes $OUT/step_floor.json and prints the table (also kept in $OUT/step_floor.txt).
# Only runs kernels: clocks, power limits, persistence and compute mode are never touched.
set -euo pipefail
ARCH=${1:-90}
TOKENS=${2:-64}
OUT=${OUT:-/tmp/out}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BIN=/tmp/step_floor_sm$ARCH
mkdir -p "$OUT"
nvcc -O3 -std=c++17 -arch="sm_$ARCH" -lineinfo "$HERE/step_floor.cu" -o "$BIN"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu \
  --format=csv 2>/dev/null || true
timeout 120 "$BIN" "$OUT/step_floor.json" "$TOKENS" | tee "$OUT/step_floor.txt"
