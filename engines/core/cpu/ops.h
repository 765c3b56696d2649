// The CPU reference of every operation of the forward pass: plain C++ in fp32, one file per
// operation, written to be read. The GPU kernels in ../cuda/ compute the same things.
// The *_tree forms run the rows of a verify forward: row t's predecessors are its ancestors (parent[t]
// is an earlier row, or -1 for the committed sequence), so a chain (parent[t] = t - 1) is the causal case.
// Activations are token-major: x[t * width + i].
#pragma once
#include <cstdint>
#include <vector>

#include "../quant.h"

namespace lb::cpu {

// y[n, out] = x[n, in] @ W[out, in]^T
void matmul(const float* x, int n, int in, const float* W, int out, float* y);

// y = x / sqrt(mean(x^2) + eps) * gain, over rows of width `dim`.
void rmsnorm(const float* x, const float* gain, float* y, int rows, int dim, float eps);
// DeltaNet output norm: y = gain * x / sqrt(mean(x^2) + eps) * silu(z).
void gated_rmsnorm(const float* x, const float* z, const float* gain, float* y, int rows, int dim, float eps);
// x / sqrt(sum(x^2) + eps), in place, over rows of width `dim` (eps 1e-6 as in FLA / transformers).
void l2norm(float* x, int rows, int dim, float eps);

// Causal depthwise conv over time, kernel K, then SiLU. x[n, C] (token-major); state[C, K-1] holds the
// K-1 inputs before x (oldest first) and is advanced past x. w[C, K]: w[c, K-1] multiplies the current input.
void causal_conv1d_silu(const float* x, int n, int C, int K, const float* w, float* state, float* y);
// Tree form: row t's window is the inputs of its ancestors (nearest last), continued into `state` (read
// only) where the path is shorter than K - 1.
void causal_conv1d_silu_tree(const float* x, int n, int C, int K, const float* w, const float* state,
                             const int* parent, float* y);
// The conv state after the rows `path` (root first; each the next one's parent): their last K - 1 inputs,
// continued into the old state. Updates `state` in place.
void conv_state_commit(const float* x, int C, int K, const int* path, int n_path, float* state);

// Gated delta rule. q, k: [n, hk, dk] (already L2-normalised; q scaled by 1/sqrt(dk)); v: [n, hv, dv];
// g (log decay) and beta: [n, hv]. Value head h reads key head h / (hv / hk). state: [hv, dk, dv], fp32,
// updated in place. out: [n, hv, dv].
//   S = exp(g_t) S;  S += k_t (beta_t (v_t - S^T k_t))^T;  o_t = S^T q_t
void delta_rule_recurrent(const float* q, const float* k, const float* v, const float* g, const float* beta, int n,
                          int hk, int hv, int dk, int dv, float* state, float* out);
// The same result computed chunk-parallel (chunk size `chunk`, the WY / UT-transform form): within a
// chunk all positions are solved together with small matrix products; only chunks are sequential.
void delta_rule_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta, int n,
                        int hk, int hv, int dk, int dv, float* state, float* out, int chunk = 64);

// The tree form of the chunked solution, over all n rows at once: with gamma_t the summed log decay along
// t's path, u_t + sum_{s anc t} beta_t (k_t . k_s) e^{gamma_t - gamma_s} u_s = beta_t (v_t - e^{gamma_t} S0^T k_t)
// and o_t = e^{gamma_t} S0^T q_t + sum_{s anc-or-self t} e^{gamma_t - gamma_s} (q_t . k_s) u_s.
// `state` S0 is read only; u [n, hv, dv] and gamma [n, hv] are kept for delta_rule_tree_commit.
void delta_rule_tree(const float* q, const float* k, const float* v, const float* g, const float* beta, int n,
                     int hk, int hv, int dk, int dv, const int* parent, const float* state, float* out, float* u,
                     float* gamma);
// The state after the rows `path` (root first), a = its last row:
//   S = e^{gamma_a} S0 + sum_{s in path} e^{gamma_a - gamma_s} k_s u_s^T   (in place)
void delta_rule_tree_commit(const float* k, const float* u, const float* gamma, int hk, int hv, int dk, int dv,
                            const int* path, int n_path, float* state);

