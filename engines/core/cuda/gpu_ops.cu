// The kernels. Each mirrors the CPU reference function of the same name in ../cpu/.
#include <cfloat>

#include "gpu_ops.h"

#if !defined(__HIPCC__) && !defined(LB_USE_HIP)
#include <mma.h>
#endif

namespace lb::gpu {

namespace {

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = LB_WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o, LB_WARP);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
    for (int o = LB_WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o, LB_WARP));
    return v;
}
// Sum over a block of blockDim.x threads (multiple of the warp size); all threads get the result.
__device__ float block_sum(float v) {
    __shared__ float part[32];
    __shared__ float total;
    const int lane = threadIdx.x % LB_WARP, warp = threadIdx.x / LB_WARP;
    v = warp_sum(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0;
        for (int i = 0; i < int(blockDim.x / LB_WARP); ++i) t += part[i];
        total = t;
    }
    __syncthreads();
    float r = total;
    __syncthreads();
    return r;
}
__device__ __forceinline__ float silu(float x) { return x / (1.f + __expf(-x)); }
__device__ __forceinline__ float sigmoidf(float x) { return 1.f / (1.f + __expf(-x)); }

// ----------------------------------------------------------------------------------------- KV element access

__device__ float kv_load(const void* row, DType t, int e) {
    switch (t) {
        case DType::F32: return ((const float*)row)[e];
        case DType::F16: return __half2float(((const __half*)row)[e]);
        case DType::BF16: {
            unsigned int bits = unsigned(((const unsigned short*)row)[e]) << 16;
            return __uint_as_float(bits);
        }
        case DType::Q8_0: {
            const BlockQ8_0* b = (const BlockQ8_0*)row + e / QK;
            return __half2float(__ushort_as_half(b->d)) * b->qs[e % QK];
        }
        case DType::Q4_0: {
            const BlockQ4_0* b = (const BlockQ4_0*)row + e / QK;
            const int j = e % QK;
            const int q = j < QK / 2 ? (b->qs[j] & 0xF) : (b->qs[j - QK / 2] >> 4);
            return __half2float(__ushort_as_half(b->d)) * (q - 8);
        }
        default: return 0.f;
    }
}

__host__ __device__ size_t kv_row_bytes(DType t, int hd) {
    switch (t) {
        case DType::F32: return size_t(hd) * 4;
        case DType::F16: case DType::BF16: return size_t(hd) * 2;
        case DType::Q8_0: return size_t(hd / QK) * sizeof(BlockQ8_0);
        case DType::Q4_0: return size_t(hd / QK) * sizeof(BlockQ4_0);
        default: return 0;
    }
}

// Encodes one head row of hd values with one warp (hd a multiple of 32 for quantised types); the
// rounding follows quant.cpp so CPU and GPU caches hold the same bytes.
__device__ void kv_store_warp(const float* x, int hd, DType t, void* row) {
    const int lane = threadIdx.x % LB_WARP;
    if (t == DType::F32) { for (int e = lane; e < hd; e += LB_WARP) ((float*)row)[e] = x[e]; return; }
    if (t == DType::F16) { for (int e = lane; e < hd; e += LB_WARP) ((__half*)row)[e] = __float2half_rn(x[e]); return; }
    if (t == DType::BF16) {
        for (int e = lane; e < hd; e += LB_WARP) {
            unsigned int bits = __float_as_uint(x[e]);
            bits += 0x7fff + ((bits >> 16) & 1);
            ((unsigned short*)row)[e] = (unsigned short)(bits >> 16);
        }
        return;
    }
    for (int blk = 0; blk < hd / QK; ++blk) {
        const float v = lane < QK ? x[blk * QK + lane] : 0.f;
        if (t == DType::Q8_0) {
            const float amax = warp_max(fabsf(v));
            const float d = amax / 127.f;
            const float id = d != 0.f ? 1.f / d : 0.f;
            BlockQ8_0* b = (BlockQ8_0*)row + blk;
            if (lane == 0) b->d = __half_as_ushort(__float2half_rn(d));
            if (lane < QK) b->qs[lane] = (int8_t)lrintf(v * id);
        } else {  // Q4_0: scale from the signed value of largest magnitude (maps to -8)
            float amax = fabsf(v), vmax = v;
            for (int o = LB_WARP / 2; o > 0; o >>= 1) {
                const float oa = __shfl_xor_sync(0xffffffff, amax, o, LB_WARP);
                const float ov = __shfl_xor_sync(0xffffffff, vmax, o, LB_WARP);
                if (oa > amax || (oa == amax && ov < vmax)) { amax = oa; vmax = ov; }
            }
            const float d = vmax / -8.f;
            const float id = d != 0.f ? 1.f / d : 0.f;
            const int q = min(15, int(v * id + 8.5f));
            const int hi = __shfl_down_sync(0xffffffff, q, QK / 2, LB_WARP);
            BlockQ4_0* b = (BlockQ4_0*)row + blk;
            if (lane == 0) b->d = __half_as_ushort(__float2half_rn(d));
            if (lane < QK / 2) b->qs[lane] = (uint8_t)(q | (hi << 4));
        }
    }
}

