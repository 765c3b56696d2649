// The DFlash draft's GPU operations (draft_ops.h). CPU references: ../cpu/draft_attention.cpp and
// engines/dflash/ddtree.cpp's top_k_logprobs.
#include <cmath>

#include "attention_common.cuh"
#include "draft_ops.h"

namespace lb::gpu {

namespace {

constexpr int kWarps = 16;     // warps a draft_attention block: keys are walked one a warp at a time
constexpr int kMaxPerLane = 16;  // head_dim up to 16 * warp size

__device__ __forceinline__ float cache_value(const float* row, int i) { return row[i]; }
__device__ __forceinline__ float cache_value(const unsigned short* row, int i) { return bf16_value(row[i]); }

// grid (n, nh): block (t, h) takes query row t, head h over the keys the mask leaves it
// (attention_row_online_softmax). T: the cache's element (float, or the bits of a bf16).
template <class T>
__global__ void draft_attention_kernel(const float* q, int ldq, int n, int nh, int nkv, int hd, int n_ctx,
                                       const T* kc, const T* vc, int causal, int window, float* out) {
    __shared__ float m_s[kWarps], l_s[kWarps];
    extern __shared__ float acc_s[];  // [kWarps, hd]
    const int t = blockIdx.x, h = blockIdx.y;
    const int kvh = h / (nh / nkv), qp = n_ctx + t;
    // the mask as a key range: causal keys end at the query; a window starts qp - window + 1 and, when not
    // causal, ends before qp + window
    int lo = 0, hi = n_ctx + n;
    if (causal) hi = qp + 1;
    if (window > 0) {
        lo = max(0, qp - window + 1);
        if (!causal) hi = min(hi, qp + window);
    }
    attention_row_online_softmax<kWarps, kMaxPerLane>(
        q + size_t(t) * ldq + size_t(h) * hd, hd, lo, hi, [](int) { return true; },
        [&](int key, int i) { return cache_value(kc + (size_t(key) * nkv + kvh) * hd, i); },
        [&](int key, int i) { return cache_value(vc + (size_t(key) * nkv + kvh) * hd, i); }, m_s, l_s, acc_s,
        [&](int i, float o) { out[size_t(t) * nh * hd + size_t(h) * hd + i] = o; });
}

// A (value, index) pair as one 64-bit key whose unsigned order is "larger value, then lower index": the
// value's bits made order-preserving in the high word, the complemented index in the low word. 0 = none.
__device__ __forceinline__ unsigned long long rank_key(float v, int idx) {
    unsigned u = __float_as_uint(v);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return (static_cast<unsigned long long>(u) << 32) | static_cast<unsigned>(~idx);
}
__device__ __forceinline__ float key_value(unsigned long long key) {
    unsigned u = unsigned(key >> 32);
    u = (u & 0x80000000u) ? (u & 0x7fffffffu) : ~u;
    return __uint_as_float(u);
}
__device__ __forceinline__ int key_index(unsigned long long key) { return int(~unsigned(key & 0xffffffffu)); }

__device__ __forceinline__ unsigned long long warp_max_u64(unsigned long long v) {
    for (int o = LB_WARP / 2; o > 0; o >>= 1) {
        const unsigned long long w = __shfl_xor_sync(0xffffffff, v, o, LB_WARP);
        v = w > v ? w : v;
    }
    return v;
}

constexpr int kTopKThreads = 256;
constexpr int kTopKAhead = 8;  // a thread's logits loaded at once

// One block a row. Each thread keeps the k best of its strided share (sorted, in registers) and an online
// max / sum of exponentials; the block then merges: k rounds of "the best head of every thread's list", the
// winner's list advancing, and the log-sum-exp from the threads' (max, sum) pairs in double.
__global__ __launch_bounds__(kTopKThreads) void draft_top_k_kernel(const float* logits, int vocab, int k,
                                                                    float multiplier, float softcap, int* ids,
                                                                    float* logprobs) {
    __shared__ unsigned long long best_s[kTopKThreads / 32];
    __shared__ float m_s[kTopKThreads / 32 * 2];
    __shared__ double sum_s[kTopKThreads];
    __shared__ float mrow_s;
    const float* row = logits + size_t(blockIdx.x) * vocab;
    unsigned long long list[kDraftTopKMax];
    for (int i = 0; i < kDraftTopKMax; ++i) list[i] = 0;
    float m = -INFINITY, s = 0.f;
    // A thread's share i = threadIdx.x + 256 t in order, its loads kTopKAhead at a time: one block a row
    // runs on few multiprocessors, where a load at a time would leave each warp waiting on memory.
    for (int base = threadIdx.x; base < vocab; base += kTopKThreads * kTopKAhead) {
        float zs[kTopKAhead];
#pragma unroll
        for (int a = 0; a < kTopKAhead; ++a) {
            const int i = base + a * kTopKThreads;
            zs[a] = i < vocab ? row[i] : 0.f;
        }
#pragma unroll
        for (int a = 0; a < kTopKAhead; ++a) {
            const int i = base + a * kTopKThreads;
            if (i >= vocab) break;
            float z = zs[a] * multiplier;
            if (softcap > 0.f) z = tanhf(z / softcap) * softcap;
            if (z > m) { s = s * expf(m - z) + 1.f; m = z; }
            else s += expf(z - m);
            const unsigned long long key = rank_key(z, i);
            if (key > list[k - 1]) {  // insertion into the sorted list (indices rise, so ties keep the earlier)
                int j = k - 1;
                for (; j > 0 && list[j - 1] < key; --j) list[j] = list[j - 1];
                list[j] = key;
            }
        }
    }
    const int lane = threadIdx.x % LB_WARP, warp = threadIdx.x / LB_WARP, nw = kTopKThreads / LB_WARP;
    // log-sum-exp: the row's max, then the threads' sums rescaled to it, added in double
    float wm = warp_max(m);
    if (lane == 0) m_s[warp] = wm;
    __syncthreads();
    if (threadIdx.x == 0) {
        float mx = -INFINITY;
        for (int w = 0; w < nw; ++w) mx = fmaxf(mx, m_s[w]);
        mrow_s = mx;
    }
    __syncthreads();
    const float mrow = mrow_s;
    sum_s[threadIdx.x] = s > 0.f ? double(s) * exp(double(m) - double(mrow)) : 0.0;
    __syncthreads();
    for (int stride = kTopKThreads / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) sum_s[threadIdx.x] += sum_s[threadIdx.x + stride];
        __syncthreads();
    }
    const float lse = mrow + float(log(sum_s[0]));
    // k rounds of the block's best list head
    int head = 0;
    for (int r = 0; r < k; ++r) {
        const unsigned long long mine = head < k ? list[head] : 0ull;
        const unsigned long long wbest = warp_max_u64(mine);
        if (lane == 0) best_s[warp] = wbest;
        __syncthreads();
        unsigned long long best = 0;
        for (int w = 0; w < nw; ++w) best = best_s[w] > best ? best_s[w] : best;
        if (best != 0 && mine == best) ++head;  // keys are unique (the index is in them): one winner
        if (threadIdx.x == 0) {
            ids[size_t(blockIdx.x) * k + r] = best ? key_index(best) : -1;
            logprobs[size_t(blockIdx.x) * k + r] = best ? key_value(best) - lse : -INFINITY;
        }
        __syncthreads();
    }
}

__global__ void gather_feature_rows_kernel(const float* src, int n_src, int nf, int H, const int* rows, float* dst) {
    const int i = blockIdx.x, f = blockIdx.y;
    const float* s = src + (size_t(f) * n_src + rows[i]) * H;
    float* d = dst + (size_t(i) * nf + f) * H;
    for (int e = threadIdx.x; e < H; e += blockDim.x) d[e] = s[e];
}

__global__ void scale_kernel(float* x, size_t count, float a) {
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < count) x[i] *= a;
}

}  // namespace

