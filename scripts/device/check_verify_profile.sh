#!/usr/bin/env bash
# Where a 27B DFlash verify spends its time (op check, attention layer times, verify / step at B = 8 and 22,
# the verify's kernels on the GPU clock): check_verify_profile.py. SYNTHETIC weights: speed only.
# About 4-5 minutes on a fresh H100. Output under $OUT/vprof/.
#   OUT=/tmp/out bash scripts/device/check_verify_profile.sh        (ARCH defaults to 90)
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 ARCH="${ARCH:-90}"
. scripts/device/wheels.sh
install_wheels .whl || true
mkdir -p "${OUT:-/tmp/out}/vprof"
python3 scripts/device/check_verify_profile.py 2>&1 | tee "${OUT:-/tmp/out}/vprof/check_verify_profile.log"
exit "${PIPESTATUS[0]}"
