// GPU versions of the verify operations of ../cpu/ops.h (the *_tree forms and the commit of an accepted
// path): same math and layouts, fp32 activations and state. Rows are those of one verify forward; a
// row's parent is an earlier row or -1 (the committed sequence); `visible` is the [n, n] ancestor-or-self
// byte mask. Every launcher enqueues on `s` and returns. KV caches are rows [slot, n_kv_heads, head_dim]
// of any KV type (f32, f16, bf16, q8_0, q4_0; quantised rows need head_dim a multiple of 32).
#pragma once
#include "../quant.h"
#include "gpu_compat.h"

namespace lb::gpu {

// In place on qkv rows [n, ld]: per-head RMSNorm of q (query part) and k, rotary at positions[t] on the
// first `rot` dims, then K and V stored at cache slot len + t. gated: q_proj rows per head are [query,
// gate] (Qwen3.5), else [query] (Qwen3).
void attn_prep_tree(float* qkv, int ld, int n, int nh, int nkv, int hd, bool gated, int rot, float theta,
                    const float* q_gain, const float* k_gain, float eps, const int* positions, int len, void* kcache,
                    DType kt, void* vcache, DType vt, gpuStream_t s);
// Row t's query heads over cache slots [0, len) and the slots len + j with visible[t * n + j]; times
// sigmoid(gate) when gated. out [n, nh * hd].
void tree_attention(const float* qkv, int ld, int n, int nh, int nkv, int hd, bool gated, int len,
                    const void* kcache, DType kt, const void* vcache, DType vt, const unsigned char* visible,
                    float* out, gpuStream_t s);
// Causal depthwise conv + SiLU along each row's ancestors: x rows [n, ldx] (channels [0, C)), state
// [C, K-1] read only, y [n, C]. The inputs are also copied to keep [n, C] for delta_conv_commit.
void conv_tree(const float* x, int ldx, int n, int C, int K, const float* w, const float* state, const int* parent,
               float* y, float* keep, gpuStream_t s);
// conv_tree over the DeltaNet input's channels (q heads, k heads, v: C = 2 hk dk + hv dv) followed by
// deltanet_prep (gpu_ops.h: q, k heads L2-normalised in y, q scaled; g, beta from x's columns b_off ..), in
// one launch where dk <= 256 and K <= 16 (else the two).
void conv_tree_prep(const float* x, int ldx, int n, int K, const float* w, const float* state, const int* parent,
                    float* y, float* keep, int hk, int dk, int hv, int dv, int b_off, const float* negA,
                    const float* dt_bias, float* g, float* beta, gpuStream_t s);
// The tree-masked chunked delta rule (see ../cpu/delta_rule_tree.cpp). qkv rows [n, ld]: q at 0, k at
// hk*dk, v at 2*hk*dk (q, k normalised, q scaled); g, beta [n, hv]; state S0 [hv, dk, dv] read only.
// out [n, hv*dv]; u [n, hv, dv] and gamma [n, hv] for delta_conv_commit; k_keep [n, hk*dk] a copy of k;
// scratch: delta_tree_scratch(n, hv) floats (the split kernels'). `kernel` names one for the op check (a named
// kernel that does not take the shape is an error); Auto: the fused kernel where it takes the shape and its
// shared memory fits, else the split kernels where they take it, else the one-block-a-head kernel.
enum class DeltaTreeKernel { Auto, Fused, Split, PerHead };
size_t delta_tree_scratch(int n, int hv);
void delta_tree(const float* qkv, int ld, int n, int hk, int hv, int dk, int dv, const float* g, const float* beta,
                const int* parent, const unsigned char* visible, const float* state, float* out, float* u,
                float* gamma, float* k_keep, float* scratch, gpuStream_t s,
                DeltaTreeKernel kernel = DeltaTreeKernel::Auto);
// The commit of the accepted path's rows, every layer of a kind in one launch (commit_path: 2 launches a commit
// instead of 2 a layer, whose launch gaps and one-block copies cost more than the bytes they move). The pointer
// tables travel as the kernel's parameters (under the 4 KB limit), so nothing is uploaded. a = path[m - 1]:
//   DeltaNet state [hv, dk, dv]: S = e^{gamma_a} S + sum_{p in path} e^{gamma_a - gamma_p} k_p u_p^T (k, u,
//     gamma: delta_tree's k_keep, u, gamma), in the CPU's order (../cpu/delta_rule_tree.cpp);
//   conv state [C, K-1] <- the last K-1 of [state, keep[path[0]], ..., keep[path[m-1]]] (keep: conv_tree's).
// hv == 0: the conv states only (k, u, gamma, state unread); C == 0: the DeltaNet states only.
constexpr int kCommitLayers = 64;  // layers a launch; more are committed in further launches
struct DeltaCommitLayers {
    int count = 0;
    // per DeltaNet layer: delta_tree's k_keep, u, gamma and the state; conv_tree's keep and the conv state
    const float* k[kCommitLayers];
    const float* u[kCommitLayers];
    const float* gamma[kCommitLayers];
    float* state[kCommitLayers];
    const float* conv_keep[kCommitLayers];
    float* conv_state[kCommitLayers];
};
void delta_conv_commit(const DeltaCommitLayers& layers, int hk, int hv, int dk, int dv, int C, int K, const int* path,
                       int m, gpuStream_t s);
struct KvCompactLayers {
    int count = 0;
    void* cache[kCommitLayers];
    size_t row_bytes[kCommitLayers];
};
// Each cache's rows: slot len + path[i] -> slot len + i, in order (row_bytes = n_kv_heads * bytes of a head row).
void kv_compact(const KvCompactLayers& caches, int len, const int* path, int m, gpuStream_t s);
// out[r] = argmax of logits row r (lowest index on ties), rows [n, vocab].
void argmax_rows(const float* logits, int n, int vocab, int* out, gpuStream_t s);

}  // namespace lb::gpu
