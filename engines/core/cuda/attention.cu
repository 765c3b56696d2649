// Full attention over a prefill chunk: the prologue (q/k norms, partial RoPE, cache append) and causal GQA
// attention, with the sigmoid output gate (Qwen3.5's gated attention) or without it (Qwen3's). qs is the
// query heads' stride in head dims: 2 when q_proj holds per head [query, gate], 1 when it holds queries only.
// CPU reference: ../cpu/attention.cpp, ../cpu/norms.cpp.
#include <climits>
#include <cmath>

#include "attention_split.h"
#include "common.cuh"
#include "mma.cuh"

namespace lb::gpu {

namespace {

// grid (n, nh + nkv), AP_THREADS threads: one block per q or k head of a token. The head's row (and a k
// head's v row) is read once, with the position, into shared memory: one round trip, where the old kernel
// re-read the row from global memory after each step. It is normalised (gain), rotated (partial RoPE) and
// written back once; a k head's block also stores its k and v rows in the caches. The gains and rotary
// frequencies, which depend on no earlier kernel, are read before the dependency wait.
// KVF >= 0: K and V caches both of type DType(KVF), fixed at compile time (one store path in the code; see
// attn_decode_flash_kernel).
constexpr int AP_THREADS = 128, AP_MAX_HD = 512, AP_PER = AP_MAX_HD / AP_THREADS;

template <int KVF>
__global__ __launch_bounds__(AP_THREADS) void attn_prep_kernel(float* qkv, int ld, int nh, int nkv, int hd, int rot,
                                                                float theta, const float* q_gain, const float* k_gain,
                                                                float eps, const int* d_pos, void* kcache, DType kt,
                                                                void* vcache, DType vt, int qs) {
    if (KVF >= 0) kt = vt = DType(KVF);
    __shared__ float xr[AP_MAX_HD], vr[AP_MAX_HD];
    const int t = blockIdx.x, h = blockIdx.y, tid = threadIdx.x, half = rot / 2;
    const bool is_q = h < nh;
    const float* gain = is_q ? q_gain : k_gain;
    float g[AP_PER], inv_freq[AP_PER];
#pragma unroll
    for (int k = 0; k < AP_PER; ++k) {
        const int i = tid + k * AP_THREADS;
        g[k] = i < hd ? gain[i] : 0.f;
        inv_freq[k] = i < half ? rope_inv_freq(i, rot, theta) : 0.f;
    }
    griddep_launch();
    griddep_wait();
    const int pos = *d_pos + t;
    float* row = qkv + size_t(t) * ld;
    float* v = is_q ? row + size_t(h) * qs * hd : row + qs * nh * hd + size_t(h - nh) * hd;
    const float* vv = row + qs * nh * hd + size_t(nkv) * hd + size_t(is_q ? 0 : h - nh) * hd;
    float ss = 0;
#pragma unroll
    for (int k = 0; k < AP_PER; ++k) {
        const int i = tid + k * AP_THREADS;
        if (i < hd) {
            const float x = v[i];
            xr[i] = x;
            ss += x * x;
            if (!is_q) vr[i] = vv[i];
        }
    }
    const float inv = rsqrtf(block_sum(ss) / hd + eps);
#pragma unroll
    for (int k = 0; k < AP_PER; ++k) {
        const int i = tid + k * AP_THREADS;
        if (i < hd) xr[i] = xr[i] * inv * g[k];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < AP_PER; ++k) {
        const int i = tid + k * AP_THREADS;
        if (i < half) {
            const float angle = float(pos) * inv_freq[k];
            float sn, cs;
            sincosf(angle, &sn, &cs);
            rope_rotate(xr, i, half, cs, sn);
        }
    }
    __syncthreads();
    for (int i = tid; i < hd; i += AP_THREADS) v[i] = xr[i];
    if (!is_q && tid < LB_WARP) {
        const size_t r = size_t(pos) * nkv + (h - nh);
        kv_store_warp(xr, hd, kt, (uint8_t*)kcache + r * kv_row_bytes(kt, hd));
        kv_store_warp(vr, hd, vt, (uint8_t*)vcache + r * kv_row_bytes(vt, hd));
    }
}

// grid (n, nh), 4 warps: each warp runs an online softmax over every 4th position, then the warps merge.
// Each lane holds hd / 32 output elements (hd <= 512).
constexpr int ATT_WARPS = 4;
__global__ void attention_kernel(const float* qkv, int ld, int nh, int nkv, int hd, const int* d_pos,
                                 const void* kcache, DType kt, const void* vcache, DType vt, float* out, int qs) {
    const int t = blockIdx.x, h = blockIdx.y, kvh = h / (nh / nkv);
    const int warp = threadIdx.x / LB_WARP, lane = threadIdx.x % LB_WARP;
    const int last = *d_pos + t;
    const float* q = qkv + size_t(t) * ld + size_t(h) * qs * hd;
    const float* gate = q + hd;  // qs == 2 only
    const int per = (hd + LB_WARP - 1) / LB_WARP;  // <= 16
    float qv[16], acc[16];
    for (int k = 0; k < per; ++k) {
        const int e = lane * per + k;
        qv[k] = e < hd ? q[e] : 0.f;
        acc[k] = 0.f;
    }
    const float scale = rsqrtf(float(hd));
    const size_t krow = kv_row_bytes(kt, hd), vrow = kv_row_bytes(vt, hd);
    float m = -FLT_MAX, l = 0.f;
    for (int s = warp; s <= last; s += ATT_WARPS) {
        const void* kr = (const uint8_t*)kcache + (size_t(s) * nkv + kvh) * krow;
        float d = 0;
        for (int k = 0; k < per; ++k) {
            const int e = lane * per + k;
            if (e < hd) d += qv[k] * kv_load(kr, kt, e);
        }
        const float score = warp_sum(d) * scale;
        const float m_new = fmaxf(m, score);
        const float corr = __expf(m - m_new), p = __expf(score - m_new);
        l = l * corr + p;
        const void* vr = (const uint8_t*)vcache + (size_t(s) * nkv + kvh) * vrow;
        for (int k = 0; k < per; ++k) {
            const int e = lane * per + k;
            acc[k] = acc[k] * corr + (e < hd ? p * kv_load(vr, vt, e) : 0.f);
        }
        m = m_new;
    }
    __shared__ float sm_m[ATT_WARPS], sm_l[ATT_WARPS];
    __shared__ float sm_acc[ATT_WARPS][512];
    if (lane == 0) { sm_m[warp] = m; sm_l[warp] = l; }
    for (int k = 0; k < per; ++k) {
        const int e = lane * per + k;
        if (e < hd) sm_acc[warp][e] = acc[k];
    }
    __syncthreads();
    float M = -FLT_MAX;
    for (int w = 0; w < ATT_WARPS; ++w) M = fmaxf(M, sm_m[w]);
    float L = 0;
    for (int w = 0; w < ATT_WARPS; ++w) L += sm_l[w] * __expf(sm_m[w] - M);
    for (int e = threadIdx.x; e < hd; e += blockDim.x) {
        float o = 0;
        for (int w = 0; w < ATT_WARPS; ++w) o += sm_acc[w][e] * __expf(sm_m[w] - M);
        out[(size_t(t) * nh + h) * hd + e] = qs == 2 ? o / L * sigmoidf(gate[e]) : o / L;
    }
}

#if defined(LB_CUDA)
// Prefill attention, tiled: same math as attention_kernel (scores q.k / sqrt(hd), causal online softmax in
// fp32 with __expf, o / l * sigmoid(gate)). Grid (ceil(n / rows), nkv), 256 threads; a block takes
// TA_QV = 32 query vectors: rows t0 .. t0 + rows - 1 (rows = 32 / G) times the G = nh / nkv query heads of
// KV head blockIdx.y (vector v = r * G + g is head kvh * G + g of row t0 + r). Keys go in tiles of TA_TK = 32
// positions, staged in shared memory as fp32 (through kv_load, so every cache type works) and shared by the
// 32 vectors. Per tile: (1) thread (v = tid / 8, sg = tid % 8) computes the scores of vector v with keys
// sg, sg + 8, sg + 16, sg + 24; (2) the same 8 threads reduce the tile maximum, rescale (m, l) and write
// p = exp(score - m) (0 where masked) to Ps and the factor exp(m_old - m_new) to corr_s; (3) warp w owns
// vectors 4w .. 4w + 3 and lane owns dims 4 lane + 128 c (+0..3): acc = acc * corr + sum_s p_s v_s.
// Row t (absolute position *d_pos + t) sees keys 0 .. *d_pos + t; key 0 is never masked, so m is finite
// after the first tile and the masked p are exact zeros (the K/V rows past the block's last key are zero).
constexpr int TA_QV = 32, TA_TK = 32, TA_THREADS = 256;
template <int HD>
constexpr size_t attention_tiled_smem() {
    return sizeof(float) * (size_t(TA_QV) * (HD + 4) + size_t(TA_TK) * (HD + 4) + size_t(TA_TK) * HD +
                            size_t(TA_QV) * (TA_TK + 4) + 2 * TA_QV);
}
template <int HD>
__global__ __launch_bounds__(TA_THREADS) void attention_tiled_kernel(const float* qkv, int ld, int n, int nh, int nkv,
                                                                     const int* d_pos, const void* kcache, DType kt,
                                                                     const void* vcache, DType vt, float* out, int qs) {
    static_assert(HD % 128 == 0, "lane owns HD / 32 dims as float4 chunks 128 apart");
    constexpr int LDQ = HD + 4;       // Qs / Ks row stride: rows r..r+7 start in 8 distinct 4-bank groups
    constexpr int LDP = TA_TK + 4;
    constexpr int NC = HD / 128;      // float4 chunks per lane in phase 3
    extern __shared__ __align__(16) float att_sm[];
    float* Qs = att_sm;                   // [QV][LDQ]
    float* Ks = Qs + TA_QV * LDQ;         // [TK][LDQ]
    float* Vs = Ks + TA_TK * LDQ;         // [TK][HD]
    float* Ps = Vs + TA_TK * HD;          // [QV][LDP]
    float* corr_s = Ps + TA_QV * LDP;     // [QV]
    float* l_s = corr_s + TA_QV;          // [QV]
    const int G = nh / nkv, rows = TA_QV / G;
    const int tile = gridDim.x - 1 - blockIdx.x;  // the longest (latest) tiles start first
    const int kvh = blockIdx.y, t0 = tile * rows;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int p0 = *d_pos;
    const int s_end = p0 + min(t0 + rows, n) - 1;  // last key any valid row of this block sees
    const float scale = rsqrtf(float(HD));
    const size_t krow = kv_row_bytes(kt, HD), vrow = kv_row_bytes(vt, HD);

    for (int e = tid; e < TA_QV * (HD / 4); e += TA_THREADS) {
        const int v = e / (HD / 4), d = (e % (HD / 4)) * 4;
        const int t = t0 + v / G, h = kvh * G + v % G;
        float4 q = make_float4(0.f, 0.f, 0.f, 0.f);
        if (t < n) q = *(const float4*)(qkv + size_t(t) * ld + size_t(h) * qs * HD + d);
        *(float4*)(Qs + v * LDQ + d) = q;
    }

    const int v1 = tid / 8, sg = tid % 8;       // phases 1-2
    const int last1 = p0 + t0 + v1 / G;         // last key of vector v1
    float m = -FLT_MAX, l = 0.f;                // identical in the 8 threads of v1
    float acc[4][NC][4];                        // phase 3: vectors 4 warp + a, dims c * 128 + 4 lane + i
#pragma unroll
    for (int a = 0; a < 4; ++a)
#pragma unroll
        for (int c = 0; c < NC; ++c)
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[a][c][i] = 0.f;

    for (int s0 = 0; s0 <= s_end; s0 += TA_TK) {
        __syncthreads();  // the previous tile's Ks, Vs, Ps, corr_s are no longer read
        for (int e = tid; e < TA_TK * HD; e += TA_THREADS) {
            const int j = e / HD, d = e % HD, sp = s0 + j;
            float kx = 0.f, vx = 0.f;
            if (sp <= s_end) {
                const size_t r = size_t(sp) * nkv + kvh;
                kx = kv_load((const uint8_t*)kcache + r * krow, kt, d);
                vx = kv_load((const uint8_t*)vcache + r * vrow, vt, d);
            }
            Ks[j * LDQ + d] = kx;
            Vs[j * HD + d] = vx;
        }
        __syncthreads();
        // (1) scores
        float sc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
        for (int d = 0; d < HD; d += 4) {
            const float4 q = *(const float4*)(Qs + v1 * LDQ + d);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float4 k = *(const float4*)(Ks + (sg + 8 * i) * LDQ + d);
                sc[i] += q.x * k.x + q.y * k.y + q.z * k.z + q.w * k.w;
            }
        }
        // (2) online softmax update of vector v1
        float mt = -FLT_MAX;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            sc[i] *= scale;
            if (s0 + sg + 8 * i <= last1) mt = fmaxf(mt, sc[i]);
        }
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffff, mt, 1));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffff, mt, 2));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffff, mt, 4));
        const float m_new = fmaxf(m, mt);
        const float corr = __expf(m - m_new);
        float ps = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float p = s0 + sg + 8 * i <= last1 ? __expf(sc[i] - m_new) : 0.f;
            Ps[v1 * LDP + sg + 8 * i] = p;
            ps += p;
        }
        ps += __shfl_xor_sync(0xffffffff, ps, 1);
        ps += __shfl_xor_sync(0xffffffff, ps, 2);
        ps += __shfl_xor_sync(0xffffffff, ps, 4);
        l = l * corr + ps;
        m = m_new;
        if (sg == 0) corr_s[v1] = corr;
        __syncthreads();
        // (3) acc = acc * corr + P V
