#!/usr/bin/env bash
# Prefill attention on one CUDA card (H100/H200), ~6-8 min on a fresh machine: the TTFT stage ends by 480 s
# (FA_END_S), everything by 520 s.
#   1. build lucebench-gpu-op-check, lucebench-attention-bench, lucebench-pflash, lucebench-ar (the synthetic checkpoints are
#      written meanwhile: the full-shape qwen3-0.6b drafter and the full-shape Qwen3.5-0.8B target, SYNTHETIC)
#   2. lucebench-gpu-op-check: every GPU op against its CPU reference; here the prefill attention kernels
#      (flash_attention_kernel: GQA 1/2/3/6, hd 128/256, bf16/q8_0/q4_0 caches, chunks at pos0 > 0) and the
#      block-sparse selection with and without the budget              -> fa/gpu_op_check.md
#   3. lucebench-attention-bench: one attention layer over L tokens in 8192-row chunks, median of 5 after
#      warm-up; the drafter's shape (Qwen3-0.6B: 16 / 8 heads of 128, no gate) at 8K/32K/64K/128K, the new
#      kernel (flash) against the one it replaces (wmma) in the same binary, and block-sparse flash at budgets
#      1 (upstream's alpha rule alone), 0.25, 0.10, 0.05 on random inputs; the 27B's full-attention shape
#      (24 / 4 heads of 256, gated) at 4K/32K against attention_kernel, which served G = 6 before
#                                                                        -> fa/attention_bench.jsonl
#   4. PFlash TTFT split by phase, SYNTHETIC drafter and target, bf16 KV, keep 0.05, 32K/64K/128K: the dense
#      drafter (--drafter-sparse-from 0), then block-sparse (from 32768, alpha 0.85) at budget $FA_BUDGET (10%)
#                                                                        -> fa/ttft-*.log, fa/ttft-*.json
#   5. if time is left (by 520 s): lucebench-ar's Qwen3 against transformers (check_qwen3_gpu.py)
# Key figures go to stdout; 8 files under $OUT/fa. usage: scripts/device/check_attention_gpu.sh   (ARCH: 90; OUT: output root)
set -uo pipefail
cd "$(dirname "$0")/../.."
ARCH=${ARCH:-90}
OUT=${OUT:-/tmp/lucebench-out}
O="$OUT/fa"
mkdir -p "$O"
export PYTHONPATH="$PWD:$PWD/scripts/device${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export LUCEBENCH_CACHE="${LUCEBENCH_CACHE:-$PWD/.cache/lucebench-device}" HF_HUB_OFFLINE=1
. scripts/device/wheels.sh
install_wheels .carry/fa/whl .carry/pg/whl .whl || true
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
END_S=${FA_END_S:-480}
. scripts/device/build_engines.sh
B=/tmp/lb-fa-build
DRAFTER=/tmp/lb-qwen3-check/qwen3-0.6b
TARGET=/tmp/qwen35-0.8b-synth

