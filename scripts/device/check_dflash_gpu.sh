#!/usr/bin/env bash
# lucebench-dflash on one card (about 6 minutes on an H100 with every part: build 2-3, checks 3-4). Builds the
# CUDA engines and the checks, then runs the parts named in PARTS (default: all of them, in this order):
#   kernels         lucebench-dflash-gpu-check: the GPU draft's kernels (draft_attention, draft_top_k, gather)
#                   against their CPU references on random inputs, and the whole GPU draft forward against
#                   DraftModelCpu (the trained reference draft, also as a Q8_0 GGUF, and a random 0.8B-shape
#                   draft);
#                   lucebench-verify-kernels-check: the verify kernels with q8_0 / q4_0 KV rows;
#                   lucebench-verify-gpu-check: GPU verify + commit == AR (scripted trees), also with q8_0 KV
#   lossless-synth  SYNTHETIC: dflash == ar greedy on full-shape synthetic Qwen3.5-0.8B, chain and tree at
#                   budgets 8/22/40, KV bf16 and q8_0 (first divergence otherwise)                    (~1 min)
#                   DFLASH_LOSSLESS_TARGET / DFLASH_LOSSLESS_DRAFT: another target (e.g. the 27B Q4_K_M GGUF)
#   reference       TRAINED REFERENCE: the fixture pair on scripts/device/dflash_reference_prompts.json (4 a
#                   set): lossless, AL chain vs tree at budget 22, against the CPU engine's AL and outputs
#                   (scripts/device/dflash_reference_cpu.json, made on a CPU)                         (~10 s)
#   reference-al    TRAINED REFERENCE, the real-acceptance check: the prompts, n_gen and stop ids of
#                   the Python reference loop (the fixtures' reference_al.json; datasets from .carry/datasets):
#                   chain AL per dataset against the loop's (bound 5%), DDTree at budgets 8/16/22/32/40 against
#                   the chain at the same budget, lossless per prompt, tok/s against ar      (~1 min)
#   speed           SYNTHETIC, FORCED ACCEPTANCE: ar tok/s against dflash at a forced AL of 8.31, draft /
#                   verify ms per budget                                                              (~40 s)
#   gguf-draft      TRAINED REFERENCE: the fixture draft as BF16 / Q8_0 GGUF (`models convert-draft`): BF16
#                   identical to the safetensors draft (tokens and rounds), Q8_0 identical to the F32 GGUF of
#                   its decoded values, chain and tree 22; AL of each                                 (~20 s)
# e.g. PARTS="reference-al" bash scripts/device/check_dflash_gpu.sh   (build + that part: about 3-4 minutes)
# Options (environment): DFLASH_TARGET (a Qwen3.5 checkpoint folder or GGUF for the speed part; default the
# synthetic 0.8B), DFLASH_DRAFT (its draft; default a random one from `models synth --draft-for`, which needs
# a folder with config.json: give DFLASH_DRAFT with a GGUF target), DFLASH_BUDGETS (default 8,15,22,32,40; 15 is
# the chain), DFLASH_N_GEN (default 256), DFLASH_DATASETS (reference-al's datasets folder), DFLASH_REF_PROMPTS
# (reference-al: the first N prompts a set only).
# Output in $OUT/dg/ (summary.md, JSON per part, reference_al.md, the card's name).
# usage: [PARTS="..."] scripts/device/check_dflash_gpu.sh
set -uo pipefail
ARCH=${ARCH:-90}
OUT=${OUT:-/tmp/lucebench-out}
DEST="$OUT/dg"
mkdir -p "$DEST"
. scripts/device/build_engines.sh
BUILD=/tmp/lb-dflash-build
t0=$(date +%s)
PARTS=${PARTS:-kernels lossless-synth reference reference-al speed gguf-draft}
targets=(lucebench-ar lucebench-dflash)
[[ " $PARTS " == *" kernels "* ]] && targets+=(lucebench-dflash-gpu-check lucebench-verify-kernels-check lucebench-verify-gpu-check)
build_engines engines "$BUILD" dflash "" "${targets[@]}" > "$DEST/build.log" 2>&1 || { tail -40 "$DEST/build.log"; exit 1; }
echo "built in $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$DEST/card.txt"
{ git rev-parse HEAD 2>/dev/null || echo "(no git)"; date -u; } > "$DEST/provenance.txt"
export PYTHONPATH=.:tests/engines${PYTHONPATH:+:$PYTHONPATH}  # keeps the carried wheels (wheels.sh) where a caller installed them
# The synthetic 0.8B and its random draft: for the kernels, lossless-synth and (by default) speed parts.
if [[ " $PARTS " =~ \ (kernels|lossless-synth|speed)\  ]]; then
  synth_08b || { echo "synthetic 0.8B checkpoint: FAILED"; exit 1; }
  python3 -c "from pathlib import Path; from lucebench.models.dflash_draft import synthesize_draft as s; \
s(Path('/tmp/qwen35-0.8b-synth'), Path('/tmp/dflash-0.8b-synth-draft'), seed=1)" || { echo "random draft: FAILED"; exit 1; }
fi
rc=0
if [[ " $PARTS " == *" kernels "* ]]; then
  # The trained reference draft as a Q8_0 GGUF too: the GPU forward of a GGUF draft (decoded at load) against
  # DraftModelCpu's of the same file.
  gguf_drafts=()
  python3 -c "from pathlib import Path; from lucebench.models.dflash_gguf import convert_draft as c; \
c(Path('tests/fixtures/reference-models/draft'), Path('/tmp/dflash-ref-draft-q8_0.gguf'), wtype='q8_0')" \
    && gguf_drafts=(/tmp/dflash-ref-draft-q8_0.gguf) || { echo "GGUF draft conversion: FAILED"; rc=1; }
  stdbuf -oL "$BUILD/lucebench-dflash-gpu-check" tests/fixtures/reference-models/draft /tmp/dflash-0.8b-synth-draft \
    ${gguf_drafts[@]+"${gguf_drafts[@]}"} > "$DEST/dflash_gpu_check.txt" 2>&1 || rc=1
  cat "$DEST/dflash_gpu_check.txt"
  stdbuf -oL "$BUILD/lucebench-verify-kernels-check" > "$DEST/verify_kernels_check.txt" 2>&1 || rc=1
  tail -4 "$DEST/verify_kernels_check.txt"
  grep -E "FAIL" "$DEST/verify_kernels_check.txt" | head -10
  stdbuf -oL "$BUILD/lucebench-verify-gpu-check" > "$DEST/verify_gpu_check.txt" 2>&1 || rc=1
  tail -12 "$DEST/verify_gpu_check.txt"
  echo "  (kernels: done at $(( $(date +%s) - t0 )) s)"
fi
parts=()
for p in $PARTS; do [ "$p" != kernels ] && parts+=(--part "$p"); done
baseline=()
[ -f scripts/device/dflash_reference_cpu.json ] && baseline=(--cpu-baseline scripts/device/dflash_reference_cpu.json)
if [ ${#parts[@]} -gt 0 ]; then
  OUT="$DEST" stdbuf -oL python3 scripts/device/check_dflash_gpu.py --build "$BUILD" --out "$DEST" "${parts[@]}" \
    ${baseline[@]+"${baseline[@]}"} || rc=1
fi
echo "total $(( $(date +%s) - t0 )) s"
exit $rc
