// The DFlash draft's attention (docs/engines.md, "DFlash"): the block's queries over the draft's cached
// context rows followed by the block's own rows, with z-lab's mask. The fp32 reference of
// ../cuda/draft_ops.cu's draft_attention.
#include <cmath>
#include <cstdint>
#include <vector>

#include "ops.h"

namespace lb::cpu {

void draft_attention(const float* q, int n, int nh, int nkv, int hd, int qpos0, const float* k_ctx,
                     const float* v_ctx, int n_ctx, const float* k_blk, const float* v_blk, bool causal, int window,
                     float* out) {
    const int group = nh / nkv;
    const float scale = 1.0f / std::sqrt(float(hd));
    const int n_keys = n_ctx + n;
#pragma omp parallel for collapse(2) schedule(static)
    for (int t = 0; t < n; ++t)
        for (int h = 0; h < nh; ++h) {
            const int kvh = h / group, qp = qpos0 + t;
            const float* qh = q + (int64_t(t) * nh + h) * hd;
            std::vector<float> p(size_t(n_keys), -INFINITY);
            float mx = -INFINITY;
            for (int s = 0; s < n_keys; ++s) {
                const int kp = s < n_ctx ? s : qpos0 + (s - n_ctx);
                bool visible = !causal || kp <= qp;
                if (window > 0) visible = visible && qp - kp < window && (causal || kp - qp < window);
                if (!visible) continue;
                const float* ks = s < n_ctx ? k_ctx + (int64_t(s) * nkv + kvh) * hd
                                            : k_blk + (int64_t(s - n_ctx) * nkv + kvh) * hd;
                float d = 0;
                for (int i = 0; i < hd; ++i) d += qh[i] * ks[i];
                p[size_t(s)] = d * scale;
                mx = std::fmax(mx, p[size_t(s)]);
            }
            float sum = 0;
            for (int s = 0; s < n_keys; ++s) {
                p[size_t(s)] = p[size_t(s)] == -INFINITY ? 0.f : std::exp(p[size_t(s)] - mx);
                sum += p[size_t(s)];
            }
            float* oh = out + (int64_t(t) * nh + h) * hd;
            for (int i = 0; i < hd; ++i) oh[i] = 0;
            for (int s = 0; s < n_keys; ++s) {
                if (p[size_t(s)] == 0.f) continue;
                const float w = p[size_t(s)] / sum;
                const float* vs = s < n_ctx ? v_ctx + (int64_t(s) * nkv + kvh) * hd
                                            : v_blk + (int64_t(s - n_ctx) * nkv + kvh) * hd;
                for (int i = 0; i < hd; ++i) oh[i] += w * vs[i];
            }
        }
}

}  // namespace lb::cpu
