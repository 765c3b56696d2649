// GPU versions of the operations in ../cpu/ops.h (same math, same layouts; fp32 activations, weights
// in wtype, fp32 accumulation and fp32 DeltaNet state). Every launcher enqueues on `s` and returns.
// Positions come from device memory (`d_pos`: tokens already in the sequence) so that a decode step
// can be captured once in a graph and replayed.
#pragma once
#include "../quant.h"
#include "gpu_compat.h"

namespace lb::gpu {

void embed(const int* d_tokens, int n, const wtype* E, int H, float* x, gpuStream_t s);
// y[n, out] (=|+=) x[n, in] @ W[out, in]^T: GEMV (128-bit weight loads) for n <= 8, tensor-core GEMM above.
void matmul(const float* x, int n, int in, const wtype* W, int out, float* y, bool accumulate, gpuStream_t s);
void rmsnorm(const float* x, const float* gain, float* y, int rows, int dim, float eps, gpuStream_t s);
// Causal depthwise conv + SiLU over channels [0, C) of x (row stride ldx), state [C, K-1] advanced.
void conv1d_silu(const float* x, int ldx, int n, int C, int K, const float* w, float* state, float* y, gpuStream_t s);
// In place on y = conv output [n, 2*hk*dk + ...]: L2-normalise q and k heads, scale q by 1/sqrt(dk);
// beta = sigmoid(b), g = negA * softplus(a + dt_bias) from the projection rows (b at col b_off, a at b_off + hv).
void deltanet_prep(float* y, int ldy, const float* proj, int ldp, int b_off, const float* negA, const float* dt_bias,
                   int n, int hk, int dk, int hv, float* g, float* beta, gpuStream_t s);
// Chunked gated delta rule (see ../cpu/delta_rule.cpp); n == 1 is the recurrent step.
void delta_rule(const float* qkv, int ld, int n, int hk, int hv, int dk, int dv, const float* g, const float* beta,
                float* state, float* out, gpuStream_t s);
void gated_rmsnorm(const float* x, const float* z, int ldz, const float* gain, float* y, int n, int heads, int dim,
                   float eps, gpuStream_t s);
// Full attention prologue, in place on qkv rows [n, ld]: per-head RMSNorm of q and k, partial RoPE,
// then K and V appended to the caches at positions *d_pos + t.
void attn_prep(float* qkv, int ld, int n, int nh, int nkv, int hd, int rot, float theta, const float* q_gain,
               const float* k_gain, float eps, const int* d_pos, void* kcache, DType kt, void* vcache, DType vt,
               gpuStream_t s);
// Causal GQA attention (online softmax) of the q heads in qkv over cache rows [0, *d_pos + t], times
// sigmoid(gate); out [n, nh * hd].
void attention(const float* qkv, int ld, int n, int nh, int nkv, int hd, const int* d_pos, const void* kcache, DType kt,
               const void* vcache, DType vt, float* out, gpuStream_t s);
void silu_mul(const float* gu, int n, int I, float* out, gpuStream_t s);
void argmax(const float* x, int n, int* d_out, gpuStream_t s);
void add_pos(int* d_pos, int n, gpuStream_t s);

}  // namespace lb::gpu
