#!/usr/bin/env bash
# The DFlash step's costs beside the verify's GEMMs (commit, draft, host loop), before against after on one
# card, SYNTHETIC weights: builds both, the commit / verify checks, DFlash lossless on the synthetic 0.8B,
# forced-AL 8.31 speed on the synthetic 27B Q4_K_M at budgets 8 and 22 (draft / verify / commit ms a round;
# before and after, their output tokens compared), and the CUPTI breakdown of a round into draft / verify /
# commit. See check_dstep_gpu.py. About 6 minutes on a fresh H100 (builds ~100 s of it). Output under
# $OUT/dstep/; the key numbers on stdout.
#   OUT=/tmp/out bash scripts/device/check_dstep_gpu.sh        (ARCH defaults to 90)
# Before: .carry/dstep/before/engines (main's engines tree, its commit in .carry/dstep/before/COMMIT).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 ARCH="${ARCH:-90}"
. scripts/device/wheels.sh
install_wheels .whl || true
mkdir -p "${OUT:-/tmp/out}/dstep"
python3 scripts/device/check_dstep_gpu.py 2>&1 | tee "${OUT:-/tmp/out}/dstep/check_dstep_gpu.log"
exit "${PIPESTATUS[0]}"
