// Rotary embedding (partial or full) and GQA attention over the KV cache, causal or tree-masked (any KV element type: rows are
// decoded to fp32 as they are read, so quantised caches are exercised exactly as stored).
#include <cmath>
#include <vector>

#include "ops.h"

namespace lb::cpu {

// inv_freq and angles are computed in fp32 the way transformers does (inv_freq = 1 / theta^(2i/rot),
// angle = pos * inv_freq, both float), so positions far from 0 round the same way.
void rope(float* x, int n, int heads, int hd, int rot, float theta, int pos0) {
    std::vector<int> pos(static_cast<size_t>(n));
    for (int t = 0; t < n; ++t) pos[size_t(t)] = pos0 + t;
    rope_at(x, n, heads, hd, rot, theta, pos.data());
}

void rope_at(float* x, int n, int heads, int hd, int rot, float theta, const int* pos) {
    const int half = rot / 2;
    for (int t = 0; t < n; ++t) {
        for (int i = 0; i < half; ++i) {
            const float inv_freq = 1.0f / std::pow(theta, float(2 * i) / float(rot));
            const float angle = float(pos[t]) * inv_freq;
            const float c = std::cos(angle), s = std::sin(angle);
            for (int h = 0; h < heads; ++h) {
                float* xh = x + (int64_t(t) * heads + h) * hd;
                const float a = xh[i], b = xh[i + half];
                xh[i] = a * c - b * s;         // rotate_half: (x1, x2) -> (-x2, x1)
                xh[i + half] = b * c + a * s;
            }
        }
    }
}

void attention(const float* q, int n, int nh, int nkv, int hd, int pos0, const void* kcache, DType kt,
               const void* vcache, DType vt, float* out) {
    const int group = nh / nkv;
    const int ctx = pos0 + n;
    const size_t krow = dtype_row_bytes(kt, size_t(hd)), vrow = dtype_row_bytes(vt, size_t(hd));
    // Decode the cache once per call: [ctx, nkv, hd] fp32.
    std::vector<float> K(size_t(ctx) * nkv * hd), V(size_t(ctx) * nkv * hd);
    for (int64_t r = 0; r < int64_t(ctx) * nkv; ++r) {
        decode_row(kt, (const uint8_t*)kcache + r * krow, &K[size_t(r) * hd], size_t(hd));
        decode_row(vt, (const uint8_t*)vcache + r * vrow, &V[size_t(r) * hd], size_t(hd));
    }
    const float scale = 1.0f / std::sqrt(float(hd));
#pragma omp parallel for collapse(2) schedule(static)
    for (int t = 0; t < n; ++t)
        for (int h = 0; h < nh; ++h) {
            const int kvh = h / group;
            const int last = pos0 + t;  // attends to positions 0..last
            const float* qh = q + (int64_t(t) * nh + h) * hd;
            std::vector<float> p(size_t(last + 1));
            float mx = -INFINITY;
            for (int s = 0; s <= last; ++s) {
                const float* ks = &K[(size_t(s) * nkv + kvh) * hd];
                float d = 0;
                for (int i = 0; i < hd; ++i) d += qh[i] * ks[i];
                p[size_t(s)] = d * scale;
                mx = std::fmax(mx, p[size_t(s)]);
            }
            float sum = 0;
            for (int s = 0; s <= last; ++s) { p[size_t(s)] = std::exp(p[size_t(s)] - mx); sum += p[size_t(s)]; }
            float* oh = out + (int64_t(t) * nh + h) * hd;
            for (int i = 0; i < hd; ++i) oh[i] = 0;
            for (int s = 0; s <= last; ++s) {
                const float w = p[size_t(s)] / sum;
                const float* vs = &V[(size_t(s) * nkv + kvh) * hd];
                for (int i = 0; i < hd; ++i) oh[i] += w * vs[i];
            }
        }
}

// Same arithmetic order as attention(): scores over the visible rows in cache order, so a chain gives
// bit-identical results to the causal form.
void tree_attention(const float* q, int n, int nh, int nkv, int hd, int ctx0, const void* kcache, DType kt,
                    const void* vcache, DType vt, const uint8_t* visible, float* out) {
    const int group = nh / nkv;
    const int ctx = ctx0 + n;
    const size_t krow = dtype_row_bytes(kt, size_t(hd)), vrow = dtype_row_bytes(vt, size_t(hd));
    std::vector<float> K(size_t(ctx) * nkv * hd), V(size_t(ctx) * nkv * hd);
    for (int64_t r = 0; r < int64_t(ctx) * nkv; ++r) {
        decode_row(kt, (const uint8_t*)kcache + r * krow, &K[size_t(r) * hd], size_t(hd));
        decode_row(vt, (const uint8_t*)vcache + r * vrow, &V[size_t(r) * hd], size_t(hd));
    }
    const float scale = 1.0f / std::sqrt(float(hd));
#pragma omp parallel for collapse(2) schedule(static)
    for (int t = 0; t < n; ++t)
        for (int h = 0; h < nh; ++h) {
            const int kvh = h / group;
            const float* qh = q + (int64_t(t) * nh + h) * hd;
            // the rows this one sees: the whole committed cache, then its visible new rows
            std::vector<int> rows;
            rows.reserve(size_t(ctx));
            for (int s = 0; s < ctx0; ++s) rows.push_back(s);
            for (int j = 0; j < n; ++j) if (visible[size_t(t) * n + j]) rows.push_back(ctx0 + j);
            std::vector<float> p(rows.size());
            float mx = -INFINITY;
            for (size_t r = 0; r < rows.size(); ++r) {
                const float* ks = &K[(size_t(rows[r]) * nkv + kvh) * hd];
                float d = 0;
                for (int i = 0; i < hd; ++i) d += qh[i] * ks[i];
                p[r] = d * scale;
                mx = std::fmax(mx, p[r]);
            }
            float sum = 0;
            for (size_t r = 0; r < rows.size(); ++r) { p[r] = std::exp(p[r] - mx); sum += p[r]; }
            float* oh = out + (int64_t(t) * nh + h) * hd;
            for (int i = 0; i < hd; ++i) oh[i] = 0;
            for (size_t r = 0; r < rows.size(); ++r) {
                const float w = p[r] / sum;
                const float* vs = &V[(size_t(rows[r]) * nkv + kvh) * hd];
                for (int i = 0; i < hd; ++i) oh[i] += w * vs[i];
            }
        }
}

}  // namespace lb::cpu
