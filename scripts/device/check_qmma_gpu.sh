#!/usr/bin/env bash
# qmma_kernel (the verify's quantised GEMM, q4_K / q6_K at 5..72 rows) before (BEFORE_COMMIT, default d1d2484:
# main before q4_K's exact fp16 route; .carry/qmma/before/engines when its COMMIT matches, else git archive) against
# after (this tree) on one card: op check --qmma (27B shapes and odd shapes at 1..72 rows, activations of every
# magnitude, against the CPU reference and each type's contract per element, run to run bitwise, one K split, the
# last round split over warps, tile-count independence), the whole op check, --time-quant of both builds (qmma
# at 1/4/9/17/23/33/65 rows before / after and against the one-row qmv), verify == AR, the 27B verify cost per B
# against a decode step (before and after), then as time allows DFlash at forced AL 8.31 (budgets 8, 22) and
# DFlash == AR on the synthetic 0.8B Q4_K_M. SYNTHETIC weights: speed figures only. See check_qmma_gpu.py.
# About 6-7 minutes on a fresh H100 (DEADLINE_S, default 450, drops the optional parts). Output under $OUT/qmma/;
# the last line printed is SUMMARY.
#   OUT=/tmp/out bash scripts/device/check_qmma_gpu.sh        (ARCH defaults to 90)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 ARCH="${ARCH:-90}" DEC_NAME=qmma
export BEFORE_COMMIT="${BEFORE_COMMIT:-d1d2484}" DEADLINE_S="${DEADLINE_S:-450}"
# lucebench's own imports (gguf for the synthetic GGUF files, ...): wheels carried as .whl/
. scripts/device/wheels.sh
install_wheels .whl || true
mkdir -p "${OUT:-/tmp/out}/qmma"
python3 scripts/device/check_qmma_gpu.py 2>&1 | tee "${OUT:-/tmp/out}/qmma/check_qmma_gpu.log"
exit "${PIPESTATUS[0]}"
