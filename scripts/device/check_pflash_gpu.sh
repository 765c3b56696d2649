#!/usr/bin/env bash
# PFlash on one CUDA card (about 6-7 minutes on an H100): builds lucebench-ar, lucebench-pflash and the op check,
# then
#   1. lucebench-gpu-op-check         every GPU op against its CPU reference, with the Qwen3 (ungated) attention
#                                     kernels and the PFlash tail scores (tail_scores.cu) on random inputs
#      lucebench-verify-gpu-check --qwen3   verify + commit == AR on a random Qwen3 model, verify outputs against the
#                                     CPU backend's, and the scored forward (importance) against the CPU backend's
#                                     over three prefill chunks (LB_GPU_PREFILL_CHUNK=256)
#   2. check_qwen3_gpu.py             Qwen3 dense on the CUDA backend against transformers' Qwen3ForCausalLM:
#                                     odd tiny shapes, the qwen3-0.6b shape (SYNTHETIC), the trained reference
#                                     drafter (TRAINED REFERENCE); greedy tokens to the first near-tie, logits error
#   3. pflash_ttft.py                 TTFT at 32K, 64K and 128K, keep 0.05 (SYNTHETIC): a full-shape qwen3-0.6b
#                                     drafter and the target $PFLASH_TARGET (default: full-shape synthetic
#                                     Qwen3.5-0.8B), every phase timed, memory; against our own full prefill of the
#                                     target (lucebench-ar), bf16 KV; llama.cpp's llama-bench on the same file when
#                                     PFLASH_LLAMA=1 and the target is a .gguf (.cache/llamacpp carried; its build
#                                     takes minutes)
#   3b.                               the same with the drafter's block-sparse attention (LB_PFLASH_SPARSE_FROM
#                                     32768, alpha 0.85), and the share of the dense run's kept prompt it keeps
#   4. pflash_retention.py            needle retention on the trained reference models on the GPU (TRAINED
#                                     REFERENCE), 8K, 16K and 32K, every needle suite, keep 0.05 and 0.1
#   5.                                TTFT with q4_0 KV ($PFLASH_KV) at 64K and 128K, against the full prefill
# PFLASH_STAGES picks stages (default checks,ttft,sparse,retention,quant: 1-2, 3, 3b, 4, 5); the build and the
# synthetic checkpoints are reused on a warm machine, so two calls can split the work, e.g.
#   PFLASH_STAGES=checks,ttft,sparse scripts/device/check_pflash_gpu.sh      (~6 min: build, checks, TTFT)
#   PFLASH_STAGES=retention,quant scripts/device/check_pflash_gpu.sh         (~4 min on the warm machine)
# In one call, stage 4 is skipped when it would start after $PFLASH_BUDGET_S (330 s), stage 5 after
# $PFLASH_BUDGET_QUANT_S (390 s). Output under $OUT/pg/.   usage: scripts/device/check_pflash_gpu.sh (ARCH: 90)
set -uo pipefail
cd "$(dirname "$0")/../.."
ARCH=${ARCH:-90}
OUT=${OUT:-/tmp/lucebench-out}
O="$OUT/pg"
mkdir -p "$O"
export PYTHONPATH="$PWD:$PWD/scripts/device${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 OUT="$O"
export LUCEBENCH_CACHE="${LUCEBENCH_CACHE:-$PWD/.cache/lucebench-device}" HF_HUB_OFFLINE=1
# lucebench's suites (stage 4) need pydantic and friends, which the device image lacks: wheels carried as
# .carry/pg/whl/ or .whl/ (run_config.sh says how they are made)
for w in .carry/pg/whl .whl; do
  if [ -d "$w" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$w"/*.whl \
      && export PYTHONPATH="/tmp/site:$PYTHONPATH"
    break
  fi
done
BUDGET=${PFLASH_BUDGET_S:-330}              # retention runs only if started before this
BUDGET_QUANT=${PFLASH_BUDGET_QUANT_S:-390}   # the quantised-KV TTFT only if started before this
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
STAGES=",${PFLASH_STAGES:-checks,ttft,sparse,retention,quant},"
want() { [[ "$STAGES" == *",$1,"* ]]; }
. scripts/device/build_engines.sh
B=/tmp/lb-pflash-build
DRAFTER=/tmp/lb-qwen3-check/qwen3-0.6b
TARGET=${PFLASH_TARGET:-/tmp/qwen35-0.8b-synth}

# the synthetic checkpoints while the engines build
( synth_08b && { [ -f "$DRAFTER/config.json" ] || python3 -c "
from pathlib import Path
from lucebench.models.shapes import get_shape
from lucebench.models.synth import synthesize
synthesize(get_shape('qwen3-0.6b'), Path('$DRAFTER'), seed=0, dtype='bf16')"; } ) > "$O/synth.log" 2>&1 &
SYNTH=$!
build_engines engines "$B" pflash "" lucebench-ar lucebench-pflash lucebench-gpu-op-check lucebench-verify-gpu-check \
  > "$O/build.log" 2>&1 \
  || { tail -40 "$O/build.log"; exit 1; }
echo "built in $(elapsed) s"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$O/card.txt"
rc=0

if want checks; then
  stdbuf -oL "$B/lucebench-gpu-op-check" > "$O/gpu_op_check.md" 2>&1 || rc=1
  grep -E "tail_scores|block_sparse|no gate|FAIL|checks," "$O/gpu_op_check.md"
  echo "op check done at $(elapsed) s"
  LB_GPU_PREFILL_CHUNK=256 stdbuf -oL "$B/lucebench-verify-gpu-check" --qwen3 > "$O/verify_gpu_check_qwen3.txt" 2>&1 || rc=1
  cat "$O/verify_gpu_check_qwen3.txt"
fi

wait $SYNTH || { echo "synthesis failed"; tail -20 "$O/synth.log"; exit 1; }
if want checks; then
  python3 scripts/device/check_qwen3_gpu.py "$B" "$O/qwen3_vs_transformers.json" 2>&1 | tee "$O/qwen3_vs_transformers.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  echo "qwen3 check done at $(elapsed) s"
fi

LLAMA=()
[ "${PFLASH_LLAMA:-0}" = 1 ] && LLAMA=(--llama-bench)
ttft() {  # NAME KV LENGTHS [more pflash_ttft.py flags]
  local name=$1 kv=$2 lengths=$3
  shift 3
  python3 scripts/device/pflash_ttft.py --build "$B" --drafter "$DRAFTER" --target "$TARGET" --out "$O/ttft-$name" \
    --kv "$kv" --lengths "$lengths" "$@" 2>&1 | tee "$O/ttft-$name.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  echo "ttft $name done at $(elapsed) s"
}
LENGTHS=${PFLASH_LENGTHS:-32768,65536,131072}
want ttft && ttft bf16 bf16 "$LENGTHS" "${LLAMA[@]}"
# the drafter's block-sparse attention (LB_PFLASH_SPARSE_FROM): TTFT, and how much of the dense run's kept
# prompt it keeps
want sparse && LB_PFLASH_SPARSE_FROM=${PFLASH_SPARSE_FROM:-32768} LB_PFLASH_SPARSE_ALPHA=${PFLASH_SPARSE_ALPHA:-85} \
  ttft bf16-sparse bf16 "$LENGTHS" --no-full-prefill --compare "$O/ttft-bf16/pflash_ttft.json"

if ! want retention; then
  :
elif [ "$(elapsed)" -gt "$BUDGET" ]; then
  echo "skipped retention: $(elapsed) s used"
elif ! python3 -c "import lucebench.suites.loader" 2> "$O/retention-import.log"; then
  echo "skipped retention: lucebench.suites does not import here (carry .whl/): $(tail -1 "$O/retention-import.log")"
else
  R=tests/fixtures/reference-models
  timeout $(( ${PFLASH_RETENTION_END_S:-470} - $(elapsed) )) python3 scripts/pflash_retention.py --exe "$B/lucebench-pflash" --backend cuda \
    --target "$R/target" --drafter "$R/drafter" --lengths "${PFLASH_RETENTION_LENGTHS:-8192,16384,32768}" \
    --keeps 0.05,0.1 --answer-suites needle --out "$O/retention-trained-reference.json" > "$O/retention.log" 2>&1 || rc=1
  python3 scripts/pflash_retention.py --summarize "$O/retention-trained-reference.json" | tee "$O/retention-summary.md"
  echo "retention done at $(elapsed) s"
fi

for kv in $(echo "${PFLASH_KV:-q4_0}" | tr , ' '); do
  want quant || break
  if [ "$(elapsed)" -gt "$BUDGET_QUANT" ]; then echo "skipped TTFT with $kv KV: $(elapsed) s used"; continue; fi
  ttft "$kv" "$kv" "${PFLASH_LENGTHS_QUANT:-65536,131072}" "${LLAMA[@]}"
done
echo "total $(elapsed) s, rc $rc"
exit $rc