#pragma unroll
        for (int a = 0; a < 4; ++a) {
            const float cr = corr_s[warp * 4 + a];
#pragma unroll
            for (int c = 0; c < NC; ++c)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[a][c][i] *= cr;
        }
#pragma unroll 2
        for (int j = 0; j < TA_TK; j += 4) {
            float4 p[4];
#pragma unroll
            for (int a = 0; a < 4; ++a) p[a] = *(const float4*)(Ps + (warp * 4 + a) * LDP + j);
#pragma unroll
            for (int jj = 0; jj < 4; ++jj) {
#pragma unroll
                for (int c = 0; c < NC; ++c) {
                    const float4 vv = *(const float4*)(Vs + (j + jj) * HD + c * 128 + lane * 4);
#pragma unroll
                    for (int a = 0; a < 4; ++a) {
                        const float pa = jj == 0 ? p[a].x : jj == 1 ? p[a].y : jj == 2 ? p[a].z : p[a].w;
                        acc[a][c][0] += pa * vv.x;
                        acc[a][c][1] += pa * vv.y;
                        acc[a][c][2] += pa * vv.z;
                        acc[a][c][3] += pa * vv.w;
                    }
                }
            }
        }
    }
    if (sg == 0) l_s[v1] = l;
    __syncthreads();
#pragma unroll
    for (int a = 0; a < 4; ++a) {
        const int v = warp * 4 + a, t = t0 + v / G, h = kvh * G + v % G;
        if (t >= n) continue;
        const float L = l_s[v];
        const float* gate = qkv + size_t(t) * ld + size_t(h) * qs * HD + HD;  // qs == 2 only
        float* o = out + (size_t(t) * nh + h) * HD;
#pragma unroll
        for (int c = 0; c < NC; ++c)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int e = c * 128 + lane * 4 + i;
                o[e] = qs == 2 ? acc[a][c][i] / L * sigmoidf(gate[e]) : acc[a][c][i] / L;
            }
    }
}

