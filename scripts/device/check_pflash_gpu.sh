#!/usr/bin/env bash
# PFlash on one CUDA card. Stages (PFLASH_STAGES, comma-separated; default checks,ttft,sparse):
#   checks     lucebench-gpu-op-check         every GPU op against its CPU reference, with the Qwen3 (ungated)
#                                             attention kernels, the PFlash tail scores (tail_scores.cu) and the
#                                             block-sparse selection and attention on random inputs
#              lucebench-verify-gpu-check --qwen3   verify + commit == AR on a random Qwen3 model, verify outputs
#                                             against the CPU backend's, and the scored forward (importance)
#                                             against the CPU backend's over three prefill chunks
#              check_qwen3_gpu.py             Qwen3 dense on the CUDA backend against transformers'
#                                             Qwen3ForCausalLM: odd tiny shapes, the qwen3-0.6b shape (SYNTHETIC),
#                                             the trained reference drafter (TRAINED REFERENCE); the chunked
#                                             prefill of Qwen3.5 (the synthetic 0.8B, the trained reference
#                                             target) and its one pass, each against Qwen3_5ForCausalLM fp32
#   ttft       pflash_ttft.py                 TTFT at 32K, 64K and 128K, keep 0.05 (SYNTHETIC): full-shape
#                                             qwen3-0.6b drafter, full-shape synthetic Qwen3.5-0.8B target, every
#                                             phase timed, memory; against our own full prefill (lucebench-ar),
#                                             bf16 KV; the drafter's attention dense (--drafter-sparse-from 0)
#   sparse                                    the same with the drafter's block-sparse attention (the engine's
#                                             default: --drafter-sparse-from $PFLASH_SPARSE_FROM (32768),
#                                             --drafter-sparse-alpha $PFLASH_SPARSE_ALPHA (0.85), budget 0.1),
#                                             against the dense run's kept prompt (no full prefill)
#   prebuild                                  starts llama.cpp's CUDA build (.cache/llamacpp carried) niced in the
#                                             background and leaves it running, for a `big` call on the warm machine
#   big        pflash_ttft.py                 the 27B: full-shape synthetic Qwen3.5-27B Q4_K_M GGUF target (written
#                                             here, ~15 s), the same drafter, TTFT at 64K and 128K keep 0.05, against
#                                             our own full prefill of the 27B and llama.cpp's (llama-bench -p L
#                                             -n 0 -fa 1, bf16 K/V as ours, -b/-ub 2048) on the same GGUF; all of it
#                                             by $PFLASH_END_S (520 s) after the start: see pflash_ttft.py
#                                             --deadline-s for what is skipped or cut. The drafter's attention is
#                                             the engine's default, block-sparse from 32,768 tokens
#                                             ($PFLASH_BIG_SPARSE_FROM; 0: dense; the drafter's forward time does
#                                             not depend on the target: stages ttft and sparse have both)
#   retention  pflash_retention.py            needle retention on the trained reference models on the GPU (TRAINED
#                                             REFERENCE), 8K, 16K and 32K, every needle suite, keep 0.05 and 0.1
#                                             (needs the wheels: carry .carry/pg); every length with the
#                                             answer probe: scripts/device/check_pflash_retention_gpu.sh
#   quant                                     TTFT with q4_0 KV ($PFLASH_KV) at 64K and 128K, against the full
#                                             prefill; the drafter's attention the engine's default (block-sparse)
#   drafterkv  pflash_ttft.py                 the drafter's own KV type: the target's KV q8_0 at 64K and 128K,
#                                             the drafter's cache bf16 (--drafter-kv, the default) and then q8_0;
#                                             drafter forward ms each way (no full prefill; ~1.5 min warm)
# The build and the synthetic checkpoints are reused on a warm machine. The calls:
#   PFLASH_STAGES=checks,ttft,sparse,prebuild scripts/device/check_pflash_gpu.sh   (fresh machine, ~5-7 min)
#   PFLASH_STAGES=big scripts/device/check_pflash_gpu.sh               (next, warm machine: <= 9 min, guarded)
#   PFLASH_STAGES=retention scripts/device/check_pflash_gpu.sh         (~3 min on a warm machine)
#   PFLASH_STAGES=checks,drafterkv scripts/device/check_pflash_gpu.sh  (fresh machine, ~5-6 min)
# In one call, retention is skipped when it would start after $PFLASH_BUDGET_S (330 s), quant after
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
. scripts/device/wheels.sh
install_wheels .carry/pg/whl .whl || true
BUDGET=${PFLASH_BUDGET_S:-330}              # retention runs only if started before this
BUDGET_QUANT=${PFLASH_BUDGET_QUANT_S:-390}   # the quantised-KV TTFT only if started before this
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
STAGES=",${PFLASH_STAGES:-checks,ttft,sparse},"
want() { [[ "$STAGES" == *",$1,"* ]]; }
. scripts/device/build_engines.sh
B=/tmp/lb-pflash-build
DRAFTER=/tmp/lb-qwen3-check/qwen3-0.6b
TARGET=${PFLASH_TARGET:-/tmp/qwen35-0.8b-synth}

