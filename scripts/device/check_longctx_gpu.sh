#!/usr/bin/env bash
# Long-context attention on one CUDA card, before (BEFORE_COMMIT, default 9098bc0: .carry/longctx/before/engines
# when carried, else git archive) against after (this tree): the op check's split attention rows, one attention
# layer of each long-context shape timed (gpu-op-check --time-attention: before's kernel vs now), 27B Q4_K_M
# `ar` decode tok/s after prompts of 1K / 16K / 64K / 128K tokens and the tokens of both builds, the 27B verify
# at B = 22 at 1K and 64K with the split on and off (SYNTHETIC weights). See check_longctx_gpu.py.
# About 7 minutes on a fresh H100. Output under $OUT/longctx/.
#   OUT=/tmp/out bash scripts/device/check_longctx_gpu.sh        (ARCH defaults to 90)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 ARCH="${ARCH:-90}"
export LUCEBENCH_CACHE="${LUCEBENCH_CACHE:-$PWD/.cache/lucebench-device}" HF_HUB_OFFLINE=1
# lucebench's own imports (gguf for the synthetic GGUF file, pydantic, ...): wheels carried as .whl/, which
# the device image lacks (scripts/device/run_config.sh says how they are made)
. scripts/device/wheels.sh
install_wheels .whl || true
mkdir -p "${OUT:-/tmp/out}/longctx"
python3 scripts/device/check_longctx_gpu.py 2>&1 | tee "${OUT:-/tmp/out}/longctx/check_longctx_gpu.log"
exit "${PIPESTATUS[0]}"