// Prefill attention on tensor cores (wmma: wtype inputs, fp32 accumulation). Same query vectors as
// attention_tiled_kernel: a block takes AW_QV = 64 vectors (rows t0 .. t0 + 64 / G - 1 times the G query
// heads of KV head blockIdx.y) and walks key tiles of AW_TK = 64 positions twice. Pass 1 finds each
// vector's softmax maximum m and sum l (online, fp32); pass 2 adds exp(s - m) / l times V into wmma
// accumulators, which can stay in registers because, with m and l final, nothing needs rescaling. That
// costs a second Q K^T (1.5x the tensor-core work of one pass) and keeps the 64 x HD output out of shared
// memory. Q, K, V and P are rounded to wtype, as the GEMMs round activations; scores, softmax and sums are
// fp32. Warp w computes score row block w / 2, column blocks 2 (w % 2) + {0, 1}, and output row block w / 2,
// columns (w % 2) HD / 2 .. + HD / 2. Masking as in attention_tiled_kernel.
constexpr int AW_QV = 64, AW_TK = 64, AW_THREADS = 256;
#if defined(LB_GPU_FP16)
constexpr DType AW_KV_NATIVE = DType::F16;  // a cache of this type is copied into shared memory as is
#else
constexpr DType AW_KV_NATIVE = DType::BF16;
#endif
template <int HD>
constexpr size_t attention_wmma_smem() {
    return sizeof(wtype) * 3 * AW_QV * (HD + 8) + sizeof(float) * AW_QV * (AW_TK + 4) +
           sizeof(wtype) * AW_QV * (AW_TK + 8);
}
template <int HD>
__global__ __launch_bounds__(AW_THREADS) void attention_wmma_kernel(const float* qkv, int ld, int n, int nh, int nkv,
                                                                    const int* d_pos, const void* kcache, DType kt,
                                                                    const void* vcache, DType vt, float* out, int qs,
                                                                    const int* sp_tiles, const int* sp_counts,
                                                                    int sp_max) {
    using namespace nvcuda;
    static_assert(AW_QV == AW_TK && AW_THREADS == 4 * AW_QV, "4 threads a vector in the softmax steps");
    constexpr int LDW = HD + 8, LDS = AW_TK + 4, LDP = AW_TK + 8;  // strides keep fragment rows 32-byte aligned
    constexpr int OCOLS = HD / 2, OFR = OCOLS / 16;
    extern __shared__ __align__(128) unsigned char aw_sm[];
    wtype* Qs = (wtype*)aw_sm;                   // [QV][LDW]
    wtype* Ks = Qs + AW_QV * LDW;                // [TK][LDW]
    wtype* Vs = Ks + AW_TK * LDW;                // [TK][LDW]
    float* Ss = (float*)(Vs + AW_TK * LDW);      // [QV][LDS]
    wtype* Ps = (wtype*)(Ss + AW_QV * LDS);      // [QV][LDP]
    const int G = nh / nkv, rows = AW_QV / G;
    const int tile = gridDim.x - 1 - blockIdx.x;  // the longest (latest) tiles start first
    const int kvh = blockIdx.y, t0 = tile * rows;
    const int tid = threadIdx.x, warp = tid / 32;
    const int p0 = *d_pos;
    const int s_end = p0 + min(t0 + rows, n) - 1;  // last key any valid row of this block sees
    const float scale = rsqrtf(float(HD));
    const size_t krow = kv_row_bytes(kt, HD), vrow = kv_row_bytes(vt, HD);

    for (int e = tid; e < AW_QV * (HD / 4); e += AW_THREADS) {
        const int v = e / (HD / 4), d = (e % (HD / 4)) * 4;
        const int t = t0 + v / G, h = kvh * G + v % G;
        float4 q = make_float4(0.f, 0.f, 0.f, 0.f);
        if (t < n) q = *(const float4*)(qkv + size_t(t) * ld + size_t(h) * qs * HD + d);
        wtype* dst = Qs + v * LDW + d;
        dst[0] = wtype(q.x); dst[1] = wtype(q.y); dst[2] = wtype(q.z); dst[3] = wtype(q.w);
    }
    // keys s0 .. s0 + TK - 1 of this KV head into dst (zero past s_end)
    auto load_tile = [&](wtype* dst, const void* cache, DType t, size_t rowb, int s0) {
        if (t == AW_KV_NATIVE) {
            for (int e = tid; e < AW_TK * (HD / 8); e += AW_THREADS) {
                const int j = e / (HD / 8), c = e % (HD / 8), sp = s0 + j;
                uint4 u = make_uint4(0u, 0u, 0u, 0u);
                if (sp <= s_end) u = ((const uint4*)((const uint8_t*)cache + (size_t(sp) * nkv + kvh) * rowb))[c];
                *(uint4*)(dst + j * LDW + c * 8) = u;
            }
        } else {
            for (int e = tid; e < AW_TK * HD; e += AW_THREADS) {
                const int j = e / HD, d = e % HD, sp = s0 + j;
                const float x = sp <= s_end ? kv_load((const uint8_t*)cache + (size_t(sp) * nkv + kvh) * rowb, t, d) : 0.f;
                dst[j * LDW + d] = wtype(x);
            }
        }
    };
    auto scores = [&]() {  // Ss = Q K^T for the staged tile
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> c[2];
        wmma::fill_fragment(c[0], 0.f);
        wmma::fill_fragment(c[1], 0.f);
        const int rb = warp / 2, cb = (warp % 2) * 2;
#pragma unroll 4
        for (int k = 0; k < HD; k += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, wtype, wmma::row_major> a;
            wmma::load_matrix_sync(a, Qs + rb * 16 * LDW + k, LDW);
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, wtype, wmma::col_major> b;
                wmma::load_matrix_sync(b, Ks + (cb + j) * 16 * LDW + k, LDW);
                wmma::mma_sync(c[j], a, b, c[j]);
            }
        }
#pragma unroll
        for (int j = 0; j < 2; ++j)
            wmma::store_matrix_sync(Ss + rb * 16 * LDS + (cb + j) * 16, c[j], LDS, wmma::mem_row_major);
    };

    // pass 1: the 4 threads of vector sv own keys 16 sq .. 16 sq + 15 of each tile; m and l are kept
    // identical in all 4
    // the key tiles this block reads: all up to s_end, or (block-sparse) the selected ones, ascending
    const int* my_tiles = sp_tiles ? sp_tiles + (size_t(tile) * nkv + kvh) * sp_max : nullptr;
    const int n_it = my_tiles ? sp_counts[size_t(tile) * nkv + kvh] : s_end / AW_TK + 1;
    const int sv = tid / 4, sq = tid % 4;
    const int last = p0 + t0 + sv / G;  // last key of vector sv
    float m = -FLT_MAX, l = 0.f;
    for (int it = 0; it < n_it; ++it) {
        const int s0 = my_tiles ? my_tiles[it] * AW_TK : it * AW_TK;
        __syncthreads();  // Qs written / the previous tile's Ks and Ss read
        load_tile(Ks, kcache, kt, krow, s0);
        __syncthreads();
        scores();
        __syncthreads();
        float sc[16], mt = -FLT_MAX;
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const int j = 16 * sq + i;
            sc[i] = Ss[sv * LDS + j] * scale;
            if (s0 + j <= last) mt = fmaxf(mt, sc[i]);
        }
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
        const float m_new = fmaxf(m, mt);
        float ps = 0.f;
#pragma unroll
        for (int i = 0; i < 16; ++i)
            if (s0 + 16 * sq + i <= last) ps += __expf(sc[i] - m_new);
        ps += __shfl_xor_sync(0xffffffffu, ps, 1);
        ps += __shfl_xor_sync(0xffffffffu, ps, 2);
        l = l * __expf(m - m_new) + ps;
        m = m_new;
    }
    // pass 2: o += (exp(s - m) / l) V
    const float inv_l = 1.f / l;
    const int orb = warp / 2, oc0 = (warp % 2) * OCOLS;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> o[OFR];
#pragma unroll
    for (int f = 0; f < OFR; ++f) wmma::fill_fragment(o[f], 0.f);
    for (int it = 0; it < n_it; ++it) {
        const int s0 = my_tiles ? my_tiles[it] * AW_TK : it * AW_TK;
        __syncthreads();  // the previous tile's Ks, Vs, Ss, Ps read
        load_tile(Ks, kcache, kt, krow, s0);
        load_tile(Vs, vcache, vt, vrow, s0);
        __syncthreads();
        scores();
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            const int j = 16 * sq + i;
            const float p = s0 + j <= last ? __expf(Ss[sv * LDS + j] * scale - m) * inv_l : 0.f;
            Ps[sv * LDP + j] = wtype(p);
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < AW_TK; k += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, wtype, wmma::row_major> a;
            wmma::load_matrix_sync(a, Ps + orb * 16 * LDP + k, LDP);
#pragma unroll
            for (int f = 0; f < OFR; ++f) {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, wtype, wmma::row_major> b;
                wmma::load_matrix_sync(b, Vs + k * LDW + oc0 + f * 16, LDW);
                wmma::mma_sync(o[f], a, b, o[f]);
            }
        }
    }
    __syncthreads();
    float* Os = (float*)Ks;  // [QV][HD] fp32 fits in the K and V tiles
#pragma unroll
    for (int f = 0; f < OFR; ++f)
        wmma::store_matrix_sync(Os + orb * 16 * HD + oc0 + f * 16, o[f], HD, wmma::mem_row_major);
    __syncthreads();
    for (int e = tid; e < AW_QV * HD; e += AW_THREADS) {
        const int v = e / HD, d = e % HD, t = t0 + v / G, h = kvh * G + v % G;
        if (t >= n) continue;
        const float o = Os[v * HD + d];
        out[(size_t(t) * nh + h) * HD + d] = qs == 2 ? o * sigmoidf(qkv[size_t(t) * ld + size_t(h) * 2 * HD + HD + d]) : o;
    }
}


