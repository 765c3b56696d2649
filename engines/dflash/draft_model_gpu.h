// The DFlash draft on the GPU: DraftModelCpu's computation (draft_model.h) with the core's GPU ops
// (core/cuda/gpu_ops.h, draft_ops.h), weights in the GPU's matrix type (bf16; fp16 before sm_80), fp32
// activations and a context cache of fp32 (default) or bf16 (half the memory: allocate's cache_type). It runs on the target backend's stream and borrows the target's
// embedding and LM head (DeviceHead), so a round's draft, its logits and its per-depth top-K stay on the
// device; only the K candidates per depth come back to the host for the tree. engines/tests/
// dflash_gpu_check.cu compares its forward with DraftModelCpu's.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/backend.h"
#include "dflash/ddtree.h"
#include "dflash/draft_model.h"

namespace lb::dflash {

class DraftModelGpu {
public:
    // `head`: the target backend's (Backend::device_head); the draft keeps its own GPU op context.
    explicit DraftModelGpu(const DeviceHead& head);
    ~DraftModelGpu();
    DraftModelGpu(const DraftModelGpu&) = delete;
    DraftModelGpu& operator=(const DraftModelGpu&) = delete;

    void load(const TensorSource& src, const DraftConfig& cfg);
    const DraftConfig& config() const;
    // Context capacity in rows, the most rows one add_context takes, the target's vocabulary and the context
    // K/V cache's element type (F32 or BF16).
    void allocate(int max_ctx, int max_add_rows, int vocab, DType cache_type = DType::F32);
    void reset();
    int context_length() const;
    void truncate_context(int n);
    // d_features[n, feature_width()] in device memory (as DraftModelCpu::add_context). n <= max_add_rows.
    void add_context(const float* d_features, int n);
    // The rows `rows` of a verify's device features ([n_features, n_verify_rows, target_hidden], what
    // VerifyResult::device_features holds for distinct feature layers), in order, added as context.
    void add_verify_rows(const float* d_verify_features, int n_verify_rows, const std::vector<int>& rows);
    // Device buffers: block_embed[block_size, hidden] -> hidden_out[block_size - 1, hidden] (as the CPU's).
    void forward_block(const float* d_block_embed, float* d_hidden_out);
    // One draft step: the block [bonus, MASK x (block_size - 1)] embedded by the target, the forward, the
    // target's LM head on rows 1.., and the top `k` log-probabilities of each depth (on the device for
    // k <= 16, else from logits copied to the host). The candidates of depths 1..block_size - 1.
    std::vector<DepthCandidates> propose(int bonus, int k);
    uint64_t weight_bytes() const;
    uint64_t context_cache_bytes() const;  // the context K/V rows of every layer
    uint64_t buffer_bytes() const;         // workspace: activations, block logits, top-K, row lists

private:
    struct Impl;
    std::unique_ptr<Impl> p_;
};

}  // namespace lb::dflash
