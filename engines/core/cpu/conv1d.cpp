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

void causal_conv1d_silu_tree(const float* x, int n, int C, int K, const float* w, const float* state,
                             const int* parent, float* y) {
    // Row t's K inputs, oldest first: (row index >= 0) or (state slot, encoded as -1 - slot).
    std::vector<int> src(size_t(n) * K);
    for (int t = 0; t < n; ++t) {
        int* s = &src[size_t(t) * K];
        int r = t, j = K - 1;
        for (; j >= 0 && r >= 0; --j, r = parent[r]) s[j] = r;
        for (int slot = K - 2; j >= 0; --j, --slot) s[j] = -1 - slot;  // oldest inputs from the state
    }
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; ++c) {
        const float* wc = w + int64_t(c) * K;
        for (int t = 0; t < n; ++t) {
            const int* s = &src[size_t(t) * K];
            float acc = 0;
            for (int j = 0; j < K; ++j)
                acc += wc[j] * (s[j] >= 0 ? x[int64_t(s[j]) * C + c] : state[int64_t(c) * (K - 1) + (-1 - s[j])]);
            y[int64_t(t) * C + c] = silu(acc);
        }
    }
}

void conv_state_commit(const float* x, int C, int K, const int* path, int n_path, float* state) {
    std::vector<float> win(size_t(K - 1 + n_path));
    for (int c = 0; c < C; ++c) {
        for (int j = 0; j < K - 1; ++j) win[size_t(j)] = state[int64_t(c) * (K - 1) + j];
        for (int t = 0; t < n_path; ++t) win[size_t(K - 1 + t)] = x[int64_t(path[t]) * C + c];
        for (int j = 0; j < K - 1; ++j) state[int64_t(c) * (K - 1) + j] = win[size_t(n_path + j)];
    }
}

}  // namespace lb::cpu
