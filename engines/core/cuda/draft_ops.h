// GPU operations of the DFlash draft and its per-depth candidates (engines/dflash/draft_model_gpu.cu).
// CPU references: draft_attention in ../cpu/draft_attention.cpp, top_k_logprobs in
// engines/dflash/ddtree.cpp; engines/tests/dflash_gpu_check.cu compares them on random inputs.
#pragma once
#include "../quant.h"
#include "gpu_compat.h"

namespace lb::gpu {

// The draft's attention. Cache rows [0, n_ctx + n) of K and V ([row, nkv, hd] of `cache_type`: F32 or BF16,
// read as float) are the context rows followed by the block's n rows; row r sits at position r. Queries q rows [n, ldq] (head h at h * hd) at
// positions n_ctx .. n_ctx + n - 1. A key at kp is visible to a query at qp when (!causal || kp <= qp) and
// (window == 0 || (qp - kp < window && (causal || kp - qp < window))) (z-lab's mask). out [n, nh * hd].
void draft_attention(const float* q, int ldq, int n, int nh, int nkv, int hd, int n_ctx, const void* kcache,
                     const void* vcache, DType cache_type, bool causal, int window, float* out, gpuStream_t s);

// The largest k draft_top_k takes.
constexpr int kDraftTopKMax = 16;
// Per row of logits [rows, vocab]: z = logits * multiplier, then softcap * tanh(z / softcap) when softcap > 0;
// the k largest z (lowest index first among equal values) as ids[rows, k] and z - logsumexp(z) as
// logprobs[rows, k], best first. 1 <= k <= kDraftTopKMax, k <= vocab.
void draft_top_k(const float* logits, int rows, int vocab, int k, float multiplier, float softcap, int* ids,
                 float* logprobs, gpuStream_t s);

// dst[i, f * H + e] = src[(f * n_src + rows[i]) * H + e] for i < m, f < nf, e < H: the rows of a verify's
// feature layers ([nf, n_src, H]) gathered and concatenated per row ([m, nf * H], the draft's input).
void gather_feature_rows(const float* src, int n_src, int nf, int H, const int* rows, int m, float* dst,
                         gpuStream_t s);

// x[i] *= a for i < count.
void scale(float* x, size_t count, float a, gpuStream_t s);

}  // namespace lb::gpu