// ----------------------------------------------------------------------------------------- kernels

__global__ void embed_kernel(const int* tokens, const wtype* E, int H, float* x) {
    const int t = blockIdx.x;
    const wtype* row = E + size_t(tokens[t]) * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x) x[size_t(t) * H + i] = w2f(row[i]);
}

// One warp per output row; all n (<= 8) tokens share each weight load. 128-bit loads when aligned.
template <int N>
__global__ void gemv_kernel(const float* __restrict__ x, int in, const wtype* __restrict__ W, int out,
                            float* __restrict__ y, bool accumulate) {
    const int warps = blockDim.x / LB_WARP;
    const int row = blockIdx.x * warps + threadIdx.x / LB_WARP;
    const int lane = threadIdx.x % LB_WARP;
    if (row >= out) return;
    float acc[N];
    for (int t = 0; t < N; ++t) acc[t] = 0.f;
    const wtype* w = W + size_t(row) * in;
    if (in % 8 == 0) {
        const uint4* w4 = (const uint4*)w;
        for (int i = lane; i < in / 8; i += LB_WARP) {
            const uint4 packed = w4[i];
            const wtype* wv = (const wtype*)&packed;
            float wf[8];
            for (int j = 0; j < 8; ++j) wf[j] = w2f(wv[j]);
            for (int t = 0; t < N; ++t) {
                const float4 xa = ((const float4*)(x + size_t(t) * in))[2 * i];
                const float4 xb = ((const float4*)(x + size_t(t) * in))[2 * i + 1];
                acc[t] += wf[0] * xa.x + wf[1] * xa.y + wf[2] * xa.z + wf[3] * xa.w + wf[4] * xb.x + wf[5] * xb.y +
                          wf[6] * xb.z + wf[7] * xb.w;
            }
        }
    } else {
        for (int i = lane; i < in; i += LB_WARP) {
            const float wf = w2f(w[i]);
            for (int t = 0; t < N; ++t) acc[t] += wf * x[size_t(t) * in + i];
        }
    }
    for (int t = 0; t < N; ++t) {
        const float v = warp_sum(acc[t]);
        if (lane == 0) {
            float* dst = y + size_t(t) * out + row;
            *dst = accumulate ? *dst + v : v;
        }
    }
}

