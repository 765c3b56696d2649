// The megakernel backend: the Qwen3.5 forward pass where a decode step (every layer, the LM head and the
// greedy argmax) is ONE persistent CUDA kernel. Prefill (a prompt of n tokens) reuses the core's CUDA
// operations (core/cuda/gpu_ops.h: batched GEMMs, the chunked delta rule) on the same KV cache, DeltaNet
// recurrent state and conv state the decode kernel then reads and advances.
//
// This header is plain C++ (no CUDA types) so that main.cpp compiles with the host compiler.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.h"

namespace lb::mk {

// How the decode kernel was launched, for the ready line and the tuning record.
struct LaunchInfo {
    int blocks = 0;            // persistent blocks (= resident-block ceiling)
    int blocks_per_sm = 0;     // from cudaOccupancyMaxActiveBlocksPerMultiprocessor
    int sms = 0;
    int threads = 0;           // per block
    int smem_bytes = 0;        // dynamic shared memory per block
    int ring_slots = 0;        // LB_MK_RING=1 (sm_90): v3 weight-ring pages (0: the v1 kernel, the default)
    bool fixed = false;        // the v1 build with the default configuration fixed at compile time; LB_MK_GENERIC=1: off
    int bar_kind = 1;          // LB_MK_BARRIER: grid barrier implementation (decode_kernel.cu)
    int diag = 0;              // LB_MK_DIAG: timing diagnostics (Params::diag)
    bool fused = false;        // gate/up and down in one stage (4 grid barriers a layer, not 5); LB_MK_FUSE=0: off
    bool fused_out = false;    // DeltaNet mixer + out-projection in one stage (3 barriers a DeltaNet layer); LB_MK_FUSE_OUT=0: off
    bool fused_in = false;     // no in-projection -> DeltaNet grid barrier (2 a DeltaNet layer); LB_MK_FUSE_IN=0: off
    bool fused_att = false;    // attention layers without in -> attention -> out-projection barriers (2 a layer); LB_MK_FUSE_ATT=0: off
    bool dn_whole = false;     // DeltaNet items run their head's whole step (no per-head exchange); LB_MK_DN_WHOLE=0: off
    bool att_rows = false;     // fused attention applies o_proj by rows (H / blocks-a-head atomics a block); LB_MK_ATT_ROWS=0: off
    int barriers_per_token = 0;
};

class MegaBackend : public Qwen35Backend {
public:
    // Runs `n_steps` decode steps back to back on the device, starting from the token that the last
    // forward() produced (it stays on the device: no host round trip between tokens). Each step's
    // greedy token is appended to `out`. With `eos` non-empty the chain stops after the first token in
    // `eos` (the remaining launches find the device-side stop flag and return at once).
    virtual void decode_chain(int n_steps, const std::vector<int>& eos, std::vector<int>* out) = 0;
    virtual LaunchInfo launch_info() const = 0;
};

std::unique_ptr<MegaBackend> make_megakernel_backend(int device);

}  // namespace lb::mk