// Rotate-half RoPE on the first `rot` dims of each head of x[n, heads, hd], positions pos0..pos0+n-1.
void rope(float* x, int n, int heads, int hd, int rot, float theta, int pos0);
// The same at explicit positions pos[0..n).
void rope_at(float* x, int n, int heads, int hd, int rot, float theta, const int* pos);

// Causal attention of q[n, nh, hd] (positions pos0..) over the cache rows [0, pos0 + n) of K and V
// ([ctx, nkv, hd], element types kt / vt, one row per position), GQA: query head h reads kv head
// h / (nh / nkv). out[n, nh, hd].
void attention(const float* q, int n, int nh, int nkv, int hd, int pos0, const void* kcache, DType kt,
               const void* vcache, DType vt, float* out);
// Tree form: the n rows' K/V are cache rows ctx0..ctx0+n-1; row t attends to the rows [0, ctx0) and to
// the new rows j with visible[t * n + j] (its ancestors and itself).
void tree_attention(const float* q, int n, int nh, int nkv, int hd, int ctx0, const void* kcache, DType kt,
                    const void* vcache, DType vt, const uint8_t* visible, float* out);

// Block-sparse attention (PFlash's drafter; gpu::BlockSparse, cuda/attention.cu block_select_kernel): the rule
// that picks the 64-position key tiles each query tile reads, and the attention over them. A chunk of n rows at
// positions pos0.. in query tiles of `rows` rows (the GPU kernel's tile: 128 / G rows in bf16 builds); q[n, nh,
// hd] after RoPE; K, V the decoded cache [pos0 + n, nkv, hd], K rotated. Key block j (128 positions, j * 128 ..)
// scores mean(tile's queries of kv head kvh's G heads) . mean(block's keys) / sqrt(hd). Kept: blocks j < sinks,
// the `recent` blocks up to the tile's own, and of the others those within ln(alpha) of the tile's best score,
// at most ceil(budget x (blocks the tile sees)) of them, the best-scoring (ties: the earlier; budget >= 1: no
// bound); a tile whose last row is at or past dense_from keeps every tile.
struct SparseRule {
    float alpha = 0.85f, budget = 1.f;
    int sinks = 2, recent = 4, dense_from = 1 << 30;  // dense_from: no dense rows
};
constexpr int kSparseBlock = 128, kSparseTile = 64;
// Per (query tile, kv head), index tile * nkv + kvh: the kept key tiles, ascending. scores (optional): the
// block scores, same index.
std::vector<std::vector<int>> block_sparse_select(const float* q, int n, int nh, int nkv, int hd, int rows, int pos0,
                                                  const float* K, const SparseRule& rule,
                                                  std::vector<std::vector<float>>* scores = nullptr);
// Causal attention of q over the keys of the kept tiles only (the softmax over them), out[n, nh, hd].
void block_sparse_attention(const float* q, int n, int nh, int nkv, int hd, int rows, int pos0, const float* K,
                            const float* V, const std::vector<std::vector<int>>& tiles, float* out);

// The DFlash draft's attention: queries q[n, nh, hd] at positions qpos0..qpos0+n-1 (the block) over the
// cached context rows k_ctx/v_ctx [n_ctx, nkv, hd] at positions 0..n_ctx-1 followed by the block's rows
// k_blk/v_blk [n, nkv, hd] at qpos0... A key at position kp is visible to a query at qp when
// (!causal || kp <= qp) and (window == 0 || (qp - kp < window && (causal || kp - qp < window))), as the
// z-lab mask. GQA: query head h reads kv head h / (nh / nkv). out[n, nh, hd].
void draft_attention(const float* q, int n, int nh, int nkv, int hd, int qpos0, const float* k_ctx,
                     const float* v_ctx, int n_ctx, const float* k_blk, const float* v_blk, bool causal, int window,
                     float* out);

// PFlash importance: probs[t, s] = max over query heads h of softmax_s(q[t, h] . K[s, h / (nh / nkv)] / sqrt(hd))
// over the positions s <= pos[t] (0 beyond). q[n_tail, nh, hd], K[ctx, nkv, hd] fp32, probs[n_tail, ctx].
void tail_attention_probs(const float* q, const int* pos, int n_tail, int nh, int nkv, int hd, const float* K,
                          int ctx, float* probs);

float silu(float x);
float sigmoid(float x);
float softplus(float x);  // torch's: x for x > 20

int argmax(const float* x, int n);  // lowest index on ties

}  // namespace lb::cpu
