#!/usr/bin/env bash
# Device check of the megakernel engine, one call: build (CMake, engines/ + engines/megakernel) while the
# GPU synthesises the 0.8B checkpoint and transformers' references, then correctness + timings.
#   OUT=/tmp/out scripts/device/check_megakernel.sh [arch]     (from the repository root)
set -uo pipefail
ARCH=${1:-90}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
BUILD=/tmp/mkbuild
date -u +"%Y-%m-%dT%H:%M:%SZ" > "$OUT/env.txt"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit,temperature.gpu --format=csv >> "$OUT/env.txt" 2>&1
nvcc --version | tail -2 >> "$OUT/env.txt"
# another process computing on the card (e.g. an engine left by an earlier, killed call) time-slices with every
# measured engine and halves their speed without an error: say so before measuring
others=$(nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>/dev/null)
[ -n "$others" ] && echo "WARNING: other processes compute on this GPU (numbers below are not the card's): $others" >> "$OUT/env.txt"
cat "$OUT/env.txt"
t0=$(date +%s)
source scripts/device/build_engines.sh
build_engines engines "$BUILD" device-check "" lucebench-megakernel lucebench-ar > "$OUT/build.log" 2>&1 &
BPID=$!
# BASE_SRC="NAME=DIR ..." (copies of other commits' engines/): each one's ar and megakernel are built too,
# as /tmp/mkbase_NAME/lucebench-ar and .../lucebench-megakernel, for AR_VARIANTS / MK_VARIANTS entries with
# "EXE" (same-card before/after comparisons)
BASEPIDS=()
for entry in ${BASE_SRC:-}; do
  name=${entry%%=*}; dir=${entry#*=}
  build_engines "$dir" "/tmp/mkbase_$name" "device-$name" "" lucebench-ar lucebench-megakernel > "$OUT/build_$name.log" 2>&1 &
  BASEPIDS+=($!)
done
PYTHONPATH=. python3 scripts/device/check_megakernel.py synth || { echo "synth phase failed"; exit 1; }
if ! wait $BPID; then echo "build failed:"; grep -iE "error" "$OUT/build.log" | head -30; tail -30 "$OUT/build.log"; exit 1; fi
for pid in "${BASEPIDS[@]}"; do wait "$pid" || { echo "a BASE_SRC build failed"; tail -5 "$OUT"/build_*.log; exit 1; }; done
echo "build + synth + references: $(( $(date +%s) - t0 )) s"
grep -A2 "decode_kernel" "$OUT/build.log" | grep -E "registers|spill" | head -4
PYTHONPATH=. python3 scripts/device/check_megakernel.py run "$BUILD"
echo "total: $(( $(date +%s) - t0 )) s"