#if !defined(__HIPCC__) && !defined(LB_USE_HIP)
// Tensor-core GEMM: 64x64 output tile per block of 4 warps (2x2 warps of 32x32), K step 32. The fp32
// activations are rounded to wtype while staged in shared memory; accumulation is fp32.
constexpr int TM = 64, TN = 64, TK = 32, PAD = 8;
__global__ void gemm_kernel(const float* __restrict__ x, int n, int in, const wtype* __restrict__ W, int out,
                            float* __restrict__ y, bool accumulate) {
    using namespace nvcuda;
    __shared__ __align__(32) wtype As[TM][TK + PAD];
    __shared__ __align__(32) wtype Bs[TN][TK + PAD];
    __shared__ __align__(32) float Cs[TM][TN + 4];
    const int m0 = blockIdx.y * TM, n0 = blockIdx.x * TN;
    const int warp = threadIdx.x / 32, wm = warp / 2, wn = warp % 2;
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c[2][2];
    for (int i = 0; i < 2; ++i) for (int j = 0; j < 2; ++j) wmma::fill_fragment(c[i][j], 0.f);
    for (int k0 = 0; k0 < in; k0 += TK) {
        for (int e = threadIdx.x; e < TM * TK; e += blockDim.x) {
            const int r = e / TK, kk = e % TK;
            const int gm = m0 + r, gk = k0 + kk;
            As[r][kk] = wtype(gm < n && gk < in ? x[size_t(gm) * in + gk] : 0.f);
            const int gn = n0 + r;
            Bs[r][kk] = gn < out && gk < in ? W[size_t(gn) * in + gk] : wtype(0.f);
        }
        __syncthreads();
        for (int kk = 0; kk < TK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, wtype, wmma::row_major> a[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, wtype, wmma::col_major> b[2];
            for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(a[i], &As[wm * 32 + i * 16][kk], TK + PAD);
            for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(b[j], &Bs[wn * 32 + j * 16][kk], TK + PAD);
            for (int i = 0; i < 2; ++i) for (int j = 0; j < 2; ++j) wmma::mma_sync(c[i][j], a[i], b[j], c[i][j]);
        }
        __syncthreads();
    }
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j)
            wmma::store_matrix_sync(&Cs[wm * 32 + i * 16][wn * 32 + j * 16], c[i][j], TN + 4, wmma::mem_row_major);
    __syncthreads();
    for (int e = threadIdx.x; e < TM * TN; e += blockDim.x) {
        const int r = e / TN, cc = e % TN;
        const int gm = m0 + r, gn = n0 + cc;
        if (gm < n && gn < out) {
            float* dst = y + size_t(gm) * out + gn;
            *dst = accumulate ? *dst + Cs[r][cc] : Cs[r][cc];
        }
    }
}
#endif

__global__ void rmsnorm_kernel(const float* x, const float* gain, float* y, int dim, float eps) {
    const float* xr = x + size_t(blockIdx.x) * dim;
    float* yr = y + size_t(blockIdx.x) * dim;
    float ss = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    const float inv = rsqrtf(block_sum(ss) / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * inv * gain[i];
}

__global__ void conv1d_silu_kernel(const float* x, int ldx, int n, int C, int K, const float* w, float* state, float* y) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float win[8];  // the K-1 previous inputs (K <= 8), oldest first
    for (int j = 0; j < K - 1; ++j) win[j] = state[size_t(c) * (K - 1) + j];
    const float* wc = w + size_t(c) * K;
    for (int t = 0; t < n; ++t) {
        const float cur = x[size_t(t) * ldx + c];
        float acc = wc[K - 1] * cur;
        for (int j = 0; j < K - 1; ++j) acc += wc[j] * win[j];
        y[size_t(t) * C + c] = silu(acc);
        for (int j = 0; j + 1 < K - 1; ++j) win[j] = win[j + 1];
        if (K > 1) win[K - 2] = cur;
    }
    for (int j = 0; j < K - 1; ++j) state[size_t(c) * (K - 1) + j] = win[j];
}

