#!/usr/bin/env bash
# The quantised (GGUF) decode step on CUDA, before (BEFORE_COMMIT, default 5ad8b41: .carry/dec/before/engines
# when carried, else git archive) against after (this tree) on one card: op check, per-matrix GEMV times,
# greedy tokens of both builds (0.8B and 27B Q4_K_M, SYNTHETIC weights), 27B decode tok/s + roofline %, DFlash
# forced-AL speed at budgets 8/22, verify cost per B, the CUPTI step breakdown. See check_dec_gpu.py.
# About 7 minutes on a fresh H100/H200. Output under $OUT/dec/.
#   OUT=/tmp/out bash scripts/device/check_dec_gpu.sh        (ARCH defaults to 90)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 ARCH="${ARCH:-90}"
# lucebench's own imports (gguf for the synthetic GGUF files, pydantic, ...): wheels carried as .whl/, which
# the device image lacks (scripts/device/run_config.sh says how they are made)
. scripts/device/wheels.sh
install_wheels .whl || true
# DEC_NAME: the output folder under $OUT (check_qmv_gpu.sh: qmv)
mkdir -p "${OUT:-/tmp/out}/${DEC_NAME:-dec}"
python3 scripts/device/check_dec_gpu.py 2>&1 | tee "${OUT:-/tmp/out}/${DEC_NAME:-dec}/check_dec_gpu.log"
exit "${PIPESTATUS[0]}"
