#!/usr/bin/env bash
# Run a lucebench config on a lent GPU machine whose python3 has torch and transformers but not all of
# lucebench's dependencies: those travel as wheels in .whl/ (carried with the call), made here with
#
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
#     pydantic pydantic_core annotated-types typing-inspection datasets dill multiprocess gguf typer rich
#
# (the versions of .venv, `pip list` there; the H200 image has the rest: numpy, pandas, matplotlib, scipy,
# pyarrow, fsspec, huggingface_hub, tokenizers, safetensors, nvidia-ml-py, jinja2, cmake). llama.cpp's source
# travels as .cache/llamacpp/llama.cpp-*.tar.xz: `python -m lucebench.baselines.llamacpp.packsrc pack
# .cache/llamacpp/llama.cpp-0c1e570.tar.xz`.
#
#   bash scripts/device/run_config.sh CONFIG RUN_DIR [lucebench run flags...]
#
# RUN_DIR should live inside the repository (e.g. .runs/h200) and be carried between calls, so that a
# later call can continue the same run with --resume. Results and the report are copied to $OUT.
set -uo pipefail
config=${1:?usage: run_config.sh CONFIG RUN_DIR [flags]}; run_dir=${2:?run dir}; shift 2
. scripts/device/wheels.sh
install_wheels .whl || { echo "wheel install failed (carry .whl)"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD
# Builds, GGUFs and synthetic models: a folder that a warm machine keeps between calls.
export LUCEBENCH_CACHE=${LUCEBENCH_CACHE:-$PWD/.devcache}
# The pinned llama.cpp source, carried as an archive (no network there): see docs/baselines.md.
src=$(ls "$PWD"/.cache/llamacpp/llama.cpp-*.tar.xz 2>/dev/null | head -1)
[ -n "$src" ] && export LUCEBENCH_LLAMACPP_SRC=$src
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 COLUMNS=160
# The evaluation sets (HumanEval, GSM8K, MATH-500), carried as .carry/datasets (no hub there).
[ -d .carry/datasets ] && export LUCEBENCH_DATA_DIR=${LUCEBENCH_DATA_DIR:-$PWD/.carry/datasets}
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,power.limit,power.default_limit,clocks.sm,clocks.mem,temperature.gpu --format=csv
python3 -m lucebench env --json > "$out/env.json" || echo "env failed"
# SIGINT at the limit: lucebench keeps every finished cell and stops its engine cleanly.
timeout -s INT "${RUN_TIMEOUT:-540}" python3 -m lucebench run "$config" --out "$run_dir" "$@"; rc=$?
python3 -m lucebench validate "$run_dir/results.json" > "$out/validate.txt" 2>&1; echo "validate exit $?"; tail -5 "$out/validate.txt"
cp "$run_dir/results.json" "$out/" 2>/dev/null
cp "$run_dir/report/report.md" "$out/" 2>/dev/null
tar czf "$out/run.tar.gz" -C "$(dirname "$run_dir")" "$(basename "$run_dir")" 2>/dev/null
exit $rc
