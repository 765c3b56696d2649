#!/usr/bin/env bash
# Quantised GGUF weights on CUDA, on SYNTHETIC weights (see check_quant_gpu.py for what it does): the op check,
# 0.8B Q4_K_M CUDA-vs-CPU greedy tokens, 27B Q4_K_M `ar` decode / prefill / roofline, verify cost of B + 1 rows
# against a decode step, llama.cpp llama-bench on the same GGUF. Output under $OUT/gq/.
# Carry: .cache/llamacpp (the packed pinned llama.cpp source, as for check_llamacpp.sh).
#   OUT=/tmp/out scripts/device/check_quant_gpu.sh          (ARCH defaults to 90)
#   STAGE=build ...: only the builds (ours, llama.cpp's) and the synthetic GGUF files, for a warm machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export LUCEBENCH_BUILD_JOBS="${LUCEBENCH_BUILD_JOBS:-$(nproc)}"
mkdir -p "${OUT:-/tmp/out}/gq"
python3 scripts/device/check_quant_gpu.py 2>&1 | tee "${OUT:-/tmp/out}/gq/check_quant_gpu.log"
exit "${PIPESTATUS[0]}"
