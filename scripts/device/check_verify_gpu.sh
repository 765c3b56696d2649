#!/usr/bin/env bash
# The GPU verify path on one card: builds the CUDA core and the checks, then runs
#   lucebench-verify-kernels-check        each verify kernel against its CPU reference (random inputs)
#   lucebench-verify-gpu-check --time     through the GPU backend (make_gpu_backend): verify + commit == AR
#                                         greedy on random Qwen3.5 models, the verify's outputs against the CPU
#                                         backend's, two models in one process, then the cost of one verify
#                                         forward of B + 1 rows against a decode step on full-shape synthetic
#                                         Qwen3.5-0.8B
#   lucebench-gpu-op-check                every GPU op against its CPU reference (with OP_CHECK=1)
# Output (and the card's name) in $OUT.   usage: scripts/device/check_verify_gpu.sh   (ARCH defaults to 90)
set -uo pipefail
ARCH=${ARCH:-90}
OUT=${OUT:-/tmp/lucebench-out}
mkdir -p "$OUT"
. scripts/device/build_engines.sh
targets="lucebench-verify-kernels-check lucebench-verify-gpu-check"
[ "${OP_CHECK:-0}" = 1 ] && targets="$targets lucebench-gpu-op-check"
t0=$(date +%s)
# shellcheck disable=SC2086  # targets is a list
build_engines engines /tmp/lb-verify-build verify "" $targets > "$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "built in $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT/card.txt"
rc=0
stdbuf -oL /tmp/lb-verify-build/lucebench-verify-kernels-check > "$OUT/verify_kernels_check.txt" 2>&1 || rc=1
tail -25 "$OUT/verify_kernels_check.txt"
stdbuf -oL /tmp/lb-verify-build/lucebench-verify-gpu-check --time > "$OUT/verify_gpu_check.txt" 2>&1 || rc=1
cat "$OUT/verify_gpu_check.txt"
if [ "${OP_CHECK:-0}" = 1 ]; then
  stdbuf -oL /tmp/lb-verify-build/lucebench-gpu-op-check > "$OUT/gpu_op_check.md" 2>&1 || rc=1
  tail -15 "$OUT/gpu_op_check.md"
fi
exit $rc