constexpr int FA_MIN_ROWS = 16, FA_MAX_G = 16;  // flash_attention_kernel's shapes: rows, G = nh / nkv
#if !defined(LB_GPU_FP16)
// Prefill attention, FlashAttention-2 form (bf16 tensor cores through mma.sync m16n8k16, fp32 accumulation):
// the kernel CUDA bf16 builds use for head_dim 128 and 256 from FA_MIN_ROWS rows on (attention() below says
// which kernel serves which shape). Grid (query tiles, nkv), FA_THREADS threads. A block takes FA_BM = 128
// query vectors of KV head blockIdx.y: rows t0 .. t0 + rows - 1 (rows = FA_BM / G, floor) times its G query
// heads (vector v = r G + g is head kvh G + g of row t0 + r; vectors from rows G on are idle padding when G
// does not divide 128), and walks key tiles of FA_BN = 64 positions once, ascending (all up to the block's
// last key, or the block-sparse list of BlockSparse). Warp w owns vectors 16 w .. 16 w + 15 for the whole
// walk: S = Q K^T (16 x 64) stays in registers, the online softmax (fp32; raw-score maximum m, exp2 of the
// score times scale log2 e) rescales the warp's O (16 x HD, fp32 registers) and sum l, P is rounded to bf16
// and multiplied into O from registers, so nothing but K and V passes through shared memory after Q.
// K and V tiles go through FA_STAGES shared-memory buffers: a bf16 cache is copied with cp.async (the next
// tile in flight while this one is computed), any other cache type (q8_0, q4_0, f16, f32) is dequantised
// through kv_load into bf16 as the tile is stored. Rows are HD + 8 bf16 wide, so the 8 rows an ldmatrix reads
// start 16 bytes apart in the banks. Q is read as fp32 and rounded to bf16 (as the GEMMs round activations);
// for HD 128 each warp keeps its Q fragments in registers, for HD 256 (whose O takes 128 registers) they are
// re-read from shared memory each tile. Causal masking is applied only in tiles that reach past the block's
// first row's last key (the diagonal tiles); key 0 is never masked and tiles run ascending, so m is finite
// after the first tile and masked scores give exact zeros. K/V rows past the block's last key are zero-filled,
// so they never carry stale (possibly non-finite) cache bytes into P V.
constexpr int FA_BM = 128, FA_BN = 64, FA_WARPS = FA_BM / 16, FA_THREADS = FA_WARPS * 32, FA_STAGES = 2;
template <int HD>
constexpr size_t flash_attention_smem() {
    return sizeof(wtype) * size_t(FA_BM + 2 * FA_STAGES * FA_BN) * (HD + 8);
}

__device__ __forceinline__ unsigned smem_u32(const void* p) { return unsigned(__cvta_generic_to_shared(p)); }
__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
__device__ __forceinline__ void ldsm_x4_trans(unsigned (&r)[4], unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
// 16 bytes global -> shared, zero-filled (nothing read) where !valid
__device__ __forceinline__ void cp_async16_zfill(unsigned dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ float fast_exp2(float x) {  // ex2.approx: 2^-inf = +0
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(const unsigned*)&v;
}

template <int HD, bool NATIVE>  // NATIVE: bf16 K and V caches, copied with cp.async
__global__ __launch_bounds__(FA_THREADS, 1) void flash_attention_kernel(const float* qkv, int ld, int n, int nh, int nkv,
                                                                        const int* d_pos, const void* kcache, DType kt,
                                                                        const void* vcache, DType vt, float* out, int qs,
                                                                        const int* sp_tiles, const int* sp_counts,
                                                                        int sp_max, float* part, int p0_host) {
    static_assert(HD % 16 == 0 && FA_BN % 16 == 0, "whole mma k-steps");
    constexpr int LD = HD + 8;                  // shared row stride (bf16)
    constexpr int KSTEPS = HD / 16, NT = FA_BN / 8, DT = HD / 8;
    constexpr bool QREG = HD <= 128;            // Q fragments held in registers
    extern __shared__ __align__(128) unsigned char fa_sm[];
    wtype* Qs = (wtype*)fa_sm;                  // [BM][LD]
    wtype* Ks = Qs + FA_BM * LD;                // [STAGES][BN][LD]
    wtype* Vs = Ks + FA_STAGES * FA_BN * LD;    // [STAGES][BN][LD]
    const int G = nh / nkv, rows = FA_BM / G, nvec = rows * G;
    const int tile = gridDim.x - 1 - blockIdx.x;  // the longest (latest) tiles start first
    const int kvh = blockIdx.y, t0 = tile * rows;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int p0 = d_pos ? *d_pos : p0_host;
    const size_t krow = kv_row_bytes(kt, HD), vrow = kv_row_bytes(vt, HD);
    const int* my_tiles = sp_tiles ? sp_tiles + (size_t(tile) * nkv + kvh) * sp_max : nullptr;
    // the last key any valid row of this block sees, and the key tiles it1 .. it1 + n_it - 1 it walks
    int s_end = p0 + min(t0 + rows, n) - 1, it1 = 0;
    int n_it = my_tiles ? sp_counts[size_t(tile) * nkv + kvh] : s_end / FA_BN + 1;
    if (part) {  // split form: the keys before the rows' own (seen by every row), range blockIdx.z of gridDim.z
        s_end = p0 - 1;
        const int tiles = (p0 + FA_BN - 1) / FA_BN, per = (tiles + gridDim.z - 1) / gridDim.z;
        it1 = min(tiles, int(blockIdx.z) * per);
        n_it = min(tiles, it1 + per) - it1;
    }

    for (int e = tid; e < FA_BM * (HD / 4); e += FA_THREADS) {
        const int v = e / (HD / 4), d = (e % (HD / 4)) * 4;
        const int t = t0 + v / G, h = kvh * G + v % G;
        float4 q = make_float4(0.f, 0.f, 0.f, 0.f);
        if (v < nvec && t < n) q = *(const float4*)(qkv + size_t(t) * ld + size_t(h) * qs * HD + d);
        __nv_bfloat162* dst = (__nv_bfloat162*)(Qs + v * LD + d);
        dst[0] = __floats2bfloat162_rn(q.x, q.y);
        dst[1] = __floats2bfloat162_rn(q.z, q.w);
    }
    // key tile `it` of the walk into buffer st (rows past s_end zero)
    auto load_kv = [&](int it, int st) {
        const int s0 = (my_tiles ? my_tiles[it] : it1 + it) * FA_BN;
        wtype* kd = Ks + st * FA_BN * LD;
        wtype* vd = Vs + st * FA_BN * LD;
        if constexpr (NATIVE) {
            constexpr int CH = HD / 8;  // 16-byte chunks a row
#pragma unroll
            for (int e = tid; e < FA_BN * CH; e += FA_THREADS) {
                const int j = e / CH, c = e % CH, sp = s0 + j;
                const bool ok = sp <= s_end;
                const size_t r = size_t(ok ? sp : 0) * nkv + kvh;
                cp_async16_zfill(smem_u32(kd + j * LD + c * 8), (const uint8_t*)kcache + r * krow + c * 16, ok);
                cp_async16_zfill(smem_u32(vd + j * LD + c * 8), (const uint8_t*)vcache + r * vrow + c * 16, ok);
            }
        } else {
            for (int e = tid; e < FA_BN * (HD / 2); e += FA_THREADS) {
                const int j = e / (HD / 2), d = (e % (HD / 2)) * 2, sp = s0 + j;
                float k0 = 0.f, k1 = 0.f, v0 = 0.f, v1 = 0.f;
                if (sp <= s_end) {
                    const size_t r = size_t(sp) * nkv + kvh;
                    const uint8_t* kr = (const uint8_t*)kcache + r * krow;
                    const uint8_t* vr = (const uint8_t*)vcache + r * vrow;
                    k0 = kv_load(kr, kt, d);
                    k1 = kv_load(kr, kt, d + 1);
                    v0 = kv_load(vr, vt, d);
                    v1 = kv_load(vr, vt, d + 1);
                }
                *(__nv_bfloat162*)(kd + j * LD + d) = __floats2bfloat162_rn(k0, k1);
                *(__nv_bfloat162*)(vd + j * LD + d) = __floats2bfloat162_rn(v0, v1);
            }
        }
    };
    if (n_it > 0) load_kv(0, 0);
    cp_async_commit();
    __syncthreads();  // Qs

    // this thread's two vectors (accumulator rows lane / 4 and lane / 4 + 8 of the warp's 16) and their last keys
    int last[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const int v = warp * 16 + lane / 4 + 8 * i;
        last[i] = part ? s_end : v < nvec ? min(p0 + t0 + v / G, s_end) : p0 + t0;  // padding: any finite row
    }
    const int first_last = part ? s_end : p0 + t0;  // the smallest last key in the block
    unsigned qf[QREG ? KSTEPS : 1][4];
    if constexpr (QREG) {
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk)
            ldsm_x4(qf[kk], smem_u32(Qs + (warp * 16 + lane % 16) * LD + kk * 16 + (lane / 16) * 8));
    }
    const float sl2 = rsqrtf(float(HD)) * 1.4426950408889634f;  // scores to log2 units
    float o[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // l: this thread's columns only, summed at the end
    const int mi = lane / 8, mr = lane % 8;                    // ldmatrix: this lane's matrix and row

    for (int it = 0; it < n_it; ++it) {
        const int st = it % FA_STAGES;
        if (it + 1 < n_it) load_kv(it + 1, (it + 1) % FA_STAGES);
        cp_async_commit();
        cp_async_wait<1>();  // tile it landed (this thread's copies)
        __syncthreads();     // ... and everyone's
        const wtype* kb = Ks + st * FA_BN * LD;
        const wtype* vb = Vs + st * FA_BN * LD;
        const int s0 = (my_tiles ? my_tiles[it] : it1 + it) * FA_BN;

        float s[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk) {
            unsigned a[4];
            if constexpr (QREG) {
#pragma unroll
                for (int i = 0; i < 4; ++i) a[i] = qf[kk][i];
            } else {
                ldsm_x4(a, smem_u32(Qs + (warp * 16 + lane % 16) * LD + kk * 16 + (lane / 16) * 8));
            }
#pragma unroll
            for (int np = 0; np < NT / 2; ++np) {  // keys 16 np .. 16 np + 15: matrices (keys +0/+8) x (dims +0/+8)
                unsigned b[4];
                ldsm_x4(b, smem_u32(kb + (np * 16 + (mi / 2) * 8 + mr) * LD + kk * 16 + (mi % 2) * 8));
                mma_bf16_16816(s[2 * np], a, b[0], b[1]);
                mma_bf16_16816(s[2 * np + 1], a, b[2], b[3]);
            }
        }
        if (s0 + FA_BN - 1 > first_last) {  // a diagonal tile: mask keys past each vector's last
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i)
                    if (s0 + nt * 8 + 2 * (lane % 4) + (i & 1) > last[i / 2]) s[nt][i] = -INFINITY;
        }
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            mx[0] = fmaxf(mx[0], fmaxf(s[nt][0], s[nt][1]));
            mx[1] = fmaxf(mx[1], fmaxf(s[nt][2], s[nt][3]));
        }
        float corr[2], ms[2], rs[2] = {0.f, 0.f};
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 1));
            mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], 2));
            ms[i] = mx[i] == -INFINITY ? 0.f : mx[i] * sl2;
            corr[i] = fast_exp2(m[i] * sl2 - ms[i]);
            m[i] = mx[i];
        }
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                s[nt][i] = fast_exp2(fmaf(s[nt][i], sl2, -ms[i / 2]));
                rs[i / 2] += s[nt][i];
            }
