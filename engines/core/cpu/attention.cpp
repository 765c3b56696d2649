// Rotary embedding (partial or full) and GQA attention over the KV cache, causal or tree-masked (any KV element type: rows are
// decoded to fp32 as they are read, so quantised caches are exercised exactly as stored).
#include <algorithm>
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

namespace {

// The cache rows [0, ctx) decoded to fp32, [ctx, nkv, hd]: once per call.
void decode_cache(const void* kcache, DType kt, const void* vcache, DType vt, int ctx, int nkv, int hd,
                  std::vector<float>* K, std::vector<float>* V) {
    const size_t krow = dtype_row_bytes(kt, size_t(hd)), vrow = dtype_row_bytes(vt, size_t(hd));
    K->resize(size_t(ctx) * nkv * hd);
    V->resize(size_t(ctx) * nkv * hd);
    for (int64_t r = 0; r < int64_t(ctx) * nkv; ++r) {
        decode_row(kt, (const uint8_t*)kcache + r * krow, &(*K)[size_t(r) * hd], size_t(hd));
        decode_row(vt, (const uint8_t*)vcache + r * vrow, &(*V)[size_t(r) * hd], size_t(hd));
    }
}

// Softmax attention of one query head qh over the cache rows `rows` (in that order) of KV head kvh.
void attend(const float* qh, const float* K, const float* V, int nkv, int kvh, int hd, const std::vector<int>& rows,
            float* oh) {
    const float scale = 1.0f / std::sqrt(float(hd));
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
    for (int i = 0; i < hd; ++i) oh[i] = 0;
    for (size_t r = 0; r < rows.size(); ++r) {
        const float w = p[r] / sum;
        const float* vs = &V[(size_t(rows[r]) * nkv + kvh) * hd];
        for (int i = 0; i < hd; ++i) oh[i] += w * vs[i];
    }
}

}  // namespace

void attention(const float* q, int n, int nh, int nkv, int hd, int pos0, const void* kcache, DType kt,
               const void* vcache, DType vt, float* out) {
    const int group = nh / nkv;
    std::vector<float> K, V;
    decode_cache(kcache, kt, vcache, vt, pos0 + n, nkv, hd, &K, &V);
#pragma omp parallel for collapse(2) schedule(static)
    for (int t = 0; t < n; ++t)
        for (int h = 0; h < nh; ++h) {
            std::vector<int> rows(size_t(pos0 + t + 1));  // positions 0 .. pos0 + t
            for (size_t s = 0; s < rows.size(); ++s) rows[s] = int(s);
            attend(q + (int64_t(t) * nh + h) * hd, K.data(), V.data(), nkv, h / group, hd, rows,
                   out + (int64_t(t) * nh + h) * hd);
        }
}

