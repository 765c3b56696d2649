// RMSNorm variants and the small elementwise functions, fp32, in the order transformers computes them.
#include <cmath>

#include "ops.h"

namespace lb::cpu {

float silu(float x) { return x / (1.f + std::exp(-x)); }
float sigmoid(float x) { return 1.f / (1.f + std::exp(-x)); }
float softplus(float x) { return x > 20.f ? x : std::log1p(std::exp(x)); }

void rmsnorm(const float* x, const float* gain, float* y, int rows, int dim, float eps) {
    for (int r = 0; r < rows; ++r) {
        const float* xr = x + int64_t(r) * dim;
        float* yr = y + int64_t(r) * dim;
        double ss = 0;
        for (int i = 0; i < dim; ++i) ss += double(xr[i]) * xr[i];
        float inv = 1.f / std::sqrt(float(ss / dim) + eps);
        for (int i = 0; i < dim; ++i) yr[i] = (xr[i] * inv) * gain[i];
    }
}

void gated_rmsnorm(const float* x, const float* z, const float* gain, float* y, int rows, int dim, float eps) {
    for (int r = 0; r < rows; ++r) {
        const float* xr = x + int64_t(r) * dim;
        const float* zr = z + int64_t(r) * dim;
        float* yr = y + int64_t(r) * dim;
        double ss = 0;
        for (int i = 0; i < dim; ++i) ss += double(xr[i]) * xr[i];
        float inv = 1.f / std::sqrt(float(ss / dim) + eps);
        for (int i = 0; i < dim; ++i) yr[i] = gain[i] * (xr[i] * inv) * silu(zr[i]);
    }
}

void l2norm(float* x, int rows, int dim, float eps) {
    for (int r = 0; r < rows; ++r) {
        float* xr = x + int64_t(r) * dim;
        double ss = 0;
        for (int i = 0; i < dim; ++i) ss += double(xr[i]) * xr[i];
        float inv = 1.f / std::sqrt(float(ss) + eps);
        for (int i = 0; i < dim; ++i) xr[i] *= inv;
    }
}

int argmax(const float* x, int n) {
    int best = 0;
    for (int i = 1; i < n; ++i) if (x[i] > x[best]) best = i;  // strict: the lowest index wins ties
    return best;
}

}  // namespace lb::cpu
