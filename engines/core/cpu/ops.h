// The CPU reference of every operation of the Qwen3.5 forward pass: plain C++ in fp32, one file per
// operation, written to be read. The GPU kernels in ../cuda/ compute the same things.
// Activations are token-major: x[t * width + i].
#pragma once
#include <cstdint>

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

// Rotate-half RoPE on the first `rot` dims of each head of x[n, heads, hd], positions pos0..pos0+n-1.
void rope(float* x, int n, int heads, int hd, int rot, float theta, int pos0);

// Causal attention of q[n, nh, hd] (positions pos0..) over the cache rows [0, pos0 + n) of K and V
// ([ctx, nkv, hd], element types kt / vt, one row per position), GQA: query head h reads kv head
// h / (nh / nkv). out[n, nh, hd].
void attention(const float* q, int n, int nh, int nkv, int hd, int pos0, const void* kcache, DType kt,
               const void* vcache, DType vt, float* out);

float silu(float x);
float sigmoid(float x);
float softplus(float x);  // torch's: x for x > 20

int argmax(const float* x, int n);  // lowest index on ties

}  // namespace lb::cpu