std::vector<std::vector<int>> block_sparse_select(const float* q, int n, int nh, int nkv, int hd, int rows, int pos0,
                                                  const float* K, const SparseRule& rule,
                                                  std::vector<std::vector<float>>* scores) {
    const int G = nh / nkv, n_tiles = (n + rows - 1) / rows, end = pos0 + n;
    const int blocks = (end + kSparseBlock - 1) / kSparseBlock;
    std::vector<float> kmean(size_t(blocks) * nkv * hd, 0.f);
    for (int j = 0; j < blocks; ++j) {
        const int p0 = j * kSparseBlock, p1 = std::min(end, p0 + kSparseBlock);
        for (int h = 0; h < nkv; ++h) {
            float* km = &kmean[(size_t(j) * nkv + h) * hd];
            for (int p = p0; p < p1; ++p)
                for (int d = 0; d < hd; ++d) km[d] += K[(size_t(p) * nkv + h) * hd + d];
            for (int d = 0; d < hd; ++d) km[d] /= float(p1 - p0);
        }
    }
    std::vector<std::vector<int>> out(size_t(n_tiles) * nkv);
    if (scores) scores->assign(out.size(), {});
    const float scale = 1.0f / std::sqrt(float(hd));
    for (int tile = 0; tile < n_tiles; ++tile)
        for (int h = 0; h < nkv; ++h) {
            const int t0 = tile * rows, t1 = std::min(t0 + rows, n), last = pos0 + t1 - 1;
            const int jl = last / kSparseBlock, s_tiles = last / kSparseTile + 1;
            std::vector<int>& kept = out[size_t(tile) * nkv + h];
            if (last >= rule.dense_from) {
                for (int k = 0; k < s_tiles; ++k) kept.push_back(k);
                continue;
            }
            std::vector<float> qm(size_t(hd), 0.f), sc(size_t(jl + 1));
            for (int t = t0; t < t1; ++t)
                for (int g = 0; g < G; ++g)
                    for (int d = 0; d < hd; ++d) qm[size_t(d)] += q[(size_t(t) * nh + h * G + g) * hd + d];
            for (float& x : qm) x /= float((t1 - t0) * G);
            float best = -INFINITY;
            for (int j = 0; j <= jl; ++j) {
                float dot = 0.f;
                for (int d = 0; d < hd; ++d) dot += qm[size_t(d)] * kmean[(size_t(j) * nkv + h) * hd + d];
                sc[size_t(j)] = dot * scale;
                best = std::max(best, sc[size_t(j)]);
            }
            const float log_alpha = std::log(rule.alpha);
            std::vector<int> cand;
            std::vector<char> keep(size_t(jl + 1), 0);
            for (int j = 0; j <= jl; ++j) {
                if (j < std::max(1, rule.sinks) || j > jl - rule.recent) keep[size_t(j)] = 1;
                else if (sc[size_t(j)] - best >= log_alpha) cand.push_back(j);
            }
            const size_t cap = rule.budget >= 1.f ? cand.size() : size_t(std::ceil(rule.budget * float(jl + 1)));
            std::stable_sort(cand.begin(), cand.end(), [&](int a, int b) { return sc[size_t(a)] > sc[size_t(b)]; });
            for (size_t i = 0; i < cand.size() && i < cap; ++i) keep[size_t(cand[i])] = 1;
            for (int j = 0; j <= jl; ++j)
                if (keep[size_t(j)])
                    for (int k = 2 * j; k < 2 * j + 2 && k < s_tiles; ++k) kept.push_back(k);
            if (scores) (*scores)[size_t(tile) * nkv + h] = std::move(sc);
        }
    return out;
}

void block_sparse_attention(const float* q, int n, int nh, int nkv, int hd, int rows, int pos0, const float* K,
                            const float* V, const std::vector<std::vector<int>>& tiles, float* out) {
    const int group = nh / nkv;
#pragma omp parallel for collapse(2) schedule(static)
    for (int t = 0; t < n; ++t)
        for (int h = 0; h < nh; ++h) {
            const int last = pos0 + t;
            std::vector<int> keys;  // the kept tiles' positions this row sees, ascending
            for (int k : tiles[size_t(t / rows) * nkv + h / group])
                for (int s = k * kSparseTile; s < (k + 1) * kSparseTile && s <= last; ++s) keys.push_back(s);
            attend(q + (int64_t(t) * nh + h) * hd, K, V, nkv, h / group, hd, keys, out + (int64_t(t) * nh + h) * hd);
        }
}

// The same arithmetic in the same order as attention(), over the visible rows in cache order, so a chain
// gives bit-identical results to the causal form.
void tree_attention(const float* q, int n, int nh, int nkv, int hd, int ctx0, const void* kcache, DType kt,
                    const void* vcache, DType vt, const uint8_t* visible, float* out) {
    const int group = nh / nkv;
    std::vector<float> K, V;
    decode_cache(kcache, kt, vcache, vt, ctx0 + n, nkv, hd, &K, &V);
#pragma omp parallel for collapse(2) schedule(static)
    for (int t = 0; t < n; ++t)
        for (int h = 0; h < nh; ++h) {
            // the rows this one sees: the whole committed cache, then its visible new rows
            std::vector<int> rows;
            rows.reserve(size_t(ctx0 + n));
            for (int s = 0; s < ctx0; ++s) rows.push_back(s);
            for (int j = 0; j < n; ++j) if (visible[size_t(t) * n + j]) rows.push_back(ctx0 + j);
            attend(q + (int64_t(t) * nh + h) * hd, K.data(), V.data(), nkv, h / group, hd, rows,
                   out + (int64_t(t) * nh + h) * hd);
        }
}

}  // namespace lb::cpu
