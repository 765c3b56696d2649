// The warp online softmax of the small attention kernels: draft_ops.cu's draft_attention (a key range from
// the draft's mask) and verify_ops.cu's tree_attention (the committed keys, then the tree rows a row sees).
// They differ only in which keys a row sees and in how they read a cached row.
#pragma once
#include "common.cuh"

namespace lb::gpu {

namespace {

// One attention row (one query row, one head) by a block of WARPS warps. Warp w walks the keys lo + w,
// lo + w + WARPS, ... below hi that visible(key) admits with an online softmax: a running max m, sum l and
// weighted sum of values acc, lane holding elements lane, lane + warp size, ... (hd <= MAX_PER_LANE x warp
// size). The warps' partial results are then merged through shared memory: m_s and l_s hold WARPS floats,
// acc_s WARPS x hd. k(key, i) and v(key, i) read element i of the key's cached K and V rows.
// Every element i of softmax(q . k / sqrt(hd)) v goes to write(i, o) once, over the block's threads; o is 0
// when no key is visible.
template <int WARPS, int MAX_PER_LANE, class Visible, class KeyAt, class ValueAt, class Write>
__device__ __forceinline__ void attention_row_online_softmax(const float* q, int hd, int lo, int hi, Visible visible,
                                                             KeyAt k, ValueAt v, float* m_s, float* l_s,
                                                             float* acc_s, Write write) {
    const int lane = threadIdx.x % LB_WARP, warp = threadIdx.x / LB_WARP;
    const int per = (hd + LB_WARP - 1) / LB_WARP;
    float qr[MAX_PER_LANE], acc[MAX_PER_LANE];
    for (int e = 0; e < per; ++e) {
        const int i = lane + e * LB_WARP;
        qr[e] = i < hd ? q[i] : 0.f;
        acc[e] = 0.f;
    }
    const float scale = 1.0f / sqrtf(float(hd));
    float m = -INFINITY, l = 0.f;
    for (int key = lo + warp; key < hi; key += WARPS) {
        if (!visible(key)) continue;
        float d = 0;
        for (int e = 0; e < per; ++e) {
            const int i = lane + e * LB_WARP;
            if (i < hd) d += qr[e] * k(key, i);
        }
        const float sc = warp_sum(d) * scale;
        const float m_new = fmaxf(m, sc);
        const float corr = expf(m - m_new), p = expf(sc - m_new);
        l = l * corr + p;
        for (int e = 0; e < per; ++e) {
            const int i = lane + e * LB_WARP;
            acc[e] = acc[e] * corr + (i < hd ? p * v(key, i) : 0.f);
        }
        m = m_new;
    }
    if (lane == 0) { m_s[warp] = m; l_s[warp] = l; }
    for (int e = 0; e < per; ++e) {
        const int i = lane + e * LB_WARP;
        if (i < hd) acc_s[warp * hd + i] = acc[e];
    }
    __syncthreads();
    float mx = -INFINITY;  // over the warps that saw a key (the others hold m = -inf, l = 0)
    for (int w = 0; w < WARPS; ++w) if (l_s[w] > 0) mx = fmaxf(mx, m_s[w]);
    float denom = 0;
    for (int w = 0; w < WARPS; ++w) if (l_s[w] > 0) denom += l_s[w] * expf(m_s[w] - mx);
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float o = 0;
        for (int w = 0; w < WARPS; ++w) if (l_s[w] > 0) o += acc_s[w * hd + i] * expf(m_s[w] - mx);
        write(i, denom > 0 ? o / denom : 0.f);
    }
}

}  // namespace

}  // namespace lb::gpu
