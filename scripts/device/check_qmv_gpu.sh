#!/usr/bin/env bash
# The quantised decode GEMV (qmv_kernel: one round of resident blocks, warps over groups of rows, and the
# decode step's RMSNorms folded into it), before (BEFORE_COMMIT, default 9098bc0: .carry/qmv/before/engines
# when carried, else git archive) against after (this tree) on one card. check_dec_gpu.py's sequence with its
# output under $OUT/qmv/: the op check (qmv, qmv + rmsnorm: against the CPU reference and bitwise against the
# unfused GPU path), --time-quant per matrix, 0.8B and 27B greedy tokens before = after (the fold and the
# grid change no sums: they must be identical), 27B ar decode median of 5 + roofline %, DFlash PARTS=speed at
# forced AL 8.31 (budgets 8, 22), verify B = 22 / step, the CUPTI step of both builds as time allows; a
# before/after table at the end (table.md). SYNTHETIC weights: speed figures only. About 7-8 minutes.
#   OUT=/tmp/out bash scripts/device/check_qmv_gpu.sh        (ARCH defaults to 90)
set -euo pipefail
cd "$(dirname "$0")/../.."
export DEC_NAME=qmv BEFORE_COMMIT="${BEFORE_COMMIT:-9098bc0}" DEADLINE_S="${DEADLINE_S:-400}"
exec bash scripts/device/check_dec_gpu.sh
