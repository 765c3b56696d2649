#!/usr/bin/env bash
# Device check of every GPU op against the CPU reference (engines/tests/gpu_op_check.cu): builds
# lucebench-gpu-op-check (CMake, engines/) and runs it; its table goes to stdout and $OUT/gpu_op_check.md.
#   OUT=/tmp/out scripts/device/check_gpu_ops.sh [arch]      (from the repository root; arch default 90)
#   OP_CHECK_EXE=path: run that build instead of building (a lucebench-gpu-op-check built for this arch)
# Exit status: the check's (1 when any op is outside its tolerance).
set -uo pipefail
ARCH=${1:-90}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
exe=${OP_CHECK_EXE:-}
if [ -z "$exe" ]; then
  source scripts/device/build_engines.sh
  t0=$(date +%s)
  if ! build_engines engines /tmp/opcheck_build device-op-check "" lucebench-gpu-op-check > "$OUT/op_check_build.log" 2>&1; then
    echo "build failed:"; tail -30 "$OUT/op_check_build.log"; exit 1
  fi
  echo "built in $(( $(date +%s) - t0 )) s"
  exe=/tmp/opcheck_build/lucebench-gpu-op-check
fi
"$exe" | tee "$OUT/gpu_op_check.md"
exit "${PIPESTATUS[0]}"