// grid (n, 2 * hk + 1): blocks y < 2*hk normalise one q or k head; the last one computes g and beta.
__global__ void deltanet_prep_kernel(float* y, int ldy, const float* proj, int ldp, int b_off, const float* negA,
                                     const float* dt_bias, int hk, int dk, int hv, float* g, float* beta) {
    const int t = blockIdx.x, h = blockIdx.y;
    if (h == 2 * hk) {
        for (int i = threadIdx.x; i < hv; i += blockDim.x) {
            const float b = proj[size_t(t) * ldp + b_off + i];
            const float a = proj[size_t(t) * ldp + b_off + hv + i] + dt_bias[i];
            const float sp = a > 20.f ? a : log1pf(expf(a));
            beta[size_t(t) * hv + i] = sigmoidf(b);
            g[size_t(t) * hv + i] = negA[i] * sp;
        }
        return;
    }
    float* v = y + size_t(t) * ldy + size_t(h) * dk;  // q heads then k heads
    float ss = 0;
    for (int i = threadIdx.x; i < dk; i += blockDim.x) ss += v[i] * v[i];
    float inv = rsqrtf(block_sum(ss) + 1e-6f);
    if (h < hk) inv *= rsqrtf(float(dk));
    for (int i = threadIdx.x; i < dk; i += blockDim.x) v[i] *= inv;
}

// One block per value head; chunks of C tokens in sequence. Shared memory: K, Q [C][dk], U [C][dv],
// KK, QK [C][C], gamma, beta [C]. Thread j < dv owns column j of U for the forward substitution.
constexpr int DC = 16;
__global__ void delta_rule_kernel(const float* qkv, int ld, int n, int hk, int hv, int dk, int dv, const float* g,
                                  const float* beta, float* state, float* out) {
    extern __shared__ float sm[];
    float* Ks = sm;
    float* Qs = Ks + DC * dk;
    float* Us = Qs + DC * dk;
    float* Ws = Us + DC * dv;   // K S0, then reused
    float* QSs = Ws + DC * dv;  // Q S0
    float* KK = QSs + DC * dv;
    float* QK = KK + DC * DC;
    float* gam = QK + DC * DC;
    float* bet = gam + DC;
    const int h = blockIdx.x, kh = h / (hv / hk);
    const int kd = hk * dk;
    float* S = state + size_t(h) * dk * dv;
    for (int t0 = 0; t0 < n; t0 += DC) {
        const int L = min(DC, n - t0);
        for (int e = threadIdx.x; e < L * dk; e += blockDim.x) {
            const int t = e / dk, i = e % dk;
            const float* row = qkv + size_t(t0 + t) * ld;
            Qs[t * dk + i] = row[kh * dk + i];
            Ks[t * dk + i] = row[kd + kh * dk + i];
        }
        if (threadIdx.x == 0) {
            float acc = 0;
            for (int t = 0; t < L; ++t) {
                acc += g[size_t(t0 + t) * hv + h];
                gam[t] = acc;
                bet[t] = beta[size_t(t0 + t) * hv + h];
            }
        }
        __syncthreads();
        for (int e = threadIdx.x; e < L * L; e += blockDim.x) {
            const int t = e / L, s = e % L;
            float a = 0, b = 0;
            if (s <= t)
                for (int i = 0; i < dk; ++i) { a += Ks[t * dk + i] * Ks[s * dk + i]; b += Qs[t * dk + i] * Ks[s * dk + i]; }
            KK[t * DC + s] = a;
            QK[t * DC + s] = b;
        }
        for (int e = threadIdx.x; e < L * dv; e += blockDim.x) {
            const int t = e / dv, j = e % dv;
            float a = 0, b = 0;
            for (int i = 0; i < dk; ++i) {
                const float sij = S[size_t(i) * dv + j];
                a += Ks[t * dk + i] * sij;
                b += Qs[t * dk + i] * sij;
            }
            Ws[t * dv + j] = a;
            QSs[t * dv + j] = b;
        }
        __syncthreads();
        for (int j = threadIdx.x; j < dv; j += blockDim.x) {
            for (int t = 0; t < L; ++t) {
                const float* vrow = qkv + size_t(t0 + t) * ld + 2 * kd + size_t(h) * dv;
                float u = bet[t] * vrow[j] - bet[t] * __expf(gam[t]) * Ws[t * dv + j];
                for (int s = 0; s < t; ++s) u -= bet[t] * KK[t * DC + s] * __expf(gam[t] - gam[s]) * Us[s * dv + j];
                Us[t * dv + j] = u;
            }
            for (int t = 0; t < L; ++t) {
                float o = __expf(gam[t]) * QSs[t * dv + j];
                for (int s = 0; s <= t; ++s) o += QK[t * DC + s] * __expf(gam[t] - gam[s]) * Us[s * dv + j];
                out[(size_t(t0 + t) * hv + h) * dv + j] = o;
            }
        }
        __syncthreads();
        const float gl = gam[L - 1];
        for (int e = threadIdx.x; e < dk * dv; e += blockDim.x) {
            const int i = e / dv, j = e % dv;
            float sij = S[e] * __expf(gl);
            for (int s = 0; s < L; ++s) sij += __expf(gl - gam[s]) * Ks[s * dk + i] * Us[s * dv + j];
            S[e] = sij;
        }
        __syncthreads();
    }
}

