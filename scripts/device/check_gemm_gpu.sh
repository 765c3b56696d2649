#!/usr/bin/env bash
# The tensor-core prefill GEMM (engines/core/cuda/gemm_tc.cu) on one CUDA card, before and after, in one run:
#   1. builds this tree (op check, GEMM bench, lucebench-ar) and, niced in the background, the engines of
#      main's commit 5ad8b41 (the kernels before gemm_tc: `git archive` when the checkout has git, else
#      .carry/gemm/engines-5ad8b41.tar.gz) with the same bench source; writes the synthetic full-shape
#      Qwen3.5-27B Q4_K_M GGUF meanwhile (SYNTHETIC: random weights)
#   2. lucebench-gpu-op-check: every GPU op against its CPU reference (gemm_tc: every weight type, n 9..4096)
#   3. lucebench-gemm-bench, after then before: TFLOP/s per 27B / 0.6B matrix shape and n (median of 15)
#   4. gemm_prefill.py: lucebench-ar's full prefill of the 27B GGUF at 512, 8192 and 32768 tokens, after then
#      before (bf16 KV; a length that would end past the deadline is skipped, one past 75 s killed)
# Output under $OUT/gemm/ (gpu_op_check.md, bench_{after,before}.md, bench_compare.md, prefill.json, logs);
# the key figures on stdout. ~7-8 min on a fresh H100 (builds ~3 min); finishes by GEMM_END_S (470 s).
#   usage: scripts/device/check_gemm_gpu.sh          (ARCH: 90)
set -uo pipefail
cd "$(dirname "$0")/../.."
ARCH=${ARCH:-90}
OUT=${OUT:-/tmp/lucebench-out}
O="$OUT/gemm"
mkdir -p "$O"
END_S=${GEMM_END_S:-470}
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
. scripts/device/wheels.sh
install_wheels .whl || { echo "wheel install failed (carry .whl)"; exit 1; }
export PYTHONPATH="/tmp/site:$PWD:$PWD/scripts/device" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 OUT="$O"
export LUCEBENCH_CACHE="${LUCEBENCH_CACHE:-$PWD/.cache/lucebench-device}"
. scripts/device/build_engines.sh
NEW=/tmp/lb-gemm-new OLD=/tmp/lb-gemm-old OLDSRC=/tmp/lb-gemm-old-src

# the synthetic 27B (background; ~15 s of CPU)
( ls /tmp/t27/*.gguf > /dev/null 2>&1 || python3 -m lucebench models synth --shape qwen3.5-27b --format gguf --quant q4_k_m --out /tmp/t27 ) \
  > "$O/synth.log" 2>&1 &
SYNTH=$!

# the old tree with this tree's bench source and its target
rm -rf "$OLDSRC" && mkdir -p "$OLDSRC"
if git rev-parse -q --verify 5ad8b41^{commit} > /dev/null 2>&1; then
  git archive 5ad8b41 engines | tar -x -C "$OLDSRC"
else
  tar -xzf .carry/gemm/engines-5ad8b41.tar.gz -C "$OLDSRC" || { echo "no 5ad8b41 source: carry .carry/gemm"; exit 1; }
fi
cp engines/tests/gemm_bench.cu "$OLDSRC/engines/tests/"
cat >> "$OLDSRC/engines/CMakeLists.txt" <<'CM'
add_executable(lucebench-gemm-bench tests/gemm_bench.cu)
target_link_libraries(lucebench-gemm-bench PRIVATE lucebench_core)
CM

build_engines engines "$NEW" gemm-after "" lucebench-gpu-op-check lucebench-gemm-bench lucebench-ar \
  > "$O/build_after.log" 2>&1 || { tail -40 "$O/build_after.log"; exit 1; }
echo "built (after) at $(elapsed) s"
# the old build niced in the background while the GPU runs the checks
( renice -n 10 -p $BASHPID > /dev/null 2>&1; build_engines "$OLDSRC/engines" "$OLD" 5ad8b41 "" lucebench-gemm-bench lucebench-ar ) \
  > "$O/build_before.log" 2>&1 &
OLDB=$!
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader | tee "$O/card.txt"
rc=0

stdbuf -oL "$NEW/lucebench-gpu-op-check" > "$O/gpu_op_check.md" 2>&1 || rc=1
grep -E "gemm_tc|FAIL|checks," "$O/gpu_op_check.md" | head -60
echo "op check done at $(elapsed) s (rc $rc)"

"$NEW/lucebench-gemm-bench" > "$O/bench_after.md" 2>&1 || { rc=1; tail -5 "$O/bench_after.md"; }
echo "bench (after) done at $(elapsed) s"
wait $OLDB || { echo "old build failed"; tail -20 "$O/build_before.log"; rc=1; }
echo "built (before) at $(elapsed) s"
if [ -x "$OLD/lucebench-gemm-bench" ]; then
  "$OLD/lucebench-gemm-bench" > "$O/bench_before.md" 2>&1 || { rc=1; tail -5 "$O/bench_before.md"; }
  echo "bench (before) done at $(elapsed) s"
fi
python3 - "$O" <<'PY' | tee "$O/bench_compare.md"
import sys
from pathlib import Path
o = Path(sys.argv[1])
def rows(name):
    p = o / name
    out = {}
    if p.exists():
        for line in p.read_text().splitlines():
            c = [x.strip() for x in line.strip("|").split("|")]
            if len(c) == 8 and c[4].isdigit():
                out[tuple(c[:6])] = (float(c[6]), float(c[7]))
    return out
a, b = rows("bench_after.md"), rows("bench_before.md")
print("| model | matrix | W | out x in | n | call | before ms | after ms | before TFLOP/s | after TFLOP/s | speedup |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for k, (ms, tf) in a.items():
    bm, bt = b.get(k, (float("nan"), float("nan")))
    print(f"| {' | '.join(k)} | {bm:.3f} | {ms:.3f} | {bt:.1f} | {tf:.1f} | {bm / ms:.2f}x |")
PY

wait $SYNTH
ls -la /tmp/t27 2>/dev/null | tail -3
GGUF=$(ls /tmp/t27/*.gguf 2>/dev/null | head -1)
left=$(( END_S - $(elapsed) ))
if [ "$left" -lt 60 ]; then
  echo "full prefill skipped: $left s left before GEMM_END_S ($END_S s)"
elif [ -n "$GGUF" ]; then
  BUILDS=(--build "after=$NEW")
  [ -x "$OLD/lucebench-ar" ] && BUILDS+=(--build "before=$OLD")
  echo "full prefill of the 27B (SYNTHETIC Q4_K_M), $left s left"
  python3 scripts/device/gemm_prefill.py --model "$GGUF" "${BUILDS[@]}" --lengths 512,8192,32768 \
    --out "$O/prefill.json" --deadline-s "$left" --limit-s 75 || rc=1
else
  echo "no 27B GGUF: see synth.log"; tail -5 "$O/synth.log"; rc=1
fi
echo "total $(elapsed) s, rc $rc"
exit $rc
