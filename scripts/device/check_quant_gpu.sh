#!/usr/bin/env bash
# Quantised GGUF weights on CUDA, on SYNTHETIC weights (see check_quant_gpu.py for what it does): the op check,
# per-matrix GEMV/GEMM times (qmv_kernel / qmma_kernel against qgemv/qgemm), 0.8B Q4_K_M CUDA-vs-CPU greedy
# tokens (at a divergence: whether the reference's top-2 margin was a near-tie), 27B Q4_K_M `ar` decode tok/s +
# roofline %, the per-kernel breakdown of a 27B decode step (CUPTI), prefill, verify cost of B + 1 rows
# (B = 1, 8, 16, 22, 32, 64) against a decode step and against the figures before qmv_kernel (ed4dc58, H200),
# llama.cpp llama-bench on the same GGUF (only if its build is done and 330 s have not gone). About 6 minutes on
# a fresh machine. Output under $OUT/gq/. Two builds before/after on one card: check_dec_gpu.sh.
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