__global__ void gated_rmsnorm_kernel(const float* x, const float* z, int ldz, const float* gain, float* y, int heads,
                                     int dim, float eps) {
    const int t = blockIdx.x / heads, h = blockIdx.x % heads;
    const float* xr = x + size_t(blockIdx.x) * dim;
    const float* zr = z + size_t(t) * ldz + size_t(h) * dim;
    float* yr = y + size_t(blockIdx.x) * dim;
    float ss = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    const float inv = rsqrtf(block_sum(ss) / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = gain[i] * (xr[i] * inv) * silu(zr[i]);
}

// grid (n, nh + nkv): one block (one warp-multiple of threads) per q or k head.
__global__ void attn_prep_kernel(float* qkv, int ld, int nh, int nkv, int hd, int rot, float theta, const float* q_gain,
                                 const float* k_gain, float eps, const int* d_pos, void* kcache, DType kt, void* vcache,
                                 DType vt) {
    const int t = blockIdx.x, h = blockIdx.y;
    const int pos = *d_pos + t;
    float* row = qkv + size_t(t) * ld;
    const bool is_q = h < nh;
    float* v = is_q ? row + size_t(h) * 2 * hd : row + 2 * nh * hd + size_t(h - nh) * hd;
    const float* gain = is_q ? q_gain : k_gain;
    float ss = 0;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) ss += v[i] * v[i];
    const float inv = rsqrtf(block_sum(ss) / hd + eps);
    for (int i = threadIdx.x; i < hd; i += blockDim.x) v[i] = v[i] * inv * gain[i];
    __syncthreads();
    const int half = rot / 2;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float inv_freq = 1.0f / powf(theta, float(2 * i) / float(rot));
        const float angle = float(pos) * inv_freq;
        float sn, cs;
        sincosf(angle, &sn, &cs);
        const float a = v[i], b = v[i + half];
        v[i] = a * cs - b * sn;
        v[i + half] = b * cs + a * sn;
    }
    __syncthreads();
    if (!is_q && threadIdx.x < LB_WARP) {
        const int j = h - nh;
        const size_t r = size_t(pos) * nkv + j;
        kv_store_warp(v, hd, kt, (uint8_t*)kcache + r * kv_row_bytes(kt, hd));
        const float* vv = row + 2 * nh * hd + size_t(nkv) * hd + size_t(j) * hd;
        kv_store_warp(vv, hd, vt, (uint8_t*)vcache + r * kv_row_bytes(vt, hd));
    }
}

