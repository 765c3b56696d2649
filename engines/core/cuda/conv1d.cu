// The DeltaNet causal depthwise conv + SiLU over a prefill chunk. CPU reference: ../cpu/conv1d.cpp.
#include "common.cuh"

namespace lb::gpu {

namespace {

// Parallel over (channel, strip of CONV_TT tokens): grid (C / 128, n / TT).
// With in(tau) = x[tau][c] for tau >= 0 and the old state[c][K-1+tau] for tau < 0,
// y[t][c] = silu(w[K-1] in(t) + sum_{j<K-1} w[j] in(t-K+1+j)) (the CPU reference's summation order) and the new
// state is in(n-K+1 .. n-1). Since TT >= K-1, only strip 0 reads the old state; its thread for channel c
// writes the new state of c after all of its own reads, so no other thread can see a half-updated state.
constexpr int CONV_TT = 8;
template <int K>
__global__ void conv1d_silu_par_kernel(const float* x, int ldx, int n, int C, const float* w, float* state, float* y) {
    static_assert(K >= 1 && K - 1 <= CONV_TT, "strip shorter than the conv state");
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int t0 = blockIdx.y * CONV_TT;
    float* st = state + size_t(c) * (K - 1);
    float win[K - 1 + CONV_TT];  // win[i] = in(t0 - (K-1) + i)
#pragma unroll
    for (int i = 0; i < K - 1 + CONV_TT; ++i) {
        const int tau = t0 - (K - 1) + i;
        win[i] = tau < 0 ? st[K - 1 + tau] : (tau < n ? x[size_t(tau) * ldx + c] : 0.f);
    }
    float wc[K];
#pragma unroll
    for (int j = 0; j < K; ++j) wc[j] = w[size_t(c) * K + j];
#pragma unroll
    for (int u = 0; u < CONV_TT; ++u) {
        if (t0 + u >= n) break;
        float acc = wc[K - 1] * win[u + K - 1];
#pragma unroll
        for (int j = 0; j < K - 1; ++j) acc += wc[j] * win[u + j];
        y[size_t(t0 + u) * C + c] = silu(acc);
    }
    if (blockIdx.y == 0 && K > 1) {
        float ns[K > 1 ? K - 1 : 1];
#pragma unroll
        for (int j = 0; j < K - 1; ++j) {  // new state[j] = in(n - (K-1) + j); read everything, then write
            const int tau = n - (K - 1) + j;
            ns[j] = tau < 0 ? st[K - 1 + tau] : x[size_t(tau) * ldx + c];
        }
#pragma unroll
        for (int j = 0; j < K - 1; ++j) st[j] = ns[j];
    }
}

}  // namespace

void conv1d_silu(const float* x, int ldx, int n, int C, int K, const float* w, float* state, float* y, gpuStream_t s) {
    if (K < 1 || K > 8) lb::fail("unsupported", "conv kernel size outside 1..8");
    const dim3 grid((C + 127) / 128, (n + CONV_TT - 1) / CONV_TT);
    switch (K) {
#define LB_CONV_CASE(k) case k: conv1d_silu_par_kernel<k><<<grid, 128, 0, s>>>(x, ldx, n, C, w, state, y); return;
        LB_CONV_CASE(1) LB_CONV_CASE(2) LB_CONV_CASE(3) LB_CONV_CASE(4)
        LB_CONV_CASE(5) LB_CONV_CASE(6) LB_CONV_CASE(7) LB_CONV_CASE(8)
#undef LB_CONV_CASE
    }
}

}  // namespace lb::gpu
