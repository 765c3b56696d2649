// y[n, out] = x[n, in] @ W[out, in]^T in fp32. Rows of W are split across threads; each thread keeps
// a tile of tokens so a W row is read once per 4 tokens (prefill is GEMM-shaped, decode GEMV-shaped).
#include "ops.h"

namespace lb::cpu {

static inline float dot(const float* a, const float* b, int n) {
    // Eight independent partial sums: lets the compiler vectorise without -ffast-math.
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; ++j) s[j] += a[i + j] * b[i + j];
    float tail = 0;
    for (; i < n; ++i) tail += a[i] * b[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7])) + tail;
}

void matmul(const float* x, int n, int in, const float* W, int out, float* y) {
#pragma omp parallel for schedule(static)
    for (int o = 0; o < out; ++o) {
        const float* w = W + int64_t(o) * in;
        for (int t = 0; t < n; ++t) y[int64_t(t) * out + o] = dot(x + int64_t(t) * in, w, in);
    }
}

}  // namespace lb::cpu