// grid (n, nh), 4 warps: each warp runs an online softmax over every 4th position, then the warps merge.
// Each lane holds hd / 32 output elements (hd <= 512).
constexpr int ATT_WARPS = 4;
__global__ void attention_kernel(const float* qkv, int ld, int nh, int nkv, int hd, const int* d_pos,
                                 const void* kcache, DType kt, const void* vcache, DType vt, float* out) {
    const int t = blockIdx.x, h = blockIdx.y, kvh = h / (nh / nkv);
    const int warp = threadIdx.x / LB_WARP, lane = threadIdx.x % LB_WARP;
    const int last = *d_pos + t;
    const float* q = qkv + size_t(t) * ld + size_t(h) * 2 * hd;
    const float* gate = q + hd;
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
        out[(size_t(t) * nh + h) * hd + e] = o / L * sigmoidf(gate[e]);
    }
}

__global__ void silu_mul_kernel(const float* gu, int n, int I, float* out) {
    const size_t e = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (e >= size_t(n) * I) return;
    const size_t t = e / I, i = e % I;
    out[e] = silu(gu[t * 2 * I + i]) * gu[t * 2 * I + I + i];
}

// One block; ties go to the lowest index.
__global__ void argmax_kernel(const float* x, int n, int* result) {
    __shared__ float bv[1024];
    __shared__ int bi[1024];
    float best = -FLT_MAX;
    int idx = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        if (x[i] > best) { best = x[i]; idx = i; }
    bv[threadIdx.x] = best;
    bi[threadIdx.x] = idx;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            const float ov = bv[threadIdx.x + s];
            const int oi = bi[threadIdx.x + s];
            if (ov > bv[threadIdx.x] || (ov == bv[threadIdx.x] && oi < bi[threadIdx.x])) { bv[threadIdx.x] = ov; bi[threadIdx.x] = oi; }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) *result = bi[0];
}

__global__ void add_pos_kernel(int* pos, int n) { *pos += n; }

}  // namespace

// ----------------------------------------------------------------------------------------- launchers

void embed(const int* d_tokens, int n, const wtype* E, int H, float* x, gpuStream_t s) {
    embed_kernel<<<n, 256, 0, s>>>(d_tokens, E, H, x);
}

void matmul(const float* x, int n, int in, const wtype* W, int out, float* y, bool accumulate, gpuStream_t s) {
    const int warps = 8;
    const dim3 grid((out + warps - 1) / warps);
#if !defined(__HIPCC__) && !defined(LB_USE_HIP)
    if (n > 8) {
        gemm_kernel<<<dim3((out + TN - 1) / TN, (n + TM - 1) / TM), 128, 0, s>>>(x, n, in, W, out, y, accumulate);
        return;
    }
#else
    // HIP: GEMV over groups of 8 tokens (a rocWMMA GEMM is future work).
    for (int t0 = 0; t0 < n; t0 += 8) {
        const int m = std::min(8, n - t0);
        if (m < 8) { matmul(x + size_t(t0) * in, m, in, W, out, y + size_t(t0) * out, accumulate, s); continue; }
        gemv_kernel<8><<<grid, warps * LB_WARP, 0, s>>>(x + size_t(t0) * in, in, W, out, y + size_t(t0) * out, accumulate);
    }
    if (n > 8) return;
#endif
    switch (n) {
        case 1: gemv_kernel<1><<<grid, warps * LB_WARP, 0, s>>>(x, in, W, out, y, accumulate); break;
        case 2: gemv_kernel<2><<<grid, warps * LB_WARP, 0, s>>>(x, in, W, out, y, accumulate); break;
        case 3: gemv_kernel<3><<<grid, warps * LB_WARP, 0, s>>>(x, in, W, out, y, accumulate); break;
        case 4: gemv_kernel<4><<<grid, warps * LB_WARP, 0, s>>>(x, in, W, out, y, accumulate); break;
        case 5: gemv_kernel<5><<<grid, warps * LB_WARP, 0, s>>>(x, in, W, out, y, accumulate); break;
        case 6: gemv_kernel<6><<<grid, warps * LB_WARP, 0, s>>>(x, in, W, out, y, accumulate); break;
        case 7: gemv_kernel<7><<<grid, warps * LB_WARP, 0, s>>>(x, in, W, out, y, accumulate); break;
        default: gemv_kernel<8><<<grid, warps * LB_WARP, 0, s>>>(x, in, W, out, y, accumulate); break;
    }
}