void draft_attention(const float* q, int ldq, int n, int nh, int nkv, int hd, int n_ctx, const void* kcache,
                     const void* vcache, DType cache_type, bool causal, int window, float* out, gpuStream_t s) {
    if (hd > kMaxPerLane * LB_WARP) fail("unsupported", "draft attention: head_dim " + std::to_string(hd) + " too large");
    const dim3 grid{unsigned(n), unsigned(nh)};
    const size_t shared = sizeof(float) * kWarps * hd;
    if (cache_type == DType::F32)
        draft_attention_kernel<float><<<grid, kWarps * LB_WARP, shared, s>>>(
            q, ldq, n, nh, nkv, hd, n_ctx, (const float*)kcache, (const float*)vcache, causal ? 1 : 0, window, out);
    else if (cache_type == DType::BF16)
        draft_attention_kernel<unsigned short><<<grid, kWarps * LB_WARP, shared, s>>>(
            q, ldq, n, nh, nkv, hd, n_ctx, (const unsigned short*)kcache, (const unsigned short*)vcache, causal ? 1 : 0,
            window, out);
    else
        fail("internal", "draft attention: a context cache of f32 or bf16 only");
}

void draft_top_k(const float* logits, int rows, int vocab, int k, float multiplier, float softcap, int* ids,
                 float* logprobs, gpuStream_t s) {
    if (k < 1 || k > kDraftTopKMax || k > vocab)
        fail("internal", "draft_top_k: k " + std::to_string(k) + " outside 1.." + std::to_string(kDraftTopKMax));
    if (rows <= 0) return;
    draft_top_k_kernel<<<unsigned(rows), kTopKThreads, 0, s>>>(logits, vocab, k, multiplier, softcap, ids, logprobs);
}

void gather_feature_rows(const float* src, int n_src, int nf, int H, const int* rows, int m, float* dst,
                         gpuStream_t s) {
    if (m <= 0 || nf <= 0) return;
    gather_feature_rows_kernel<<<dim3(unsigned(m), unsigned(nf)), 256, 0, s>>>(src, n_src, nf, H, rows, dst);
}

void scale(float* x, size_t count, float a, gpuStream_t s) {
    if (count == 0) return;
    scale_kernel<<<unsigned((count + 255) / 256), 256, 0, s>>>(x, count, a);
}

}  // namespace lb::gpu
