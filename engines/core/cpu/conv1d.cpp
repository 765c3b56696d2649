// Causal depthwise conv1d + SiLU of the DeltaNet input (q, k, v channels), with the rolling state that
// makes prefill and one-token decode the same function.
#include <vector>

#include "ops.h"

namespace lb::cpu {

void causal_conv1d_silu(const float* x, int n, int C, int K, const float* w, float* state, float* y) {
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; ++c) {
        // window = [state (K-1 oldest..newest), x[0..n)] for this channel
        std::vector<float> win(size_t(K - 1 + n));
        for (int j = 0; j < K - 1; ++j) win[size_t(j)] = state[int64_t(c) * (K - 1) + j];
        for (int t = 0; t < n; ++t) win[size_t(K - 1 + t)] = x[int64_t(t) * C + c];
        const float* wc = w + int64_t(c) * K;
        for (int t = 0; t < n; ++t) {
            float acc = 0;
            for (int j = 0; j < K; ++j) acc += wc[j] * win[size_t(t + j)];
            y[int64_t(t) * C + c] = silu(acc);
        }
        for (int j = 0; j < K - 1; ++j) state[int64_t(c) * (K - 1) + j] = win[size_t(n + j)];
    }
}

}  // namespace lb::cpu
