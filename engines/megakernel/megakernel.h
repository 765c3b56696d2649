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
    bool fixed = false;        // the build with the default configuration fixed at compile time (knob mk_generic: off)
    bool fused = false;        // gate/up and down in one stage (4 grid barriers a layer, not 5); knob mk_fuse
    bool fused_out = false;    // DeltaNet mixer + out-projection in one stage (3 barriers a DeltaNet layer); mk_fuse_out
    bool fused_in = false;     // no in-projection -> DeltaNet grid barrier (2 a DeltaNet layer); mk_fuse_in
    bool fused_att = false;    // attention layers without in -> attention -> out-projection barriers (2 a layer); mk_fuse_att
    bool dn_whole = false;     // DeltaNet items run their head's whole step (no per-head exchange); mk_dn_whole
    bool att_rows = false;     // fused attention applies o_proj by rows (H / blocks-a-head atomics a block); mk_att_rows
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
