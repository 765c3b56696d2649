// The layer-by-layer Qwen3.5 forward over n tokens on the core's CUDA operations: the `ar` engine's
// prefill (and its legacy decode path) and the megakernel engine's prefill. One copy, so they cannot drift.
#pragma once
#include <cstddef>
#include <functional>
#include <vector>

#include "../qwen35_model.h"
#include "gpu_ops.h"

namespace lb::gpu {

// Activations of a forward over up to `cap` tokens. Buffers only grow.
struct ForwardWorkspace {
    int cap = 0;
    int* tokens = nullptr;
    float *x = nullptr, *h = nullptr, *big = nullptr, *conv = nullptr, *g = nullptr, *beta = nullptr, *o = nullptr,
          *normed = nullptr, *act = nullptr, *logits = nullptr;
    AttnScratch attn;  // the split attention forms' scratch (attention()), sized once for the model's heads

    // Makes room for n tokens, allocating device bytes with `alloc`; false when there already was room.
    bool ensure(const Qwen35Config& cfg, int n, const std::function<void*(size_t)>& alloc);
};

// The split attention forms' scratch for cfg's attention heads (gpu_ops.h, AttnScratch), counters zeroed:
// allocated once by a forward's or a verify's workspace (after decode_setup).
AttnScratch attention_scratch(const ModelConfig& cfg, const std::function<void*(size_t)>& alloc);

// What a forward reads and appends to: per layer the KV cache (full attention) or the DeltaNet and conv
// states, and the device counter of tokens already in them.
struct ForwardCaches {
    const std::vector<void*>& k;
    const std::vector<void*>& v;
    DType kt, vt;
    const std::vector<float*>& ssm;
    const std::vector<float*>& conv;
    int* d_pos;
    // Called for each attention layer right after attn_prep (rows normalised and rotated, this forward's K
    // and V in the caches), with the layer id, the qkv rows and their stride, and the rows' count: a scored
    // forward's tail scores read them there. Empty: none.
    std::function<void(int layer, const float* qkv, int ld, int n)> score = nullptr;
    // Block-sparse attention for this forward (PFlash's drafter; null: dense), with the forward's first
    // position on the host (what *d_pos holds when it starts).
    const BlockSparse* sparse = nullptr;
    int pos0 = 0;
    // Pinned host memory, or null: the forward's argmax also goes to host_ring[(last position) & ring_mask]
    // (the decode graph's token, read by the host without a copy between graph launches).
    int* host_ring = nullptr;
    int ring_mask = 0;
};

// y[n, W.rows] (=|+=) x[n, W.cols] @ W^T whatever W's storage: the backend's wtype (gpu::matmul), GGUF blocks
// (gpu::matmul_quant), or row runs of several types (one launch a run).
void matmul(const float* x, int n, const Mat& W, float* y, bool accumulate, gpuStream_t s);
// The embedding rows of d_tokens from a table in either storage.
void embed(const int* d_tokens, int n, const Mat& E, float* x, gpuStream_t s);
// A DeltaNet out-projection: x_tmp takes the input reordered when W keeps llama.cpp's tiled columns.
void out_proj(const ModelConfig& cfg, const float* o, int n, const Mat& W, float* x_tmp, float* y, gpuStream_t s);

// Embeds d_tokens[0..n), runs every layer, then the final norm and LM head on the last token; writes
// its argmax to d_next and advances d_pos by n.
void forward_layers(const Qwen35Config& cfg, const Qwen35Weights& w, ForwardWorkspace& ws, const ForwardCaches& caches,
                    const int* d_tokens, int n, int* d_next, gpuStream_t s);

}  // namespace lb::gpu
