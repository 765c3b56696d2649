// The engines' knobs: every LB_* environment variable an engine reads, in one typed struct, read once from
// the environment by tuning() (tuning.cpp, the only place that reads LB_* variables), echoed in the ready
// line (engine.tuning) and so stored in every result. docs/engines.md ("Knobs") says what each one does.
// An LB_* variable that is not a knob, or a knob with a value that does not parse, is reported in the ready
// line's engine.warnings (and on stderr) and changes nothing: a stray variable never changes a measurement
// silently.
#pragma once

#include <string>
#include <vector>

#include "json.h"

namespace lb {

struct Tuning {
    // ---- the core GPU backend (lucebench-ar; the megakernel's prefill)
    bool gpu_pdl = true;          // LB_GPU_PDL: programmatic dependent launch on sm_90+ (0: off)
    int gemm_splitk_per_sm = 4;   // LB_GPU_SPLITK: qgemm_kernel blocks a multiprocessor to aim for (0: no split-K in any prefill GEMM)
    int gemv_tile_bytes = 16384;  // LB_GV_TILE: fused GEMV weight tile (bytes, >= 1024)
    int gemv_blocks_per_sm = 8;   // LB_GV_PER_SM: fused GEMV blocks a multiprocessor, at most (>= 1)
    int gemv_prewait = 1;         // LB_GV_PREWAIT: fused GEMV tiles requested before the dependency wait (0..3)
    int mlp_blocks_per_sm = 1;    // LB_GPU_MLP_PER_SM: fused MLP blocks a multiprocessor to aim for (>= 1)
    int attn_short_ctx = -1;      // LB_GPU_ATTN_SHORT: largest context for the short-context decode attention
                                  // kernel (0: never; -1: the kernel's default, 256)
    int attn_decode_blocks = 0;   // LB_ATT_SPLITS: decode attention blocks a KV head (0: one wave of the GPU)
    bool fused_attn = true;       // LB_GPU_FUSED_ATTN: decode attention layers through the fused kernels (0: off)
    bool fused_delta = true;      // LB_GPU_FUSED_DELTA: DeltaNet decode step in one kernel, fused graph and unfused
                                  // (GGUF blocks) decode (0: off)
    bool delta_out = true;        // LB_GPU_DELTA_OUT: DeltaNet step fused with its out-projection (0: off)
    int prefill_chunk = 8192;     // LB_GPU_PREFILL_CHUNK: tokens a prefill forward runs at once; longer forwards
                                  // run in chunks of this size, so activations stay bounded (0: no chunking)
    bool gpu_quant = true;        // LB_GPU_QUANT: GGUF matrices in q4_K/q5_K/q6_K/q8_0/q4_0 stay in their blocks on
                                  // the GPU (0: dequantised to the weight type at load, as before)
    int fused_mlp = -1;           // LB_GPU_FUSED_MLP: the one-kernel decode MLP (-1: the backend's default,
                                  // on for CUDA, off for HIP, where it has not run on hardware)
    // ---- the megakernel's decode kernel
    bool mk_fuse = true;          // LB_MK_FUSE: gate/up and down in one stage (0: off)
    bool mk_fuse_out = true;      // LB_MK_FUSE_OUT: DeltaNet mixer + out-projection in one stage (0: off)
    bool mk_fuse_in = true;       // LB_MK_FUSE_IN: no in-projection -> DeltaNet grid barrier (0: off)
    bool mk_fuse_att = true;      // LB_MK_FUSE_ATT: attention layers fused the same way (0: off)
    bool mk_dn_whole = true;      // LB_MK_DN_WHOLE: whole-head DeltaNet items (0: off)
    bool mk_att_rows = true;      // LB_MK_ATT_ROWS: attention out-projection by rows (0: off)
    bool mk_generic = false;      // LB_MK_GENERIC: the run-time build even for the default configuration (1: on)
    std::string mk_trace;         // LB_MK_TRACE: file for the per-stage clock stamps (timing only; empty: none)
    // ---- lucebench-dflash
    std::string dflash_trace;     // LB_DFLASH_TRACE: file that gets one JSON line per round (bonus position,
                                  // the draft's top-1 per depth, tokens accepted; for tests; empty: none)
    bool dflash_draft_bf16 = false;  // LB_DFLASH_DRAFT_BF16: the GPU draft's context K/V cache in bf16, half the
                                     // memory of fp32 (1: on; the CPU draft keeps fp32)

    std::vector<std::string> set;       // the knobs' variable names found in the environment
    std::vector<std::string> warnings;  // unknown LB_* variables, values that do not parse

    Json to_json() const;  // {"knob": value, ..., "set": [...]} for the ready line
};

// The knobs of this process, read from the environment on the first call (and warnings printed to stderr).
const Tuning& tuning();
// The same, parsed from `env` ("NAME=value" entries, as `environ`): for tests.
Tuning parse_tuning(const std::vector<std::string>& env);

}  // namespace lb