GGUF27=/tmp/lb-qwen35-27b-q4km/model-q4_k_m.gguf
LLAMA_SRC=.cache/llamacpp/llama.cpp-0c1e570.tar.xz
# the synthetic checkpoints while the engines build: the 0.8B unless only `big` runs, the drafter, and the
# 27B Q4_K_M GGUF (written directly, as llama.cpp's recipe types it) for `big`
synth_27b() {
  [ -f "$GGUF27" ] && return 0
  python3 - <<PY
import sys
from pathlib import Path
try:
    import gguf  # noqa: F401
except ImportError:  # the device image may lack it: the llama.cpp source's gguf-py
    from lucebench.baselines.llamacpp.source import locate_source
    sys.path.insert(0, str(locate_source(Path("$LLAMA_SRC")).root / "gguf-py"))
from lucebench.models.gguf_synth import synthesize_gguf
from lucebench.models.shapes import get_shape
r = synthesize_gguf(get_shape("qwen3.5-27b"), Path("$(dirname "$GGUF27")"), quant="q4_k_m", seed=0)
print(f"wrote SYNTHETIC qwen3.5-27b Q4_K_M: {r.path}, {r.weight_bytes / 1e9:.2f} GB in {r.seconds:.1f} s, {r.types}")
assert Path(r.path) == Path("$GGUF27"), r.path
PY
}
( { [ "$STAGES" = ",big," ] || synth_08b; } && { [ -f "$DRAFTER/config.json" ] || python3 -c "
from pathlib import Path
from lucebench.models.shapes import get_shape
from lucebench.models.synth import synthesize
synthesize(get_shape('qwen3-0.6b'), Path('$DRAFTER'), seed=0, dtype='bf16')"; } && { ! want big || synth_27b; } ) \
  > "$O/synth.log" 2>&1 &
SYNTH=$!
# llama.cpp's CUDA build (for `big`, or for a later `big` call on this machine): niced, in the background and
# left running (its cache is locked and keyed: `big` picks it up finished, or waits for it). It overlaps our
# build and the GPU-bound stages.
if { want prebuild || want big; } && [ -f "$LLAMA_SRC" ]; then
  nohup nice -n 15 python3 -c "from lucebench.baselines.llamacpp.build import build_llamacpp
build_llamacpp(backend='cuda', arch='$ARCH', source='$LLAMA_SRC')" > "$O/llamacpp_prebuild.log" 2>&1 &
  echo "llama.cpp build started in the background (log: llamacpp_prebuild.log)"
elif want prebuild || want big; then
  echo "no $LLAMA_SRC: carry .cache/llamacpp for llama.cpp's build"
fi
TARGETS=(lucebench-ar lucebench-pflash)
want checks && TARGETS+=(lucebench-gpu-op-check lucebench-verify-gpu-check)
build_engines engines "$B" pflash "" "${TARGETS[@]}" > "$O/build.log" 2>&1 || { tail -40 "$O/build.log"; exit 1; }
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
want ttft && ttft bf16 bf16 "$LENGTHS" "${LLAMA[@]}" --pflash-flags="--drafter-sparse-from 0"
# the drafter's block-sparse attention (--drafter-sparse-*): TTFT, and how much of the dense run's kept prompt
# it keeps
want sparse && ttft bf16-sparse bf16 "$LENGTHS" --no-full-prefill --compare "$O/ttft-bf16/pflash_ttft.json" \
  --pflash-flags="--drafter-sparse-from ${PFLASH_SPARSE_FROM:-32768} --drafter-sparse-alpha ${PFLASH_SPARSE_ALPHA:-0.85}"

if want big; then
  # everything by PFLASH_END_S after the start (the call's hard limit is 540 s)
  left=$(( ${PFLASH_END_S:-520} - $(elapsed) ))
  python3 scripts/device/pflash_ttft.py --build "$B" --drafter "$DRAFTER" --target "$GGUF27" --out "$O/ttft-27b" \
    --kv bf16 --lengths "${PFLASH_LENGTHS_27B:-65536,131072}" --warmup-length 32768 --llama-bench \
    --llama-ubatch "${PFLASH_LLAMA_UBATCH:-2048}" --deadline-s "$left" \
    --pflash-flags="--drafter-sparse-from ${PFLASH_BIG_SPARSE_FROM:-32768}" \
    --label "SYNTHETIC (random weights, random token ids): full-shape Qwen3.5-27B Q4_K_M GGUF target" \
    2>&1 | tee "$O/ttft-27b.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  echo "ttft 27b done at $(elapsed) s"
fi

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

if want drafterkv; then
  DKV_LENGTHS=${PFLASH_LENGTHS_DKV:-65536,131072}
  ttft q8_0-drafter-bf16 q8_0 "$DKV_LENGTHS" --no-full-prefill
  ttft q8_0-drafter-q8_0 q8_0 "$DKV_LENGTHS" --no-full-prefill --pflash-flags="--drafter-kv q8_0"
  echo "drafter forward ms, target KV q8_0 (drafter KV bf16, then q8_0):"
  grep -h "pflash L=" "$O/ttft-q8_0-drafter-bf16.log" "$O/ttft-q8_0-drafter-q8_0.log"
fi

for kv in $(echo "${PFLASH_KV:-q4_0}" | tr , ' '); do
  want quant || break
  if [ "$(elapsed)" -gt "$BUDGET_QUANT" ]; then echo "skipped TTFT with $kv KV: $(elapsed) s used"; continue; fi
  ttft "$kv" "$kv" "${PFLASH_LENGTHS_QUANT:-65536,131072}" "${LLAMA[@]}"
done
echo "total $(elapsed) s, rc $rc"
exit $rc