#pragma unroll
        for (int i = 0; i < 2; ++i) l[i] = l[i] * corr[i] + rs[i];
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
            o[dt][0] *= corr[0];
            o[dt][1] *= corr[0];
            o[dt][2] *= corr[1];
            o[dt][3] *= corr[1];
        }
        // O += P V: the accumulators of score tiles 2 kk, 2 kk + 1 are the A fragment of keys 16 kk ..
#pragma unroll
        for (int kk = 0; kk < FA_BN / 16; ++kk) {
            const unsigned a[4] = {pack_bf16x2(s[2 * kk][0], s[2 * kk][1]), pack_bf16x2(s[2 * kk][2], s[2 * kk][3]),
                                   pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                   pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int dp = 0; dp < DT / 2; ++dp) {  // dims 16 dp ..: matrices (keys +0/+8) x (dims +0/+8), transposed
                unsigned b[4];
                ldsm_x4_trans(b, smem_u32(vb + (kk * 16 + (mi % 2) * 8 + mr) * LD + dp * 16 + (mi / 2) * 8));
                mma_bf16_16816(o[2 * dp], a, b[0], b[1]);
                mma_bf16_16816(o[2 * dp + 1], a, b[2], b[3]);
            }
        }
        __syncthreads();  // buffer st is free for tile it + 2
    }
    cp_async_wait<0>();
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
        const int v = warp * 16 + lane / 4 + 8 * i, t = t0 + v / G, h = kvh * G + v % G;
        if (v >= nvec || t >= n) continue;
        if (part) {  // the range's partial: O unnormalised, (m, l) with m in scaled-score units
            const size_t r = (size_t(blockIdx.z) * n + t) * nh + h;
            float* po = part + r * HD;
#pragma unroll
            for (int dt = 0; dt < DT; ++dt)
                *(float2*)(po + dt * 8 + 2 * (lane % 4)) = make_float2(o[dt][2 * i], o[dt][2 * i + 1]);
            if (lane % 4 == 0) {
                float* pml = part + size_t(gridDim.z) * n * nh * HD + 2 * r;
                pml[0] = l[i] > 0.f ? m[i] * rsqrtf(float(HD)) : -FLT_MAX;
                pml[1] = l[i];
            }
            continue;
        }
        const float inv = 1.f / l[i];
        const float* gate = qkv + size_t(t) * ld + size_t(h) * qs * HD + HD;  // qs == 2 only
        float* dst = out + (size_t(t) * nh + h) * HD;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
            const int d = dt * 8 + 2 * (lane % 4);
            float2 r = make_float2(o[dt][2 * i] * inv, o[dt][2 * i + 1] * inv);
            if (qs == 2) {
                r.x *= sigmoidf(gate[d]);
                r.y *= sigmoidf(gate[d + 1]);
            }
            *(float2*)(dst + d) = r;
        }
    }
}

