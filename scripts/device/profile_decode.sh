#!/usr/bin/env bash
# Per-kernel decode profile of `ar` and the megakernel under Nsight Compute (clocks untouched), one call:
#   OUT=/tmp/out bash scripts/device/profile_decode.sh [arch]      (from the repository root)
# Builds with -lineinfo (source-level stall sampling; code generation is unchanged) while the GPU
# synthesises the 0.8B checkpoint, then runs scripts/device/profile_decode.py.
set -uo pipefail
ARCH=${1:-90}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
BUILD=/tmp/pfbuild
t0=$(date +%s)
source scripts/device/build_engines.sh
build_engines engines "$BUILD" profile -DCMAKE_CUDA_FLAGS=-lineinfo lucebench-megakernel lucebench-ar > "$OUT/build.log" 2>&1 &
BPID=$!
synth_08b || { echo "synth failed"; exit 1; }
if ! wait $BPID; then echo "build failed:"; grep -iE "error" "$OUT/build.log" | head -30; exit 1; fi
echo "build + synth: $(( $(date +%s) - t0 )) s"
PYTHONPATH=.:scripts/device python3 scripts/device/profile_decode.py "$BUILD"
echo "total: $(( $(date +%s) - t0 )) s"
