#!/usr/bin/env bash
# The decode GEMV asking L2 for the next matrix's first bytes (LB_GPU_L2_NEXT settings against each other in one
# build): op check, 27B Q4_K_M decode per setting, the GrowBuffer capture check, the verify cost. SYNTHETIC
# weights. See check_l2next_gpu.py. About 7 minutes on a fresh H100/H200. Output under $OUT/l2next/.
#   OUT=/tmp/out bash scripts/device/check_l2next_gpu.sh        (ARCH defaults to 90)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 ARCH="${ARCH:-90}"
. scripts/device/wheels.sh
install_wheels .whl || true
mkdir -p "${OUT:-/tmp/out}/l2next"
python3 scripts/device/check_l2next_gpu.py 2>&1 | tee "${OUT:-/tmp/out}/l2next/check_l2next_gpu.log"
exit "${PIPESTATUS[0]}"
