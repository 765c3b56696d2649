#!/usr/bin/env bash
# GPU check of the llama.cpp baseline on the device machine (see check_llamacpp.py for what it does).
# Carry: .cache/llamacpp (the stripped pinned source, ~8 MB), made here with
#   .venv/bin/python -m lucebench.baselines.llamacpp.packsrc pack .cache/llamacpp/llama.cpp-0c1e570.tar.xz
# STAGE=build stops after the CUDA build (a warm machine keeps .cache/lucebench-device for the next call).
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export LUCEBENCH_BUILD_JOBS="${LUCEBENCH_BUILD_JOBS:-$(nproc)}"
mkdir -p "${OUT:-/tmp/out}"
python3 scripts/device/check_llamacpp.py 2>&1 | tee "${OUT:-/tmp/out}/check_llamacpp.log"