// The second step of split-KV attention (attention_split below). grid (n, nh), SM_WARPS warps: row t, query
// head h. The split ranges of flash_attention_kernel covered the keys before this forward's rows; the rows'
// own keys (cache rows p0 .. p0 + n - 1) go through a warp online softmax here in fp32 (warp w takes keys
// w, w + SM_WARPS, ... that row t sees: j <= t (causal), or visible[t * n + j] (a verify tree)). Then the
// ranges' partials and the warps' are merged, ranges in order then warps in order (the result does not
// depend on which block ends first), o / L times sigmoid(gate) when qs == 2. Partials: O [splits][n][nh][HD]
// (unnormalised), then (m, l) [splits][n][nh][2] with m in scaled-score units (l = 0: a range with no key).
constexpr int SM_WARPS = 4, KS_MAX_SPLITS = 256;
template <int HD>
__global__ __launch_bounds__(SM_WARPS * 32) void attention_split_merge_kernel(
    const float* qkv, int ld, int n, int nh, int nkv, int qs, const int* d_pos, int p0_host, const void* kcache,
    DType kt, const void* vcache, DType vt, const unsigned char* visible, const float* part, int splits, float* out) {
    constexpr int PER = HD / 32;
    __shared__ float s_m[SM_WARPS], s_l[SM_WARPS];
    __shared__ __align__(16) float s_acc[SM_WARPS][HD];
    __shared__ float s_w[KS_MAX_SPLITS + SM_WARPS], s_lw[KS_MAX_SPLITS + SM_WARPS], s_L;
    const int t = blockIdx.x, h = blockIdx.y, kvh = h / (nh / nkv);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int p0 = d_pos ? *d_pos : p0_host;
    const float* q = qkv + size_t(t) * ld + size_t(h) * qs * HD;
    float qv[PER], acc[PER];
#pragma unroll
    for (int k = 0; k < PER; ++k) {
        qv[k] = q[lane + 32 * k];
        acc[k] = 0.f;
    }
    const float scale = rsqrtf(float(HD));
    const size_t krow = kv_row_bytes(kt, HD), vrow = kv_row_bytes(vt, HD);
    float m = -FLT_MAX, l = 0.f;
    for (int j = warp; j < n; j += SM_WARPS) {
        if (visible ? !visible[size_t(t) * n + j] : j > t) continue;
        const size_t r = size_t(p0 + j) * nkv + kvh;
        const uint8_t* kr = (const uint8_t*)kcache + r * krow;
        const uint8_t* vr = (const uint8_t*)vcache + r * vrow;
        float d = 0.f;
#pragma unroll
        for (int k = 0; k < PER; ++k) d += qv[k] * kv_load(kr, kt, lane + 32 * k);
        const float sc = warp_sum(d) * scale;
        const float m_new = fmaxf(m, sc), corr = __expf(m - m_new), p = __expf(sc - m_new);
        l = l * corr + p;
#pragma unroll
        for (int k = 0; k < PER; ++k) acc[k] = acc[k] * corr + p * kv_load(vr, vt, lane + 32 * k);
        m = m_new;
    }
    if (lane == 0) { s_m[warp] = m; s_l[warp] = l; }
#pragma unroll
    for (int k = 0; k < PER; ++k) s_acc[warp][lane + 32 * k] = acc[k];
    __syncthreads();
    const size_t r0 = size_t(t) * nh + h, stride = size_t(n) * nh;
    const float* pml = part + size_t(splits) * stride * HD;
    if (warp == 0) {  // weights exp(m_i - M) of the ranges, then the warps; L summed in that order
        float M = -FLT_MAX;
        for (int z = lane; z < splits + SM_WARPS; z += 32) {
            const float mz = z < splits ? pml[2 * (z * stride + r0)] : s_m[z - splits];
            const float lz = z < splits ? pml[2 * (z * stride + r0) + 1] : s_l[z - splits];
            if (lz > 0.f) M = fmaxf(M, mz);
        }
        M = warp_max(M);
        for (int z = lane; z < splits + SM_WARPS; z += 32) {
            const float mz = z < splits ? pml[2 * (z * stride + r0)] : s_m[z - splits];
            const float lz = z < splits ? pml[2 * (z * stride + r0) + 1] : s_l[z - splits];
            s_w[z] = lz > 0.f ? __expf(mz - M) : 0.f;
            s_lw[z] = lz;
        }
        __syncwarp();
        if (lane == 0) {
            float L = 0.f;
            for (int z = 0; z < splits + SM_WARPS; ++z) L += s_w[z] * s_lw[z];
            s_L = L;
        }
    }
    __syncthreads();
    const float inv = s_L > 0.f ? 1.f / s_L : 0.f;
    for (int e = threadIdx.x; e < HD; e += SM_WARPS * 32) {
        float o = 0.f;
        for (int z = 0; z < splits; ++z) o += s_w[z] * part[(z * stride + r0) * HD + e];
#pragma unroll
        for (int w = 0; w < SM_WARPS; ++w) o += s_w[splits + w] * s_acc[w][e];
        o *= inv;
        out[r0 * HD + e] = qs == 2 ? o * sigmoidf(q[HD + e]) : o;
    }
}
#endif  // !LB_GPU_FP16
// Block-sparse selection (BlockSparse in gpu_ops.h). kmean[(j * nkv + kvh) * hd + d]: the mean of the cached
// (rotated) keys of block j, positions j * BS_BLOCK .. min(+BS_BLOCK, end) - 1. grid (blocks, nkv).
constexpr int BS_BLOCK = 2 * AW_TK;
__global__ void key_block_mean_kernel(const void* kcache, DType kt, int nkv, int hd, int end, float* kmean) {
    const int j = blockIdx.x, kvh = blockIdx.y;
    const int p0 = j * BS_BLOCK, p1 = min(p0 + BS_BLOCK, end);
    const size_t krow = kv_row_bytes(kt, hd);
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float sum = 0.f;
        for (int p = p0; p < p1; ++p) sum += kv_load((const uint8_t*)kcache + (size_t(p) * nkv + kvh) * krow, kt, d);
        kmean[(size_t(j) * nkv + kvh) * hd + d] = sum / float(p1 - p0);
    }
}

// grid (query tiles, nkv), BSEL_THREADS threads, dynamic shared memory (hd + 2 key blocks) floats. A query
// tile is the attention kernel's (flash_attention_kernel's, or the wmma kernel's in fp16 builds): rows t0 ..
// t0 + rows - 1 of the chunk, the G query heads of KV head blockIdx.y. Its block score of key block j is
// mean(q) . kmean_j / sqrt(hd). Forced: j < sinks and the `recent` blocks up to the tile's own. Candidates:
// every other j whose score is within ln(alpha) of the tile's best (its softmax weight among the blocks at
// least alpha times the best's: upstream's rule). The budget bounds the candidates kept to
// ceil(budget * (blocks the tile sees)), the top-scoring ones (ties: the earlier block), so a tile's cost is
// bounded whatever the scores (budget >= 1: no bound). Writes the kept key tiles (FA_BN = AW_TK positions each,
// ascending) of the keys the tile sees; a tile whose last row is at or past dense_from gets every key tile.
// stats (optional): += kept key tiles, key tiles the dense walk would read.
constexpr int BSEL_THREADS = 256;
__device__ __forceinline__ int warp_sum_int(int v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__global__ __launch_bounds__(BSEL_THREADS) void block_select_kernel(const float* qkv, int ld, int qs, int n, int nh,
                                                                    int nkv, int hd, int rows, int pos0,
                                                                    const float* kmean, float log_alpha, int sinks,
                                                                    int recent, float budget, int dense_from,
                                                                    int max_tiles, int* tiles, int* counts,
                                                                    unsigned long long* stats) {
    extern __shared__ float bsel_sm[];
    float* qm = bsel_sm;           // [hd]
    float* sc = bsel_sm + hd;      // [key blocks]
    int* keep = (int*)(sc + (pos0 + n + BS_BLOCK - 1) / BS_BLOCK);  // [key blocks]
    __shared__ float red[BSEL_THREADS / 32];
    __shared__ int red_i[BSEL_THREADS / 32];
    const int G = nh / nkv, tid = threadIdx.x;
    const int tile = blockIdx.x, kvh = blockIdx.y, t0 = tile * rows, t1 = min(t0 + rows, n);
    const int last = pos0 + t1 - 1;        // the tile's last query position
    const int jl = last / BS_BLOCK;        // the last key block it sees
    const int s_tiles = last / AW_TK + 1;  // key tiles 0 .. s_tiles - 1 hold the keys it sees
    int* out = tiles + (size_t(tile) * nkv + kvh) * max_tiles;
    if (last >= dense_from) {
        for (int i = tid; i < s_tiles; i += blockDim.x) out[i] = i;
        if (tid == 0) {
            counts[size_t(tile) * nkv + kvh] = s_tiles;
            if (stats) {
                atomicAdd(stats, (unsigned long long)s_tiles);
                atomicAdd(stats + 1, (unsigned long long)s_tiles);
            }
        }
        return;
    }
    for (int d = tid; d < hd; d += blockDim.x) {
        float sum = 0.f;
        for (int t = t0; t < t1; ++t)
            for (int g = 0; g < G; ++g) sum += qkv[size_t(t) * ld + size_t(kvh * G + g) * qs * hd + d];
        qm[d] = sum / float((t1 - t0) * G);
    }
    __syncthreads();
    const float scale = rsqrtf(float(hd));
    float mx = -FLT_MAX;
    for (int j = tid; j <= jl; j += blockDim.x) {
        const float* km = kmean + (size_t(j) * nkv + kvh) * hd;
        float dot = 0.f;
        for (int d = 0; d < hd; ++d) dot += qm[d] * km[d];
        sc[j] = dot * scale;
        mx = fmaxf(mx, sc[j]);
    }
    mx = warp_max(mx);
    if (tid % 32 == 0) red[tid / 32] = mx;
    __syncthreads();
    float best = -FLT_MAX;
    for (int w = 0; w < int(blockDim.x / 32); ++w) best = fmaxf(best, red[w]);
    // forced blocks 1, candidates 2, dropped 0
    int n_cand = 0;
    for (int j = tid; j <= jl; j += blockDim.x) {
        const bool forced = j < sinks || j > jl - recent;
        keep[j] = forced ? 1 : sc[j] - best >= log_alpha ? 2 : 0;
        n_cand += keep[j] == 2;
    }
    n_cand = warp_sum_int(n_cand);
    if (tid % 32 == 0) red_i[tid / 32] = n_cand;
    __syncthreads();
    n_cand = 0;
    for (int w = 0; w < int(blockDim.x / 32); ++w) n_cand += red_i[w];
    const int cap = budget >= 1.f ? INT_MAX : int(ceilf(budget * float(jl + 1)));
    if (n_cand > cap) {  // keep the cap best candidates: rank = candidates ahead of j
        for (int j = tid; j <= jl; j += blockDim.x) {
            if (keep[j] != 2) continue;
            int rank = 0;
            for (int i = 0; i <= jl && rank < cap; ++i)
                rank += keep[i] >= 2 && (sc[i] > sc[j] || (sc[i] == sc[j] && i < j));
            if (rank >= cap) keep[j] = 3;  // over the budget (still a candidate in the others' ranks)
        }
        __syncthreads();
    }
    if (tid == 0) {
        int c = 0;
        for (int j = 0; j <= jl; ++j) {
            if (keep[j] != 1 && keep[j] != 2) continue;
            for (int k = 2 * j; k < 2 * j + 2 && k < s_tiles; ++k) out[c++] = k;
        }
        counts[size_t(tile) * nkv + kvh] = c;
        if (stats) {
            atomicAdd(stats, (unsigned long long)c);
            atomicAdd(stats + 1, (unsigned long long)s_tiles);
        }
    }
}
#endif

}  // namespace