void rmsnorm(const float* x, const float* gain, float* y, int rows, int dim, float eps, gpuStream_t s) {
    rmsnorm_kernel<<<rows, 256, 0, s>>>(x, gain, y, dim, eps);
}

void conv1d_silu(const float* x, int ldx, int n, int C, int K, const float* w, float* state, float* y, gpuStream_t s) {
    if (K > 8) lb::fail("unsupported", "conv kernel larger than 8");
    conv1d_silu_kernel<<<(C + 127) / 128, 128, 0, s>>>(x, ldx, n, C, K, w, state, y);
}

void deltanet_prep(float* y, int ldy, const float* proj, int ldp, int b_off, const float* negA, const float* dt_bias,
                   int n, int hk, int dk, int hv, float* g, float* beta, gpuStream_t s) {
    deltanet_prep_kernel<<<dim3(n, 2 * hk + 1), 128, 0, s>>>(y, ldy, proj, ldp, b_off, negA, dt_bias, hk, dk, hv, g, beta);
}

void delta_rule(const float* qkv, int ld, int n, int hk, int hv, int dk, int dv, const float* g, const float* beta,
                float* state, float* out, gpuStream_t s) {
    const size_t smem = sizeof(float) * (2 * DC * dk + 3 * DC * dv + 2 * DC * DC + 2 * DC);
    static bool raised = false;
    if (!raised) {
#if !defined(__HIPCC__) && !defined(LB_USE_HIP)
        GPU_CHECK(cudaFuncSetAttribute(delta_rule_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 96 * 1024));
#endif
        raised = true;
    }
    delta_rule_kernel<<<hv, 256, smem, s>>>(qkv, ld, n, hk, hv, dk, dv, g, beta, state, out);
}

void gated_rmsnorm(const float* x, const float* z, int ldz, const float* gain, float* y, int n, int heads, int dim,
                   float eps, gpuStream_t s) {
    gated_rmsnorm_kernel<<<n * heads, 128, 0, s>>>(x, z, ldz, gain, y, heads, dim, eps);
}

void attn_prep(float* qkv, int ld, int n, int nh, int nkv, int hd, int rot, float theta, const float* q_gain,
               const float* k_gain, float eps, const int* d_pos, void* kcache, DType kt, void* vcache, DType vt,
               gpuStream_t s) {
    attn_prep_kernel<<<dim3(n, nh + nkv), 128, 0, s>>>(qkv, ld, nh, nkv, hd, rot, theta, q_gain, k_gain, eps, d_pos,
                                                        kcache, kt, vcache, vt);
}

void attention(const float* qkv, int ld, int n, int nh, int nkv, int hd, const int* d_pos, const void* kcache, DType kt,
               const void* vcache, DType vt, float* out, gpuStream_t s) {
    if (hd > 512) lb::fail("unsupported", "head_dim above 512");
    attention_kernel<<<dim3(n, nh), ATT_WARPS * LB_WARP, 0, s>>>(qkv, ld, nh, nkv, hd, d_pos, kcache, kt, vcache, vt, out);
}

void silu_mul(const float* gu, int n, int I, float* out, gpuStream_t s) {
    const size_t total = size_t(n) * I;
    silu_mul_kernel<<<unsigned((total + 255) / 256), 256, 0, s>>>(gu, n, I, out);
}

void argmax(const float* x, int n, int* d_out, gpuStream_t s) { argmax_kernel<<<1, 1024, 0, s>>>(x, n, d_out); }

void add_pos(int* d_pos, int n, gpuStream_t s) { add_pos_kernel<<<1, 1, 0, s>>>(d_pos, n); }

}  // namespace lb::gpu