( synth_08b && { [ -f "$DRAFTER/config.json" ] || python3 -c "
from pathlib import Path
from lucebench.models.shapes import get_shape
from lucebench.models.synth import synthesize
synthesize(get_shape('qwen3-0.6b'), Path('$DRAFTER'), seed=0, dtype='bf16')"; } ) > /tmp/fa-synth.log 2>&1 &
SYNTH=$!
build_engines engines "$B" fa "" lucebench-gpu-op-check lucebench-attention-bench lucebench-pflash lucebench-ar \
  > /tmp/fa-build.log 2>&1 || { tail -40 /tmp/fa-build.log; exit 1; }
echo "built in $(elapsed) s"
{ git rev-parse HEAD 2>/dev/null || echo "(no git)"; date -u
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader; } | tee "$O/card.txt"
rc=0

# 2. the op check
stdbuf -oL "$B/lucebench-gpu-op-check" > "$O/gpu_op_check.md" 2>&1 || rc=1
grep -E "^\| attention |block_sparse|FAIL|checks," "$O/gpu_op_check.md"
echo "op check done at $(elapsed) s"

# 3. the micro-benchmark
J="$O/attention_bench.jsonl"
: > "$J"
bench() { timeout 150 "$B/lucebench-attention-bench" --json "$J" "$@" 2>&1 | grep -v '^{'; }
bench --nh 16 --nkv 8 --hd 128 --gated 0 --L 8192,32768,65536,131072 --kernels flash,wmma --budgets 1,0.25,0.1,0.05 \
  --reps 5 || rc=1
bench --nh 24 --nkv 4 --hd 256 --gated 1 --L 4096 --kernels flash,rows --reps 3 || rc=1
bench --nh 24 --nkv 4 --hd 256 --gated 1 --L 32768 --kernels flash --reps 5 || rc=1
python3 - "$J" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("\n| shape | L | kernel | budget | ms | TFLOP/s (causal FLOPs / time) | key tiles read |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    shape = f"{r['nh']}/{r['nkv']}x{r['hd']}{' gated' if r['gated'] else ''}"
    b = f"{r['budget']:.2f}" if r["budget"] > 0 else "dense"
    print(f"| {shape} | {r['L']} | {r['kernel']} | {b} | {r['ms']:.1f} | {r['tflops']:.1f} | {r['kept_tiles']:.3f} |")
PY
echo "bench done at $(elapsed) s"

# 4. PFlash TTFT by phase (the drafter's attention is the new kernel; dense, then block-sparse with the budget)
wait $SYNTH || { echo "synthesis failed"; tail -20 /tmp/fa-synth.log; exit 1; }
ttft() {  # NAME [pflash_ttft.py flags]
  local name=$1
  shift
  local left=$(( END_S - $(elapsed) ))
  if [ "$left" -lt 40 ]; then echo "skipped ttft $name: $(elapsed) s used"; return; fi
  python3 scripts/device/pflash_ttft.py --build "$B" --drafter "$DRAFTER" --target "$TARGET" --out "/tmp/fa-ttft-$name" \
    --kv bf16 --lengths "${FA_LENGTHS:-32768,65536,131072}" --no-full-prefill --deadline-s "$left" "$@" \
    2>&1 | tee "$O/ttft-$name.log" | grep -E "pflash L=|skipped|fit|Error|error"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  cp "/tmp/fa-ttft-$name/pflash_ttft.json" "$O/ttft-$name.json" 2>/dev/null
  echo "ttft $name done at $(elapsed) s"
}
ttft dense --pflash-flags="--drafter-sparse-from 0"
ttft "sparse-b${FA_BUDGET:-10}" --compare /tmp/fa-ttft-dense/pflash_ttft.json --pflash-flags="--drafter-sparse-from 32768 \
--drafter-sparse-alpha 0.85 --drafter-sparse-budget $(awk "BEGIN { print ${FA_BUDGET:-10} / 100 }")"
# 5. end to end, if time is left: lucebench-ar's Qwen3 (the drafter's architecture; prefill through the new
# kernel from 16 rows) against transformers' Qwen3ForCausalLM: odd tiny shapes, the qwen3-0.6b shape, the trained
# reference drafter (check_qwen3_gpu.py)                                 -> fa/qwen3_vs_transformers.log
left=$(( END_S + 40 - $(elapsed) ))
if [ "$left" -gt 60 ]; then
  timeout "$left" python3 scripts/device/check_qwen3_gpu.py "$B" /tmp/fa-qwen3.json > "$O/qwen3_vs_transformers.log" 2>&1
  r=$?
  tail -15 "$O/qwen3_vs_transformers.log"
  [ "$r" = 0 ] || { rc=1; echo "check_qwen3_gpu.py: rc $r"; }
else
  echo "skipped check_qwen3_gpu.py: $(elapsed) s used"
fi
echo "total $(elapsed) s, rc $rc"
exit $rc