void attn_prep(float* qkv, int ld, int n, int nh, int nkv, int hd, int rot, float theta, const float* q_gain,
               const float* k_gain, float eps, const int* d_pos, void* kcache, DType kt, void* vcache, DType vt,
               gpuStream_t s, bool gated) {
    if (hd > AP_MAX_HD || rot > hd) lb::fail("unsupported", "attention head_dim > 512 on the GPU");
    auto* kernel = kv_bf16_kernels(kt, vt) ? attn_prep_kernel<int(DType::BF16)> : attn_prep_kernel<-1>;
    launch_k(kernel, dim3(n, nh + nkv), dim3(AP_THREADS), 0, s, qkv, ld, nh, nkv, hd, rot, theta, q_gain, k_gain, eps,
             d_pos, kcache, kt, vcache, vt, gated ? 2 : 1);
}

namespace {
// Which kernel attention() runs for a shape (CUDA):
//   flash_attention_kernel<128|256>  head_dim 128 / 256, >= 16 rows, G = nh / nkv <= 16 (bf16 builds; every
//                                    cache type; the block-sparse lists);
//   attention_wmma_kernel<128|256>   the same shapes in fp16 builds (sm_75: no bf16 mma), 64 % G == 0;
//   attention_tiled_kernel<128|256>  8 .. 15 rows (or where the above do not fit), 32 % G == 0;
//   attention_kernel                 everything else: one-token steps, n < 8, other head_dims (the trained
//                                    reference drafter's 48, 64), G that divides neither tile.
// HIP runs attention_kernel only. Given a workspace's AttnScratch (forward_layers; verify_layers calls
// attention_split itself), attention() first takes the split forms where the single pass leaves the GPU idle:
//   attn_decode_flash_kernel         one row (attention_decode_ok: hd 128 / 256, G <= 8; HIP too): the
//                                    context in chunks over one wave of blocks, merged in order;
//   flash_attention_kernel, split    a few rows after 8 or more key tiles (attention_splits > 1: the single
//     + attention_split_merge_kernel pass's query tiles x nkv fill at most half the SMs): key ranges over one
//                                    wave, then the rows' own keys (causal, or the verify tree's mask) and the
//                                    ranges merged in order. verify_layers takes this form at any context
//                                    (one range below 8 tiles): its single pass would be tree_attention_kernel.
AttentionKernel attention_choice(int n, int nh, int nkv, int hd, int ld) {
#if defined(LB_CUDA)
    const int G = nkv > 0 ? nh / nkv : 0;
    if (G > 0 && nh % nkv == 0 && ld % 4 == 0 && (hd == 128 || hd == 256)) {
        const size_t limit = size_t(smem_optin_limit());
#if !defined(LB_GPU_FP16)
        const size_t fa = hd == 128 ? flash_attention_smem<128>() : flash_attention_smem<256>();
        if (n >= FA_MIN_ROWS && G <= FA_MAX_G && fa <= limit) return AttentionKernel::Flash;
#endif
        const size_t aw = hd == 128 ? attention_wmma_smem<128>() : attention_wmma_smem<256>();
        if (n >= 16 && AW_QV % G == 0 && aw <= limit) return AttentionKernel::Wmma;
        const size_t ta = hd == 128 ? attention_tiled_smem<128>() : attention_tiled_smem<256>();
        if (n >= 8 && TA_QV % G == 0 && ta <= limit) return AttentionKernel::Tiled;
    }
#endif
    return AttentionKernel::Rows;
}

// The kernel block-sparse attention runs in, and its query tile's rows (the selection's tiles must be its tiles).
#if defined(LB_CUDA) && !defined(LB_GPU_FP16)
constexpr AttentionKernel kSparseKernel = AttentionKernel::Flash;
int sparse_tile_rows(int G) { return FA_BM / G; }
#elif defined(LB_CUDA)
constexpr AttentionKernel kSparseKernel = AttentionKernel::Wmma;
int sparse_tile_rows(int G) { return std::max(1, AW_QV / G); }
#else  // HIP: no block-sparse attention (block_sparse_select answers false)
constexpr AttentionKernel kSparseKernel = AttentionKernel::Auto;
#endif
}  // namespace

AttentionKernel attention_kernel_for(int n, int nh, int nkv, int hd, int ld) { return attention_choice(n, nh, nkv, hd, ld); }

void BlockSparse::size_for(int chunk, int nh, int nkv, int hd, int ctx) {
#if defined(LB_CUDA)
    const int G = std::max(1, nh / std::max(1, nkv));
    rows = std::max(1, sparse_tile_rows(G));
    max_tiles = (ctx + AW_TK - 1) / AW_TK;
    tiles_ints = size_t((chunk + rows - 1) / rows) * nkv * max_tiles;
    counts_ints = tiles_ints / size_t(max_tiles);
    kmean_floats = size_t((ctx + BS_BLOCK - 1) / BS_BLOCK) * nkv * hd;
#endif
}

bool block_sparse_select(const float* qkv, int ld, int n, int nh, int nkv, int hd, bool gated, int pos0,
                         const void* kcache, DType kt, const BlockSparse& bs, gpuStream_t s) {
#if defined(LB_CUDA)
    if (attention_choice(n, nh, nkv, hd, ld) != kSparseKernel) return false;
    const int end = pos0 + n, G = nh / nkv, rows = sparse_tile_rows(G), n_tiles = (n + rows - 1) / rows;
    const int blocks = (end + BS_BLOCK - 1) / BS_BLOCK;
    if (bs.rows != rows || (end + AW_TK - 1) / AW_TK > bs.max_tiles || size_t(blocks) * nkv * hd > bs.kmean_floats ||
        size_t(n_tiles) * nkv > bs.counts_ints)
        lb::fail("internal", "block_sparse_select: scratch sized for a shorter context or chunk");
    key_block_mean_kernel<<<dim3(blocks, nkv), 128, 0, s>>>(kcache, kt, nkv, hd, end, bs.kmean);
    const size_t smem = sizeof(float) * size_t(hd + 2 * blocks);
    if (smem > size_t(smem_optin_limit())) lb::fail("unsupported", "block-sparse attention: context too long");
    launch_smem(block_select_kernel, dim3(n_tiles, nkv), dim3(BSEL_THREADS), smem, s, qkv, ld, gated ? 2 : 1, n, nh,
                nkv, hd, rows, pos0, (const float*)bs.kmean, std::log(bs.alpha), std::max(1, bs.sinks), bs.recent,
                bs.budget, bs.dense_from, bs.max_tiles, bs.tiles, bs.counts, bs.stats);
    return true;
#else
    return false;
#endif
}

int attention_splits(int n, int nh, int nkv, int hd, int ld, int len) {
#if defined(LB_CUDA) && !defined(LB_GPU_FP16)
    if (n < 1 || nkv < 1 || nh % nkv != 0 || ld % 4 != 0 || (hd != 128 && hd != 256)) return 0;
    const int G = nh / nkv;
    const size_t fa = hd == 128 ? flash_attention_smem<128>() : flash_attention_smem<256>();
    if (G > FA_MAX_G || fa > size_t(smem_optin_limit())) return 0;
    const int rows = FA_BM / G, blocks = (n + rows - 1) / rows * nkv;
    return std::min(kv_split_count(blocks, (len + FA_BN - 1) / FA_BN, dec().sms), KS_MAX_SPLITS);
#else
    (void)n; (void)nh; (void)nkv; (void)hd; (void)ld; (void)len;
    return 0;  // the split form runs flash_attention_kernel (bf16 tensor cores): CUDA bf16 builds only
#endif
}

size_t attention_split_scratch(int n, int nh, int hd, int splits) { return size_t(splits) * n * nh * (hd + 2); }

