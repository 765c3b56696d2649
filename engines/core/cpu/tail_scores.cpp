// PFlash importance: the attention probabilities of a few query rows (the prompt's tail) over every key,
// reduced by the max over query heads. The plain reference the GPU form will be checked against.
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops.h"

namespace lb::cpu {

void tail_attention_probs(const float* q, const int* pos, int n_tail, int nh, int nkv, int hd, const float* K,
                          int ctx, float* probs) {
    const int group = nh / nkv;
    const float scale = 1.0f / std::sqrt(float(hd));
#pragma omp parallel for schedule(static)
    for (int t = 0; t < n_tail; ++t) {
        float* row = probs + int64_t(t) * ctx;
        std::fill(row, row + ctx, 0.f);
        const int last = std::min(pos[t], ctx - 1);  // causal: the row sees positions 0..its own
        std::vector<float> p(size_t(last + 1));
        for (int h = 0; h < nh; ++h) {
            const float* qh = q + (int64_t(t) * nh + h) * hd;
            const int kvh = h / group;
            float mx = -INFINITY;
            for (int s = 0; s <= last; ++s) {
                const float* ks = K + (int64_t(s) * nkv + kvh) * hd;
                float d = 0;
                for (int i = 0; i < hd; ++i) d += qh[i] * ks[i];
                p[size_t(s)] = d * scale;
                mx = std::fmax(mx, p[size_t(s)]);
            }
            double sum = 0;
            for (int s = 0; s <= last; ++s) { p[size_t(s)] = std::exp(p[size_t(s)] - mx); sum += p[size_t(s)]; }
            const float inv = float(1.0 / sum);
            for (int s = 0; s <= last; ++s) row[s] = std::fmax(row[s], p[size_t(s)] * inv);
        }
    }
}

}  // namespace lb::cpu
