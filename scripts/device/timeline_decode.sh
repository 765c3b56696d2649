#!/usr/bin/env bash
# Kernel timeline of a decode step (CUPTI, the GPU's own timestamps), `ar` and the megakernel, one call:
#   OUT=/tmp/out bash scripts/device/timeline_decode.sh [arch]      (from the repository root)
# Builds the engines and scripts/device/kernel_timeline.cpp (a CUDA injection library) while the GPU
# synthesises the 0.8B checkpoint, then runs scripts/device/timeline_decode.py.
set -uo pipefail
ARCH=${1:-90}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
BUILD=/tmp/tlbuild
t0=$(date +%s)
source scripts/device/build_engines.sh
build_engines engines "$BUILD" timeline "" lucebench-megakernel lucebench-ar > "$OUT/build.log" 2>&1 &
BPID=$!
# CUPTI: the toolkit's, else the nvidia-cuda-cupti wheel's
CUDA_INC="$(dirname "$(command -v nvcc)")/../include"
CUPTI_INC=""
WHEELS=$(python3 -c 'import glob, nvidia; print(" ".join(glob.glob(nvidia.__path__[0] + "/*")))' 2>/dev/null)
for d in "$CUDA_INC" /usr/local/cuda/extras/CUPTI/include $(for w in $WHEELS; do echo "$w/include"; done); do
  [ -f "$d/cupti.h" ] && { CUPTI_INC=$d; break; }
done
CUPTI_LIB=$(find "$(dirname "$(command -v nvcc)")/.." /usr/local/cuda/extras/CUPTI $WHEELS -name 'libcupti.so*' 2>/dev/null | head -1)
echo "cupti.h: ${CUPTI_INC:-missing}; libcupti: ${CUPTI_LIB:-missing}"
[ -n "$CUPTI_INC" ] && [ -n "$CUPTI_LIB" ] || { echo "CUPTI not found"; exit 1; }
g++ -O2 -shared -fPIC scripts/device/kernel_timeline.cpp -I"$CUPTI_INC" -I"$CUDA_INC" "$CUPTI_LIB" \
  -Wl,-rpath,"$(dirname "$CUPTI_LIB")" -o /tmp/libkernel_timeline.so || { echo "injection library build failed"; exit 1; }
synth_08b || { echo "synth failed"; exit 1; }
if ! wait $BPID; then echo "build failed:"; grep -iE "error" "$OUT/build.log" | head -30; exit 1; fi
echo "build + synth: $(( $(date +%s) - t0 )) s"
PYTHONPATH=.:scripts/device python3 scripts/device/timeline_decode.py "$BUILD" /tmp/libkernel_timeline.so
echo "total: $(( $(date +%s) - t0 )) s"