size_t attention_scratch_floats(int nh, int nkv, int hd) {
    // attention_splits keeps splits x (query tiles x nkv) <= the multiprocessors, and a query tile holds at
    // most FA_BM query vectors (rows x G), so splits x n x nh <= sms x FA_BM
    size_t split = 0;
#if defined(LB_CUDA) && !defined(LB_GPU_FP16)
    split = size_t(dec().sms) * FA_BM * (hd + 2);
#endif
    return std::max(split, attention_decode_scratch(nh, hd, attention_decode_blocks(nkv, 0)));
}

void attention_split(const float* qkv, int ld, int n, int nh, int nkv, int hd, const int* d_pos, int len,
                     const void* kcache, DType kt, const void* vcache, DType vt, const unsigned char* visible,
                     int splits, const AttnScratch& sc, float* out, gpuStream_t s, bool gated) {
#if defined(LB_CUDA) && !defined(LB_GPU_FP16)
    const int G = nkv > 0 ? nh / nkv : 0;
    if (G < 1 || nh % nkv != 0 || G > FA_MAX_G || ld % 4 != 0 || (hd != 128 && hd != 256) || splits < 1 ||
        splits > KS_MAX_SPLITS)
        lb::fail("internal", "attention_split: a shape or split count the split form does not take");
    if (attention_split_scratch(n, nh, hd, splits) > sc.floats)
        lb::fail("internal", "attention_split: scratch smaller than the split count needs");
    const int qs = gated ? 2 : 1, rows = FA_BM / G;
    const dim3 grid((n + rows - 1) / rows, nkv, splits);
    const bool native = kt == DType::BF16 && vt == DType::BF16;
    auto go = [&](auto kernel, size_t smem) {
        launch_smem(kernel, grid, dim3(FA_THREADS), smem, s, qkv, ld, n, nh, nkv, d_pos, kcache, kt, vcache, vt, out, qs,
                    (const int*)nullptr, (const int*)nullptr, 0, sc.part, len);
    };
    auto merge = [&](auto kernel) {
        kernel<<<dim3(n, nh), SM_WARPS * 32, 0, s>>>(qkv, ld, n, nh, nkv, qs, d_pos, len, kcache, kt, vcache, vt,
                                                     visible, (const float*)sc.part, splits, out);
    };
    if (hd == 128) {
        native ? go(flash_attention_kernel<128, true>, flash_attention_smem<128>())
               : go(flash_attention_kernel<128, false>, flash_attention_smem<128>());
        merge(attention_split_merge_kernel<128>);
    } else {
        native ? go(flash_attention_kernel<256, true>, flash_attention_smem<256>())
               : go(flash_attention_kernel<256, false>, flash_attention_smem<256>());
        merge(attention_split_merge_kernel<256>);
    }
#else
    (void)qkv; (void)ld; (void)n; (void)nh; (void)nkv; (void)hd; (void)d_pos; (void)len; (void)kcache; (void)kt;
    (void)vcache; (void)vt; (void)visible; (void)splits; (void)sc; (void)out; (void)s; (void)gated;
    lb::fail("unsupported", "split-KV attention needs the bf16 flash kernel (CUDA bf16 builds)");
#endif
}

void attention(const float* qkv, int ld, int n, int nh, int nkv, int hd, const int* d_pos, const void* kcache, DType kt,
               const void* vcache, DType vt, float* out, gpuStream_t s, bool gated, const BlockSparse* sparse,
               const AttnScratch* split, int len) {
    if (split && split->part && !sparse) {
        if (n == 1 && attention_decode_ok(nh, nkv, hd) &&
            attention_decode_scratch(nh, hd, split->decode_blocks) <= split->floats)
            return attention_decode(qkv, nh, nkv, hd, d_pos, kcache, kt, vcache, vt, split->decode_blocks, split->part,
                                    split->counters, out, s, gated);
        const int splits = n > 1 ? attention_splits(n, nh, nkv, hd, ld, len) : 1;
        if (splits > 1)
            return attention_split(qkv, ld, n, nh, nkv, hd, d_pos, len, kcache, kt, vcache, vt, nullptr, splits, *split,
                                   out, s, gated);
    }
    attention_with(AttentionKernel::Auto, qkv, ld, n, nh, nkv, hd, d_pos, kcache, kt, vcache, vt, out, s, gated, sparse);
}

void attention_with(AttentionKernel k, const float* qkv, int ld, int n, int nh, int nkv, int hd, const int* d_pos,
                    const void* kcache, DType kt, const void* vcache, DType vt, float* out, gpuStream_t s, bool gated,
                    const BlockSparse* sparse) {
    if (hd > 512) lb::fail("unsupported", "head_dim above 512");
    const AttentionKernel best = attention_choice(n, nh, nkv, hd, ld);
    if (k == AttentionKernel::Auto) k = best;
    if (sparse && k != kSparseKernel) lb::fail("internal", "block-sparse attention outside its kernel's shapes");
    const int qs = gated ? 2 : 1;
#if defined(LB_CUDA)
    const int G = nkv > 0 ? nh / nkv : 0;
    if (k != AttentionKernel::Rows && k != best) {
        // a named kernel (the op check, the benchmark): only where its own conditions hold
        bool ok = G > 0 && nh % nkv == 0 && ld % 4 == 0 && (hd == 128 || hd == 256);
        if (k == AttentionKernel::Flash) ok = ok && n >= FA_MIN_ROWS && G <= FA_MAX_G;
        if (k == AttentionKernel::Wmma) ok = ok && n >= 16 && AW_QV % G == 0;
        if (k == AttentionKernel::Tiled) ok = ok && n >= 8 && TA_QV % G == 0;
        if (!ok) lb::fail("unsupported", "attention_with: the named kernel does not take this shape");
    }
    const int* sp_tiles = sparse ? sparse->tiles : nullptr;
    const int* sp_counts = sparse ? sparse->counts : nullptr;
    const int sp_max = sparse ? sparse->max_tiles : 0;
    if (k == AttentionKernel::Flash) {
#if !defined(LB_GPU_FP16)
        const dim3 grid((n + FA_BM / G - 1) / (FA_BM / G), nkv);
        const bool native = kt == DType::BF16 && vt == DType::BF16;
        auto go = [&](auto kernel, size_t smem) {
            launch_smem(kernel, grid, dim3(FA_THREADS), smem, s, qkv, ld, n, nh, nkv, d_pos, kcache, kt, vcache, vt, out,
                        qs, sp_tiles, sp_counts, sp_max, (float*)nullptr, 0);
        };
        if (hd == 128)
            return native ? go(flash_attention_kernel<128, true>, flash_attention_smem<128>())
                          : go(flash_attention_kernel<128, false>, flash_attention_smem<128>());
        return native ? go(flash_attention_kernel<256, true>, flash_attention_smem<256>())
                      : go(flash_attention_kernel<256, false>, flash_attention_smem<256>());
#else
        lb::fail("unsupported", "flash_attention_kernel needs bf16 tensor cores (sm_80+)");
#endif
    }
    if (k == AttentionKernel::Wmma) {
        const dim3 grid((n + AW_QV / G - 1) / (AW_QV / G), nkv);
        auto go = [&](auto kernel, size_t smem) {
            launch_smem(kernel, grid, dim3(AW_THREADS), smem, s, qkv, ld, n, nh, nkv, d_pos, kcache, kt, vcache, vt, out,
                        qs, sp_tiles, sp_counts, sp_max);
        };
        if (hd == 128) return go(attention_wmma_kernel<128>, attention_wmma_smem<128>());
        return go(attention_wmma_kernel<256>, attention_wmma_smem<256>());
    }
    if (k == AttentionKernel::Tiled) {
        const dim3 grid((n + TA_QV / G - 1) / (TA_QV / G), nkv);
        auto go = [&](auto kernel, size_t smem) {
            launch_smem(kernel, grid, dim3(TA_THREADS), smem, s, qkv, ld, n, nh, nkv, d_pos, kcache, kt, vcache, vt, out,
                        qs);
        };
        if (hd == 128) return go(attention_tiled_kernel<128>, attention_tiled_smem<128>());
        return go(attention_tiled_kernel<256>, attention_tiled_smem<256>());
    }
#endif
    if (k != AttentionKernel::Rows) lb::fail("unsupported", "attention_with: the named kernel is CUDA's");
    attention_kernel<<<dim3(n, nh), ATT_WARPS * LB_WARP, 0, s>>>(qkv, ld, nh, nkv, hd, d_pos, kcache, kt, vcache, vt, out,
                                                               qs);
}

}  // namespace lb::gpu
