#!/usr/bin/env bash
# The GPU verify path on one card: builds the CUDA core and two checks, then runs
#   lucebench-verify-kernels-check        each verify kernel against its CPU reference (random inputs)
#   lucebench-verify-gpu-check --time     verify + commit == AR greedy on random Qwen3.5 models, then the
#                                         cost of one verify forward of B + 1 rows against a decode step on
#                                         full-shape synthetic Qwen3.5-0.8B
# Output (and the card's name) in $OUT.   usage: scripts/device/check_verify_gpu.sh   (ARCH defaults to 90)
set -euo pipefail
ARCH=${ARCH:-90}
OUT=${OUT:-/tmp/lucebench-out}
mkdir -p "$OUT"
. scripts/device/build_engines.sh
build_engines engines /tmp/lb-verify-build verify "" lucebench-verify-kernels-check lucebench-verify-gpu-check \
  > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/card.txt"
/tmp/lb-verify-build/lucebench-verify-kernels-check | tee "$OUT/verify_kernels_check.txt"
/tmp/lb-verify-build/lucebench-verify-gpu-check --time | tee "$OUT/verify_gpu_check.txt"
