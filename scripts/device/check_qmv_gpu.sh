#!/usr/bin/env bash
# The quantised decode GEMV (qmv_kernel: at most one round of resident blocks, warps over groups of rows, L2
# asks a step ahead; the decode step's RMSNorms and the MLP's silu_mul folded into it) and qmma_kernel's
# earlier weight requests, before (BEFORE_COMMIT, default 40da252: main with the split-KV attention, from
# .carry/qmv/before/engines when its COMMIT matches, else git archive) against after (this tree) on one card:
# check_dec_gpu.py's sequence, output under $OUT/qmv/. The op check (qmv at the 27B shapes, the folds against
# the CPU reference and bitwise against the unfused GPU kernels), --time-quant of both builds (GB/s before /
# after, time_quant_cmp.md), 0.8B and 27B greedy tokens before = after (the folds and the grid change no
# sums: they must be identical), 27B ar decode median of 5 + roofline %, DFlash PARTS=speed at forced AL 8.31
# (budgets 8, 22), verify B = 22 / step, the CUPTI step of both builds as time allows; a before/after table
# last (table.md). SYNTHETIC weights: speed figures only. About 7-8 minutes on a fresh H100.
#   OUT=/tmp/out bash scripts/device/check_qmv_gpu.sh        (ARCH defaults to 90)
set -euo pipefail
cd "$(dirname "$0")/../.."
export DEC_NAME=qmv BEFORE_COMMIT="${BEFORE_COMMIT:-40da252}" DEADLINE_S="${DEADLINE_S:-400}"
exec bash scripts/device/check_dec_gpu.sh
