// PFlash importance on the GPU: the attention probabilities of a scored forward's tail rows over every key,
// reduced by the max over query heads, with q and k before RoPE (backend.h, TailScores). The queries come
// from the forward's qkv rows after attn_prep (normalised and rotated) and the keys from the KV cache; both
// are un-rotated here (RoPE at -pos is the inverse rotation). CPU reference: ../cpu/tail_scores.cpp, which
// the CPU backend feeds with the un-rotated cache too.
//
// Three kernels: (1) raw scores S[h, t, s] = q_h,t . k_s / sqrt(hd) for every query head h, tail row t and
// position s < ctx; (2) per (h, t) the maximum and the sum of exp over the row's visible positions
// (s <= pos_t); (3) probs[t, s] = max_h exp(S - max) / sum, 0 past pos_t.
#include "common.cuh"

namespace lb::gpu {

namespace {

constexpr int TS_MAX_HD = 512;

// qpre[t, h, :] = RoPE(-pos_t) of query head h of tail row t (row n - n_tail + t of qkv).
__global__ void tail_q_kernel(const float* qkv, int ld, int qs, int hd, int rot, float theta, int pos0, float* qpre) {
    const int t = blockIdx.x, h = blockIdx.y, nh = gridDim.y;
    const float* q = qkv + size_t(t) * ld + size_t(h) * qs * hd;
    float* o = qpre + (size_t(t) * nh + h) * hd;
    const float pos = float(pos0 + t);
    for (int i = threadIdx.x; i < hd; i += blockDim.x) o[i] = rope_inverse(q, i, rot, theta, pos);
}

// grid (ceil(ctx / 8), nkv), 8 warps: warp w un-rotates key s = 8 blockIdx.x + w of KV head blockIdx.y into
// shared memory, then scores it against the G query heads of that KV head in every tail row.
constexpr int TS_WARPS = 8;
__global__ void tail_raw_kernel(const float* qpre, int n_tail, int nh, int nkv, int hd, int rot, float theta,
                                const void* kcache, DType kt, int ctx, float* S) {
    __shared__ float ks[TS_WARPS][TS_MAX_HD];
    const int warp = threadIdx.x / LB_WARP, lane = threadIdx.x % LB_WARP;
    const int s = blockIdx.x * TS_WARPS + warp, kvh = blockIdx.y, G = nh / nkv;
    if (s >= ctx) return;  // whole warps only: no block-wide barrier below
    const uint8_t* row = (const uint8_t*)kcache + (size_t(s) * nkv + kvh) * kv_row_bytes(kt, hd);
    float* k = ks[warp];
    for (int i = lane; i < hd; i += LB_WARP) k[i] = kv_load(row, kt, i);
    __syncwarp();
    constexpr int PER = TS_MAX_HD / LB_WARP;
    float kr[PER];  // lane's dims lane, lane + 32, ... (unrolled: kept in registers)
    const float pos = float(s);
#pragma unroll
    for (int c = 0; c < PER; ++c) {
        const int i = lane + c * LB_WARP;
        kr[c] = i < hd ? rope_inverse(k, i, rot, theta, pos) : 0.f;
    }
    const float scale = rsqrtf(float(hd));
    for (int t = 0; t < n_tail; ++t)
        for (int g = 0; g < G; ++g) {
            const int h = kvh * G + g;
            const float* q = qpre + (size_t(t) * nh + h) * hd;
            float d = 0.f;
#pragma unroll
            for (int c = 0; c < PER; ++c) {
                const int i = lane + c * LB_WARP;
                if (i < hd) d += q[i] * kr[c];
            }
            d = warp_sum(d);
            if (lane == 0) S[(size_t(h) * n_tail + t) * ctx + s] = d * scale;
        }
}

// grid (nh * n_tail), 1024 threads: the row's max and 1 / sum of exp over s <= pos0 + t.
constexpr int TS_RED = 1024;
__global__ __launch_bounds__(TS_RED) void tail_softmax_kernel(const float* S, int n_tail, int ctx, int pos0,
                                                              float* stats) {
    __shared__ float part[TS_RED / 32];
    const int r = blockIdx.x, t = r % n_tail, last = min(pos0 + t, ctx - 1);
    const float* row = S + size_t(r) * ctx;
    const int lane = threadIdx.x % LB_WARP, warp = threadIdx.x / LB_WARP, nw = blockDim.x / LB_WARP;
    float m = -FLT_MAX;
    for (int s = threadIdx.x; s <= last; s += blockDim.x) m = fmaxf(m, row[s]);
    m = warp_max(m);
    if (lane == 0) part[warp] = m;
    __syncthreads();
    m = -FLT_MAX;
    for (int w = 0; w < nw; ++w) m = fmaxf(m, part[w]);
    __syncthreads();
    float sum = 0.f;
    for (int s = threadIdx.x; s <= last; s += blockDim.x) sum += expf(row[s] - m);
    sum = warp_sum(sum);
    if (lane == 0) part[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.f;
        for (int w = 0; w < nw; ++w) total += part[w];
        stats[2 * r] = m;
        stats[2 * r + 1] = 1.f / total;
    }
}

// grid (ceil(ctx / 256), n_tail), 256 threads: probs[t, s].
__global__ void tail_probs_kernel(const float* S, const float* stats, int nh, int n_tail, int ctx, int pos0,
                                  float* probs) {
    const int t = blockIdx.y, s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= ctx) return;
    float p = 0.f;
    if (s <= pos0 + t)
        for (int h = 0; h < nh; ++h) {
            const size_t r = size_t(h) * n_tail + t;
            p = fmaxf(p, expf(S[r * ctx + s] - stats[2 * r]) * stats[2 * r + 1]);
        }
    probs[size_t(t) * ctx + s] = p;
}

}  // namespace

size_t tail_scores_scratch(int n_tail, int nh, int hd, int ctx) {
    return size_t(n_tail) * nh * hd + size_t(nh) * n_tail * ctx + 2 * size_t(nh) * n_tail;
}

void tail_scores(const float* qkv, int ld, bool gated, int n_tail, int nh, int nkv, int hd, int rot, float theta,
                 const void* kcache, DType kt, int ctx, float* scratch, float* probs, gpuStream_t s) {
    if (hd > TS_MAX_HD || rot > hd || nh % nkv != 0 || n_tail < 1 || n_tail > ctx)
        lb::fail("unsupported", "tail scores: head_dim above 512, or a bad shape");
    const int pos0 = ctx - n_tail;  // the tail rows are the sequence's last
    float* qpre = scratch;
    float* S = qpre + size_t(n_tail) * nh * hd;
    float* stats = S + size_t(nh) * n_tail * ctx;
    tail_q_kernel<<<dim3(n_tail, nh), 128, 0, s>>>(qkv, ld, gated ? 2 : 1, hd, rot, theta, pos0, qpre);
    tail_raw_kernel<<<dim3((ctx + TS_WARPS - 1) / TS_WARPS, nkv), TS_WARPS * LB_WARP, 0, s>>>(
        qpre, n_tail, nh, nkv, hd, rot, theta, kcache, kt, ctx, S);
    tail_softmax_kernel<<<nh * n_tail, TS_RED, 0, s>>>(S, n_tail, ctx, pos0, stats);
    tail_probs_kernel<<<dim3((ctx + 255) / 256, n_tail), 256, 0, s>>>(S, stats, nh, n_tail, ctx, pos0, probs);
}

}  // namespace lb::gpu
