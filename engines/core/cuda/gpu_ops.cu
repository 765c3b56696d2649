// The kernels. Each mirrors the CPU reference function of the same name in ../cpu/.
#include <algorithm>
#include <cfloat>
#include <cstdlib>
#include <type_traits>
#include <utility>
#include <vector>

#include "../env.h"
#include "fixed_point.cuh"
#include "gpu_ops.h"

#if !defined(__HIPCC__) && !defined(LB_USE_HIP)
#define LB_CUDA 1
#endif

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
// DeltaNet's decay input: softplus(a + dt_bias), linear past 20 (as torch.nn.functional.softplus)
__device__ __forceinline__ float softplus(float x) { return x > 20.f ? x : log1pf(expf(x)); }

// Programmatic dependent launch (sm_90+): launch_dependents lets the next kernel in the stream start its
// blocks; wait blocks until the previous kernel finished and its writes are visible. Both are no-ops on
// older GPUs and for kernels launched without the PDL attribute.
__device__ __forceinline__ void griddep_wait() {
#if defined(LB_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void griddep_launch() {
#if defined(LB_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// Copies nch 16-byte chunks global -> shared, the block's NT threads striding. sm_80+: cp.async (the caller
// commits and waits); else through registers, 8 chunks a thread at a time so that 8 loads are in flight.
template <int NT>
__device__ __forceinline__ void copy_to_smem(uint4* dst, const uint4* src, int nch) {
#if defined(LB_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#pragma unroll 1  // machine code is time in a kernel run once a layer (docs/engines.md, session 9)
    for (int c = threadIdx.x; c < nch; c += NT) {
        const unsigned d = unsigned(__cvta_generic_to_shared(dst + c));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src + c) : "memory");
    }
#else
    for (int c0 = threadIdx.x; c0 < nch; c0 += 8 * NT) {
        uint4 v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u)
            if (c0 + u * NT < nch) v[u] = src[c0 + u * NT];
#pragma unroll
        for (int u = 0; u < 8; ++u)
            if (c0 + u * NT < nch) dst[c0 + u * NT] = v[u];
    }
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(LB_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(LB_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}


// ----------------------------------------------------------------------------------------- KV element access

// bf16 bits of x, rounded to nearest even as quant.cpp rounds (so CPU and GPU caches hold the same bytes),
// and the float a bf16 value stands for.
__device__ __forceinline__ unsigned short bf16_bits(float x) {
    unsigned int bits = __float_as_uint(x);
    bits += 0x7fff + ((bits >> 16) & 1);
    return (unsigned short)(bits >> 16);
}
__device__ __forceinline__ float bf16_value(unsigned short b) { return __uint_as_float(unsigned(b) << 16); }

__device__ float kv_load(const void* row, DType t, int e) {
    switch (t) {
        case DType::F32: return ((const float*)row)[e];
        case DType::F16: return __half2float(((const __half*)row)[e]);
        case DType::BF16: return bf16_value(((const unsigned short*)row)[e]);
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
        for (int e = lane; e < hd; e += LB_WARP) ((unsigned short*)row)[e] = bf16_bits(x[e]);
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

// Tensor-core GEMM for in % 8 == 0: as gemm_kernel, with 16-byte loads of x (4 floats) and W (8 weights),
// the next K step loaded into registers while the tensor cores work on the current one (two smem buffers).
// Split-K (gridDim.z > 1): block z takes K steps [z * ksteps, (z + 1) * ksteps) and stores its partial
// product to part[z][n][out]; gemm_splitk_sum_kernel adds the partials into y in split order.
__global__ __launch_bounds__(128) void gemm_vec_kernel(const float* __restrict__ x, int n, int in,
                                                        const wtype* __restrict__ W, int out, float* __restrict__ y,
                                                        bool accumulate, int ksteps, float* __restrict__ part) {
    using namespace nvcuda;
    __shared__ __align__(32) wtype As[2][TM][TK + PAD];
    __shared__ __align__(32) wtype Bs[2][TN][TK + PAD];
    __shared__ __align__(32) float Cs[TM][TN + 4];
    const int m0 = blockIdx.y * TM, n0 = blockIdx.x * TN;
    const int tid = threadIdx.x, warp = tid / 32, wm = warp / 2, wn = warp % 2;
    float4 ra[4];
    uint4 rw[2];
    auto load = [&](int k0) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int idx = tid + 128 * q, r = idx >> 3, gk = k0 + 4 * (idx & 7), gm = m0 + r;
            ra[q] = gm < n && gk < in ? *(const float4*)(x + size_t(gm) * in + gk) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int q = 0; q < 2; ++q) {
            const int idx = tid + 128 * q, r = idx >> 2, gk = k0 + 8 * (idx & 3), gn = n0 + r;
            rw[q] = gn < out && gk < in ? *(const uint4*)(W + size_t(gn) * in + gk) : make_uint4(0u, 0u, 0u, 0u);
        }
    };
    auto store = [&](int buf) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            const int idx = tid + 128 * q, r = idx >> 3, kk = 4 * (idx & 7);
            wtype t4[4] = {wtype(ra[q].x), wtype(ra[q].y), wtype(ra[q].z), wtype(ra[q].w)};
            *(uint2*)&As[buf][r][kk] = *(const uint2*)t4;
        }
#pragma unroll
        for (int q = 0; q < 2; ++q) {
            const int idx = tid + 128 * q, r = idx >> 2, kk = 8 * (idx & 3);
            *(uint4*)&Bs[buf][r][kk] = rw[q];
        }
    };
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c[2][2];
    for (int i = 0; i < 2; ++i) for (int j = 0; j < 2; ++j) wmma::fill_fragment(c[i][j], 0.f);
    const int kt0 = blockIdx.z * ksteps, nk = min((in + TK - 1) / TK, kt0 + ksteps);
    load(kt0 * TK);
    store(0);
    __syncthreads();
    for (int kt = kt0; kt < nk; ++kt) {
        const int buf = (kt - kt0) & 1;
        if (kt + 1 < nk) load((kt + 1) * TK);
#pragma unroll
        for (int kk = 0; kk < TK; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, wtype, wmma::row_major> a[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, wtype, wmma::col_major> b[2];
            for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(a[i], &As[buf][wm * 32 + i * 16][kk], TK + PAD);
            for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(b[j], &Bs[buf][wn * 32 + j * 16][kk], TK + PAD);
            for (int i = 0; i < 2; ++i) for (int j = 0; j < 2; ++j) wmma::mma_sync(c[i][j], a[i], b[j], c[i][j]);
        }
        if (kt + 1 < nk) store(buf ^ 1);
        __syncthreads();
    }
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j)
            wmma::store_matrix_sync(&Cs[wm * 32 + i * 16][wn * 32 + j * 16], c[i][j], TN + 4, wmma::mem_row_major);
    __syncthreads();
    float* pz = part ? part + size_t(blockIdx.z) * n * out : nullptr;
    for (int e = tid; e < TM * TN; e += blockDim.x) {
        const int r = e / TN, cc = e % TN;
        const int gm = m0 + r, gn = n0 + cc;
        if (gm < n && gn < out) {
            if (pz) {
                pz[size_t(gm) * out + gn] = Cs[r][cc];
            } else {
                float* dst = y + size_t(gm) * out + gn;
                *dst = accumulate ? *dst + Cs[r][cc] : Cs[r][cc];
            }
        }
    }
}

// y (+)= sum over z of part[z] (count floats each, in split order); count % 4 == 0.
__global__ void gemm_splitk_sum_kernel(const float* __restrict__ part, int splits, size_t count, float* __restrict__ y,
                                       bool accumulate) {
    const size_t i = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
    if (i >= count) return;
    float4 a = accumulate ? *(const float4*)(y + i) : make_float4(0.f, 0.f, 0.f, 0.f);
    for (int z = 0; z < splits; ++z) {
        const float4 v = *(const float4*)(part + size_t(z) * count + i);
        a.x += v.x; a.y += v.y; a.z += v.z; a.w += v.w;
    }
    *(float4*)(y + i) = a;
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
    for (int t0 = 0; t0 < n; t0 += 8) {  // 8 independent loads in flight, then the sequential update
        float cur8[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) cur8[u] = t0 + u < n ? x[size_t(t0 + u) * ldx + c] : 0.f;
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            if (t0 + u >= n) break;
            const float cur = cur8[u];
            float acc = wc[K - 1] * cur;
            for (int j = 0; j < K - 1; ++j) acc += wc[j] * win[j];
            y[size_t(t0 + u) * C + c] = silu(acc);
            for (int j = 0; j + 1 < K - 1; ++j) win[j] = win[j + 1];
            if (K > 1) win[K - 2] = cur;
        }
    }
    for (int j = 0; j < K - 1; ++j) state[size_t(c) * (K - 1) + j] = win[j];
}

// Same math as conv1d_silu_kernel, parallel over (channel, strip of CONV_TT tokens): grid (C / 128, n / TT).
// With in(tau) = x[tau][c] for tau >= 0 and the old state[c][K-1+tau] for tau < 0,
// y[t][c] = silu(w[K-1] in(t) + sum_{j<K-1} w[j] in(t-K+1+j)) (the old kernel's summation order) and the new
// state is in(n-K+1 .. n-1). Since TT >= K-1, only strip 0 reads the old state; its thread for channel c
// writes the new state of c after all of its own reads, so no other thread can see a half-updated state.
constexpr int CONV_TT = 8;
template <int K>
__global__ void conv1d_silu_par_kernel(const float* x, int ldx, int n, int C, const float* w, float* state, float* y) {
    static_assert(K >= 1 && K - 1 <= CONV_TT, "strip shorter than the conv state");
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int t0 = blockIdx.y * CONV_TT;
    float* st = state + size_t(c) * (K - 1);
    float win[K - 1 + CONV_TT];  // win[i] = in(t0 - (K-1) + i)
#pragma unroll
    for (int i = 0; i < K - 1 + CONV_TT; ++i) {
        const int tau = t0 - (K - 1) + i;
        win[i] = tau < 0 ? st[K - 1 + tau] : (tau < n ? x[size_t(tau) * ldx + c] : 0.f);
    }
    float wc[K];
#pragma unroll
    for (int j = 0; j < K; ++j) wc[j] = w[size_t(c) * K + j];
#pragma unroll
    for (int u = 0; u < CONV_TT; ++u) {
        if (t0 + u >= n) break;
        float acc = wc[K - 1] * win[u + K - 1];
#pragma unroll
        for (int j = 0; j < K - 1; ++j) acc += wc[j] * win[u + j];
        y[size_t(t0 + u) * C + c] = silu(acc);
    }
    if (blockIdx.y == 0 && K > 1) {
        float ns[K > 1 ? K - 1 : 1];
#pragma unroll
        for (int j = 0; j < K - 1; ++j) {  // new state[j] = in(n - (K-1) + j); read everything, then write
            const int tau = n - (K - 1) + j;
            ns[j] = tau < 0 ? st[K - 1 + tau] : x[size_t(tau) * ldx + c];
        }
#pragma unroll
        for (int j = 0; j < K - 1; ++j) st[j] = ns[j];
    }
}

// grid (n, 2 * hk + 1): blocks y < 2*hk normalise one q or k head; the last one computes g and beta.
__global__ void deltanet_prep_kernel(float* y, int ldy, const float* proj, int ldp, int b_off, const float* negA,
                                     const float* dt_bias, int hk, int dk, int hv, float* g, float* beta) {
    const int t = blockIdx.x, h = blockIdx.y;
    if (h == 2 * hk) {
        for (int i = threadIdx.x; i < hv; i += blockDim.x) {
            const float b = proj[size_t(t) * ldp + b_off + i];
            const float a = proj[size_t(t) * ldp + b_off + hv + i] + dt_bias[i];
            const float sp = softplus(a);
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

// grid (n, nh + nkv), AP_THREADS threads: one block per q or k head of a token. The head's row (and a k
// head's v row) is read once, with the position, into shared memory: one round trip, where the old kernel
// re-read the row from global memory after each step. It is normalised (gain), rotated (partial RoPE) and
// written back once; a k head's block also stores its k and v rows in the caches. The gains and rotary
// frequencies, which depend on no earlier kernel, are read before the dependency wait.
// KVF >= 0: K and V caches both of type DType(KVF), fixed at compile time (one store path in the code; see
// attn_decode_flash_kernel).
constexpr int AP_THREADS = 128, AP_MAX_HD = 512, AP_PER = AP_MAX_HD / AP_THREADS;
// Partial RoPE (rotate-half) of a head row in shared memory: the frequency of pair i < rot / 2, and the
// rotation of pair (i, i + half) by the angle whose sine and cosine are sn, cs.
__device__ __forceinline__ float rope_inv_freq(int i, int rot, float theta) {
    return 1.0f / powf(theta, float(2 * i) / float(rot));
}
__device__ __forceinline__ void rope_rotate(float* x, int i, int half, float cs, float sn) {
    const float a = x[i], b = x[i + half];
    x[i] = a * cs - b * sn;
    x[i + half] = b * cs + a * sn;
}
template <int KVF>
__global__ __launch_bounds__(AP_THREADS) void attn_prep_kernel(float* qkv, int ld, int nh, int nkv, int hd, int rot,
                                                                float theta, const float* q_gain, const float* k_gain,
                                                                float eps, const int* d_pos, void* kcache, DType kt,
                                                                void* vcache, DType vt) {
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
    float* v = is_q ? row + size_t(h) * 2 * hd : row + 2 * nh * hd + size_t(h - nh) * hd;
    const float* vv = row + 2 * nh * hd + size_t(nkv) * hd + size_t(is_q ? 0 : h - nh) * hd;
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
                                                                     const void* vcache, DType vt, float* out) {
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
        if (t < n) q = *(const float4*)(qkv + size_t(t) * ld + size_t(h) * 2 * HD + d);
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
        const float* gate = qkv + size_t(t) * ld + size_t(h) * 2 * HD + HD;
        float* o = out + (size_t(t) * nh + h) * HD;
#pragma unroll
        for (int c = 0; c < NC; ++c)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int e = c * 128 + lane * 4 + i;
                o[e] = acc[a][c][i] / L * sigmoidf(gate[e]);
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
                                                                    const void* vcache, DType vt, float* out) {
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
        if (t < n) q = *(const float4*)(qkv + size_t(t) * ld + size_t(h) * 2 * HD + d);
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
    const int sv = tid / 4, sq = tid % 4;
    const int last = p0 + t0 + sv / G;  // last key of vector sv
    float m = -FLT_MAX, l = 0.f;
    for (int s0 = 0; s0 <= s_end; s0 += AW_TK) {
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
    for (int s0 = 0; s0 <= s_end; s0 += AW_TK) {
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
        if (t < n) out[(size_t(t) * nh + h) * HD + d] = Os[v * HD + d] * sigmoidf(qkv[size_t(t) * ld + size_t(h) * 2 * HD + HD + d]);
    }
}
#endif

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

// The chunked kernels' shared steps (blocks of 256 threads). Stage the chunk's q and k rows of key head kh ([L][dk + 1] each).
__device__ __forceinline__ void delta_stage_qk(const float* qkv, int ld, int t0, int L, int dk, int kh, int kd, float* Qs,
                                               float* Ks) {
    const int LDK = dk + 1;
    for (int e = threadIdx.x; e < L * dk; e += 256) {
        const int t = e / dk, i = e % dk;
        const float* row = qkv + size_t(t0 + t) * ld;
        Qs[t * LDK + i] = row[kh * dk + i];
        Ks[t * LDK + i] = row[kd + kh * dk + i];
    }
}
// The chunk's outputs of this block's CB columns, o_t = e^gamma_t QS_t + sum_{s<=t} B[t][s] U_s (out: row t at
// out + t * out_ld), and its state slice, S = e^gamma_L S + sum_s e^(gamma_L - gamma_s) k_s U_s^T.
template <int CB>
__device__ __forceinline__ void delta_chunk_finish(int L, int dk, const float* eg, const float* eL, const float* QSs,
                                                   const float* B, int ldb, const float* Us, const float* Ks, float* Ss,
                                                   float* out, int out_ld) {
    const int LDK = dk + 1;
    for (int e = threadIdx.x; e < L * CB; e += 256) {
        const int t = e / CB, j = e % CB;
        float o = eg[t] * QSs[e];
        for (int s = 0; s <= t; ++s) o += B[t * ldb + s] * Us[s * CB + j];
        out[size_t(t) * out_ld + j] = o;
    }
    const float gl = eg[L - 1];
    for (int e = threadIdx.x; e < dk * CB; e += 256) {
        const int i = e / CB, j = e % CB;
        float sij = Ss[e] * gl;
        for (int s = 0; s < L; ++s) sij += eL[s] * Ks[s * LDK + i] * Us[s * CB + j];
        Ss[e] = sij;
    }
}

// Chunked delta rule split over value columns: grid (hv, dv / CB), 256 threads. Column j of U and of
// the state depend only on column j of V (and on the chunk's K, Q, g, beta), so each block owns CB
// columns of one head and keeps that state slice in shared memory for the whole sequence. CB = DR_CB (16)
// by default: twice the blocks of CB = 32 (each recomputes the chunk's Gram matrices), pp520 on the H200
// 21.8k -> 25.8k tok/s with identical greedy tokens (docs/engines.md); LB_GPU_DR_CB=32 selects the wider one.
constexpr int DR_CB = 16;
template <int DCT, int CB>
__global__ __launch_bounds__(256) void delta_rule_cols_kernel(const float* qkv, int ld, int n, int hk, int hv, int dk,
                                                              int dv, const float* g, const float* beta, float* state,
                                                              float* out) {
    extern __shared__ float sm[];
    const int LDK = dk + 1, LDA = DCT + 1;
    float* Ss = sm;                    // [dk][CB]
    float* Ks = Ss + dk * CB;          // [DCT][LDK]
    float* Qs = Ks + DCT * LDK;        // [DCT][LDK]
    float* Us = Qs + DCT * LDK;        // [DCT][CB]
    float* Ws = Us + DCT * CB;         // [DCT][CB]  K S0
    float* QSs = Ws + DCT * CB;        // [DCT][CB]  Q S0
    float* A = QSs + DCT * CB;         // [DCT][LDA] beta_t (k_t.k_s) e^{gamma_t - gamma_s}, s < t
    float* B = A + DCT * LDA;          // [DCT][LDA] (q_t.k_s) e^{gamma_t - gamma_s}, s <= t
    float* gam = B + DCT * LDA;        // [DCT]
    float* bet = gam + DCT;            // [DCT]
    float* eg = bet + DCT;             // [DCT] e^{gamma_t}
    float* eL = eg + DCT;              // [DCT] e^{gamma_L - gamma_s}
    float* Vs = eL + DCT;              // [DCT][CB]
    const int h = blockIdx.x, c0 = blockIdx.y * CB, kh = h / (hv / hk), kd = hk * dk;
    const int tid = threadIdx.x;
    float* S = state + size_t(h) * dk * dv + c0;
    for (int e = tid; e < dk * CB; e += 256) Ss[e] = S[size_t(e / CB) * dv + e % CB];
    for (int t0 = 0; t0 < n; t0 += DCT) {
        const int L = min(DCT, n - t0);
        delta_stage_qk(qkv, ld, t0, L, dk, kh, kd, Qs, Ks);
        for (int e = tid; e < L * CB; e += 256)
            Vs[e] = qkv[size_t(t0 + e / CB) * ld + 2 * kd + size_t(h) * dv + c0 + e % CB];
        if (tid == 0) {
            float acc = 0;
            for (int t = 0; t < L; ++t) {
                acc += g[size_t(t0 + t) * hv + h];
                gam[t] = acc;
                bet[t] = beta[size_t(t0 + t) * hv + h];
                eg[t] = __expf(acc);
            }
            for (int t = 0; t < L; ++t) eL[t] = __expf(acc - gam[t]);
        }
        __syncthreads();
        for (int e = tid; e < L * L; e += 256) {
            const int t = e / L, s = e % L;
            if (s <= t) {
                float a = 0, b = 0;
                for (int i = 0; i < dk; ++i) {
                    const float ks = Ks[s * LDK + i];
                    a += Ks[t * LDK + i] * ks;
                    b += Qs[t * LDK + i] * ks;
                }
                const float d = __expf(gam[t] - gam[s]);
                A[t * LDA + s] = bet[t] * a * d;
                B[t * LDA + s] = b * d;
            }
        }
        for (int e = tid; e < L * CB; e += 256) {
            const int t = e / CB, j = e % CB;
            float a = 0, b = 0;
            for (int i = 0; i < dk; ++i) {
                const float sij = Ss[i * CB + j];
                a += Ks[t * LDK + i] * sij;
                b += Qs[t * LDK + i] * sij;
            }
            Ws[e] = a;
            QSs[e] = b;
        }
        __syncthreads();
        {   // forward substitution: LPC = 256 / CB consecutive lanes per column split the sum over s
            // (CB = 32: warp w owns columns 4w..4w+3, 8 lanes each)
            constexpr int LPC = 256 / CB;
            static_assert(LPC >= 1 && LPC <= 32 && 256 % CB == 0, "lanes per column");
            const int col = tid / LPC, sub = tid % LPC;
            for (int t = 0; t < L; ++t) {
                float part = 0;
                for (int s = sub; s < t; s += LPC) part += A[t * LDA + s] * Us[s * CB + col];
#pragma unroll
                for (int o = 1; o < LPC; o <<= 1) part += __shfl_xor_sync(0xffffffff, part, o);
                if (sub == 0) {
                    const float v = Vs[t * CB + col];
                    Us[t * CB + col] = bet[t] * v - bet[t] * eg[t] * Ws[t * CB + col] - part;
                }
                __syncwarp();
            }
        }
        __syncthreads();
        delta_chunk_finish<CB>(L, dk, eg, eL, QSs, B, LDA, Us, Ks, Ss, out + (size_t(t0) * hv + h) * dv + c0, hv * dv);
        __syncthreads();
    }
    for (int e = tid; e < dk * CB; e += 256) S[size_t(e / CB) * dv + e % CB] = Ss[e];
}
size_t delta_cols_smem(int dct, int dk, int cb) {
    return sizeof(float) * (size_t(dk) * cb + 2 * size_t(dct) * (dk + 1) + 3 * size_t(dct) * cb +
                            2 * size_t(dct) * (dct + 1) + 4 * size_t(dct) + size_t(dct) * cb);
}

// Chunked delta rule in two passes (the WY form). Everything a chunk needs that does not depend on the
// state - the decays, the Gram matrices and the inverse T = (I + A)^-1 that the forward substitution
// applies - is computed for all chunks at once by delta_chunk_prep_kernel (grid (chunks, hv)); the
// sequential pass, delta_rule_wy_kernel (grid (hv, dv / CB), as delta_rule_cols_kernel), is then left with
// products against its state slice: per chunk W = K S, QS = Q S, R = beta (v - e^gamma W), U = T R,
// out = e^gamma QS + B U, S = e^gamma_L S + sum_s e^(gamma_L - gamma_s) k_s U_s^T. Same math as
// delta_rule_cols_kernel (A, B, gamma as defined there); its 32-step forward substitution and the Gram
// matrices, recomputed by every column block of a head, leave the sequential chain.
// Chunk data layout, DR_PREP floats per (chunk, value head): T [DCT][DCT], B [DCT][DCT], e^gamma [DCT],
// e^(gamma_L - gamma) [DCT], beta [DCT].
template <int DCT>
__host__ __device__ constexpr int dr_prep_floats() { return 2 * DCT * DCT + 3 * DCT; }

template <int DCT>
__global__ __launch_bounds__(256) void delta_chunk_prep_kernel(const float* qkv, int ld, int n, int hk, int hv, int dk,
                                                               const float* g, const float* beta, float* prep) {
    static_assert(DCT <= 32 && 256 % DCT == 0, "one warp scans a chunk");
    extern __shared__ float sm[];
    const int LDK = dk + 1, LDA = DCT + 1;
    float* Ks = sm;                // [DCT][LDK], then T [DCT][LDA]
    float* Qs = Ks + DCT * LDK;    // [DCT][LDK]
    float* A = Qs + DCT * LDK;     // [DCT][LDA]
    float* gam = A + DCT * LDA;    // [DCT]
    float* bet = gam + DCT;        // [DCT]
    const int c = blockIdx.x, h = blockIdx.y, t0 = c * DCT, L = min(DCT, n - t0);
    const int kh = h / (hv / hk), kd = hk * dk, tid = threadIdx.x;
    delta_stage_qk(qkv, ld, t0, L, dk, kh, kd, Qs, Ks);
    if (tid < 32) {  // gamma: inclusive scan of g over the chunk
        float gv = tid < L ? g[size_t(t0 + tid) * hv + h] : 0.f;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float y = __shfl_up_sync(0xffffffffu, gv, o);
            if (tid >= o) gv += y;
        }
        if (tid < DCT) {
            gam[tid] = gv;
            bet[tid] = tid < L ? beta[size_t(t0 + tid) * hv + h] : 0.f;
        }
    }
    __syncthreads();
    float* T = prep + size_t(c * hv + h) * dr_prep_floats<DCT>();
    float* B = T + DCT * DCT;
    float* egp = B + DCT * DCT;
    float* eLp = egp + DCT;
    float* betp = eLp + DCT;
    for (int e = tid; e < L * L; e += 256) {
        const int t = e / L, s = e % L;
        float a = 0.f, b = 0.f;
        if (s <= t) {
            for (int i = 0; i < dk; ++i) {
                const float ks = Ks[s * LDK + i];
                a += Ks[t * LDK + i] * ks;
                b += Qs[t * LDK + i] * ks;
            }
            const float d = __expf(gam[t] - gam[s]);
            a *= bet[t] * d;
            b *= d;
        }
        A[t * LDA + s] = s < t ? a : 0.f;
        B[t * DCT + s] = b;
    }
    if (tid < L) {
        egp[tid] = __expf(gam[tid]);
        eLp[tid] = __expf(gam[L - 1] - gam[tid]);
        betp[tid] = bet[tid];
    }
    __syncthreads();
    {   // T = (I + A)^-1, unit lower triangular, column by column: T[t][j] = [t == j] - sum_{j<=s<t} A[t][s] T[s][j];
        // LPC consecutive lanes per column split the sum over s
        constexpr int LPC = 256 / DCT;
        float* Tm = Ks;  // K is no longer needed
        const int col = tid / LPC, sub = tid % LPC;
        for (int t = 0; t < L; ++t) {
            float part = 0.f;
            for (int s = col + sub; s < t; s += LPC) part += A[t * LDA + s] * Tm[s * LDA + col];
#pragma unroll
            for (int o = 1; o < LPC; o <<= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
            if (sub == 0) Tm[t * LDA + col] = t < col ? 0.f : t == col ? 1.f : -part;
            __syncwarp();
        }
        __syncthreads();
        for (int e = tid; e < L * L; e += 256) T[(e / L) * DCT + e % L] = Tm[(e / L) * LDA + e % L];
    }
}
size_t dr_prep_smem(int dct, int dk) { return sizeof(float) * (2 * size_t(dct) * (dk + 1) + size_t(dct) * (dct + 1) + 2 * size_t(dct)); }

template <int DCT, int CB>
__global__ __launch_bounds__(256) void delta_rule_wy_kernel(const float* qkv, int ld, int n, int hk, int hv, int dk,
                                                            int dv, const float* prep, float* state, float* out) {
    extern __shared__ float sm[];
    const int LDK = dk + 1;
    float* Ss = sm;                    // [dk][CB]
    float* Ks = Ss + dk * CB;          // [DCT][LDK]
    float* Qs = Ks + DCT * LDK;        // [DCT][LDK]
    float* Vs = Qs + DCT * LDK;        // [DCT][CB]
    float* Rs = Vs + DCT * CB;         // [DCT][CB]  beta (v - e^gamma K S)
    float* QSs = Rs + DCT * CB;        // [DCT][CB]  Q S
    float* Us = QSs + DCT * CB;        // [DCT][CB]  T R
    float* Cd = Us + DCT * CB;         // the chunk's prep data (T, B, e^gamma, e^(gamma_L - gamma), beta)
    constexpr int PF = dr_prep_floats<DCT>();
    const float* Tm = Cd;
    const float* Bm = Cd + DCT * DCT;
    const float* eg = Bm + DCT * DCT;
    const float* eL = eg + DCT;
    const float* bet = eL + DCT;
    const int h = blockIdx.x, c0 = blockIdx.y * CB, kh = h / (hv / hk), kd = hk * dk;
    const int tid = threadIdx.x;
    float* S = state + size_t(h) * dk * dv + c0;
    for (int e = tid; e < dk * CB; e += 256) Ss[e] = S[size_t(e / CB) * dv + e % CB];
    for (int t0 = 0, c = 0; t0 < n; t0 += DCT, ++c) {
        const int L = min(DCT, n - t0);
        delta_stage_qk(qkv, ld, t0, L, dk, kh, kd, Qs, Ks);
        for (int e = tid; e < L * CB; e += 256)
            Vs[e] = qkv[size_t(t0 + e / CB) * ld + 2 * kd + size_t(h) * dv + c0 + e % CB];
        const float4* src = (const float4*)(prep + size_t(c * hv + h) * PF);
        for (int e = tid; e < PF / 4; e += 256) ((float4*)Cd)[e] = src[e];
        __syncthreads();
        for (int e = tid; e < L * CB; e += 256) {
            const int t = e / CB, j = e % CB;
            float a = 0.f, b = 0.f;
            for (int i = 0; i < dk; ++i) {
                const float sij = Ss[i * CB + j];
                a += Ks[t * LDK + i] * sij;
                b += Qs[t * LDK + i] * sij;
            }
            Rs[e] = bet[t] * Vs[e] - bet[t] * eg[t] * a;
            QSs[e] = b;
        }
        __syncthreads();
        for (int e = tid; e < L * CB; e += 256) {
            const int t = e / CB, j = e % CB;
            float u = 0.f;
            for (int s = 0; s <= t; ++s) u += Tm[t * DCT + s] * Rs[s * CB + j];
            Us[e] = u;
        }
        __syncthreads();
        delta_chunk_finish<CB>(L, dk, eg, eL, QSs, Bm, DCT, Us, Ks, Ss, out + (size_t(t0) * hv + h) * dv + c0, hv * dv);
        __syncthreads();
    }
    for (int e = tid; e < dk * CB; e += 256) S[size_t(e / CB) * dv + e % CB] = Ss[e];
}
size_t dr_wy_smem(int dct, int dk, int cb) {
    return sizeof(float) * (size_t(dk) * cb + 2 * size_t(dct) * (dk + 1) + 4 * size_t(dct) * cb +
                            2 * size_t(dct) * dct + 3 * size_t(dct));
}

// ----------------------------------------------------------------------------------------- fused decode kernels

template <typename T>
__device__ __forceinline__ T ld_cg(const T* p) {  // bypass L1: data written by other blocks of this launch
#if defined(LB_CUDA)
    return __ldcg(p);
#else  // word by word: HIP's vector types have no volatile copy constructor
    T r;
    for (int i = 0; i < int(sizeof(T) / 4); ++i) ((unsigned*)&r)[i] = ((const volatile unsigned*)p)[i];
    return r;
#endif
}

__device__ __forceinline__ void unpack8(const uint4& p, float* f) {
    const wtype* w = (const wtype*)&p;
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] = w2f(w[j]);
}

__device__ __forceinline__ void unpack4(const uint2& p, float* f) {
    const wtype* w = (const wtype*)&p;
#pragma unroll
    for (int j = 0; j < 4; ++j) f[j] = w2f(w[j]);
}


// v += the four fixed-point values acc[i, i + 4) (read at L2: other blocks' atomics wrote them); acc may be null
__device__ __forceinline__ void add_fix4(float4& v, const unsigned long long* acc, int i) {
    if (!acc) return;
    const ulonglong2 p = ld_cg((const ulonglong2*)(acc + i)), q = ld_cg((const ulonglong2*)(acc + i + 2));
    v.x += from_fix(p.x); v.y += from_fix(p.y); v.z += from_fix(q.x); v.w += from_fix(q.y);
}

// xs[0, in) = rmsnorm(v) * gain over the block's NT threads, v = x, or x + from_fix(acc) (+ from_fix(acc2))
// where an MLP output (and a DeltaNet mixer's) is still in its accumulator (written by other blocks' atomics:
// read at L2). gr: the thread's gains for
// elements 4 (tid + k NT) .. + 3, k < GR, loaded by the caller before its dependency wait (they are weights),
// so that the only round trip here is x (and acc); elements past 4 GR NT read their gains late. in % 4 == 0;
// xs is complete after the caller's next __syncthreads.
template <int NT, int GR>
__device__ __forceinline__ void rmsnorm_smem(const float* x, const unsigned long long* acc,
                                             const unsigned long long* acc2, const float4 (&gr)[GR],
                                             const float* gain, float eps, int in, float* xs) {
    const int tid = threadIdx.x;
    auto load = [&](int i) {
        float4 v = *(const float4*)(x + i);
        add_fix4(v, acc, i);
        add_fix4(v, acc2, i);
        return v;
    };
    float ss = 0.f;
    float4 v[GR];
#pragma unroll
    for (int k = 0; k < GR; ++k) {
        const int i = (tid + k * NT) * 4;
        v[k] = i < in ? load(i) : make_float4(0.f, 0.f, 0.f, 0.f);
        ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
    }
    for (int i = (tid + GR * NT) * 4; i < in; i += NT * 4) {
        const float4 w = load(i);
        *(float4*)(xs + i) = w;
        ss += w.x * w.x + w.y * w.y + w.z * w.z + w.w * w.w;
    }
    const float inv = rsqrtf(block_sum(ss) / in + eps);  // block_sum's barriers publish the xs stores
#pragma unroll
    for (int k = 0; k < GR; ++k) {
        const int i = (tid + k * NT) * 4;
        if (i < in)
            *(float4*)(xs + i) = make_float4(v[k].x * inv * gr[k].x, v[k].y * inv * gr[k].y, v[k].z * inv * gr[k].z,
                                             v[k].w * inv * gr[k].w);
    }
    for (int i = (tid + GR * NT) * 4; i < in; i += NT * 4) {
        const float4 w = *(const float4*)(xs + i), g = *(const float4*)(gain + i);
        *(float4*)(xs + i) = make_float4(w.x * inv * g.x, w.y * inv * g.y, w.z * inv * g.z, w.w * inv * g.w);
    }
}

// One lane's part of the dot product of a row (nvec chunks of 8 weights, shared memory) with xs: chunks
// lane, lane + step, ...; the caller sums the lanes (warp_sum). Same sums as gemv_fused_kernel's rows; the
// chunk is copied to registers first (one 16-byte shared load: unpack8 on the shared address compiles to
// eight 2-byte loads).
__device__ __forceinline__ float dot8_lane(const uint4* wr, const float* xs, int nvec, int lane, int step) {
    float acc0 = 0.f, acc1 = 0.f;
    for (int c = lane; c < nvec; c += step) {
        float wf[8];
        const uint4 w = wr[c];
        unpack8(w, wf);
        const float4 xa = ((const float4*)xs)[2 * c], xb = ((const float4*)xs)[2 * c + 1];
        acc0 += wf[0] * xa.x + wf[1] * xa.y + wf[2] * xa.z + wf[3] * xa.w;
        acc1 += wf[4] * xb.x + wf[5] * xb.y + wf[6] * xb.z + wf[7] * xb.w;
    }
    return acc0 + acc1;
}

constexpr int GV_THREADS = 256, GV_WARPS = GV_THREADS / 32, GV_STAGES = 3, GV_MAX_HEADS = 64, GV_MAX_CONV = 8;
constexpr int GV_GAIN_REGS = 1;  // RMSNORM gains a thread holds from before the wait, float4s (hidden <= 1,024)

// Persistent GEMV for one token: block b handles row tiles b, b + grid, ... Each tile (rb rows) is copied
// to shared memory with cp.async, GV_STAGES tiles in flight. The first `pre` tiles are requested before
// the dependency wait, the rest after the prologue: the prologue's dependent reads (x, the MLP
// accumulator) queue behind this SM's outstanding copies, so fewer copies ahead of them shorten the chain,
// and pre tiles of every block (8 MB for the 0.8B in-projection at pre = 1) already keep DRAM busy. The
// prologue builds the (normalised) input vector in shared memory once per block; each warp then dots one
// row at a time against it.
template <int PRO, int EPI>
__global__ __launch_bounds__(GV_THREADS) void gemv_fused_kernel(FusedGemv a, int rb, int ntiles, int pre) {
    extern __shared__ __align__(16) unsigned char gv_smem[];
    const int in = a.in;
    float* xs = (float*)gv_smem;
    wtype* wt = (wtype*)(gv_smem + ((size_t(in) * 4 + 15) / 16) * 16);
    const size_t tile_elems = size_t(rb) * in;
    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    auto issue = [&](int tile, int stage) {
        if (tile < ntiles) {
            const int row0 = tile * rb, nr = min(rb, a.out - row0);
            const int nch = int(size_t(nr) * in / 8);
            const uint4* src = (const uint4*)(a.W + size_t(row0) * in);
            uint4* dst = (uint4*)(wt + size_t(stage) * tile_elems);
            copy_to_smem<GV_THREADS>(dst, src, nch);
        }
        cp_async_commit();
    };
#pragma unroll 1
    for (int s = 0; s < pre; ++s) issue(blockIdx.x + s * gridDim.x, s);
    // CONV: lane j < K holds w[j] and state[j] of the warp's next row, fetched one row ahead so that their
    // latency hides behind a dot product (the first row's before the wait: neither depends on earlier
    // kernels; this layer's state was last written by this kernel a token ago).
    float conv_w = 0.f, conv_s = 0.f;
    auto conv_fetch = [&](int tile, int r) {
        if (EPI != GV_CONV || tile >= ntiles) return;
        const int row = tile * rb + r;
        if (r < min(rb, a.out - tile * rb) && row < a.conv_rows && lane < a.conv_k) {
            conv_w = a.conv_w[size_t(row) * a.conv_k + lane];
            if (lane < a.conv_k - 1) conv_s = a.conv_state[size_t(row) * (a.conv_k - 1) + lane];
        }
    };
    conv_fetch(blockIdx.x, warp);
    // RMSNORM: the thread's norm gains (weights) before the wait, so that the prologue makes one round trip
    float4 gr[GV_GAIN_REGS];
#pragma unroll
    for (int k = 0; k < GV_GAIN_REGS; ++k) {
        const int i = (tid + k * GV_THREADS) * 4;
        gr[k] = PRO == GV_RMSNORM && i < in ? *(const float4*)(a.gain + i) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    griddep_launch();
    griddep_wait();

    // ---- prologue: the input vector
    if (PRO == GV_RMSNORM) {
        rmsnorm_smem<GV_THREADS>(a.x, a.acc, a.acc2, gr, a.gain, a.eps, in, xs);  // the pending accumulators
    } else if (PRO == GV_SILU) {
        for (int i = tid; i < in; i += GV_THREADS) xs[i] = silu(a.x[i]) * a.x[in + i];
    } else if (PRO == GV_GATED) {
        // One round trip: x, z and the gain of a chunk of 8 are loaded together. xs = x * gain * silu(z),
        // and each head's sum of squares of x is reduced over the cph lanes that hold it (gemv_fused_ok:
        // whole warps in every pass, cph = head_dim / 8 divides 32, so whole heads in a warp), then scaled.
        __shared__ float head_ss[GV_MAX_HEADS];
        const int hd = a.head_dim, cph = hd / 8;
        for (int c = tid; c < in / 8; c += GV_THREADS) {
            float xv[8], zv[8], gv[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                xv[j] = a.x[8 * c + j];
                zv[j] = a.z[8 * c + j];
                gv[j] = a.gain[(8 * c + j) % hd];
            }
            float ss = 0.f;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                ss += xv[j] * xv[j];
                xs[8 * c + j] = gv[j] * xv[j] * silu(zv[j]);
            }
            for (int o = cph / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffff, ss, o, LB_WARP);
            if (c % cph == 0) head_ss[c / cph] = ss;
        }
        __syncthreads();
        for (int i = tid; i < in; i += GV_THREADS) xs[i] *= rsqrtf(head_ss[i / hd] / hd + a.eps);
    } else {
        for (int i = tid; i < in; i += GV_THREADS) xs[i] = a.x[i];
    }
#pragma unroll 1
    for (int s = pre; s < GV_STAGES; ++s) issue(blockIdx.x + s * gridDim.x, s);
    // ADD: lane 0 holds y and the fold accumulator of the warp's next row, fetched a row ahead (after the wait:
    // earlier kernels wrote them) so that the read-modify-write after the dot product waits on nothing
    float add_y = 0.f;
    unsigned long long add_fold = 0ull, add_fold2 = 0ull;
    auto add_fetch = [&](int tile, int r) {
        if (EPI != GV_ADD || lane != 0 || tile >= ntiles || r >= min(rb, a.out - tile * rb)) return;
        const int row = tile * rb + r;
        add_y = a.y[row];
        if (a.fold) add_fold = ld_cg(a.fold + row);
        if (a.fold2) add_fold2 = ld_cg(a.fold2 + row);
    };
    add_fetch(blockIdx.x, warp);
    __syncthreads();

    float best = -FLT_MAX;
    int best_i = 0x7fffffff;
    const int nvec = in / 8;
    int it = 0;
    for (int tile = blockIdx.x; tile < ntiles; tile += gridDim.x, ++it) {
        const int stage = it % GV_STAGES;
        cp_async_wait<GV_STAGES - 1>();
        __syncthreads();
        const int row0 = tile * rb, nr = min(rb, a.out - row0);
        const wtype* tw = wt + size_t(stage) * tile_elems;
        for (int r = warp; r < nr; r += GV_WARPS) {
            const uint4* wr = (const uint4*)(tw + size_t(r) * in);
            const float v = warp_sum(dot8_lane(wr, xs, nvec, lane, 32));
            const int row = row0 + r;
            // CONV: this row's w and state from lanes 0..K-1 (K <= GV_MAX_CONV), then the next row's fetch
            float cw[GV_MAX_CONV], cs[GV_MAX_CONV], w_last = 0.f;
            if (EPI == GV_CONV) {
#pragma unroll
                for (int j = 0; j < GV_MAX_CONV; ++j) {
                    cw[j] = __shfl_sync(0xffffffff, conv_w, j, LB_WARP);
                    cs[j] = __shfl_sync(0xffffffff, conv_s, j, LB_WARP);
                }
                w_last = __shfl_sync(0xffffffff, conv_w, a.conv_k - 1, LB_WARP);
                if (r + GV_WARPS < nr) conv_fetch(tile, r + GV_WARPS);
                else conv_fetch(tile + gridDim.x, warp);
            }
            const float row_y = add_y;
            const unsigned long long row_fold = add_fold, row_fold2 = add_fold2;
            if (EPI == GV_ADD) {
                if (r + GV_WARPS < nr) add_fetch(tile, r + GV_WARPS);
                else add_fetch(tile + gridDim.x, warp);
            }
            if (lane == 0) {
                if (EPI == GV_ADD) {
                    // The previous layer's fused MLP output (fold) and DeltaNet mixer output (fold2, delta_out)
                    // join the residual here, in the order the in-projection summed them (x + mlp + mixer,
                    // then + Wx), and their accumulators are cleared for reuse. Race-free: this lane is the
                    // row's only writer, and between the in-projection (which read x + acc) and this kernel
                    // nothing reads x or the accumulators; the MLP kernel adds into acc only after its
                    // dependency wait, i.e. after this kernel has finished.
                    float y = row_y;
                    if (a.fold) { y += from_fix(row_fold); a.fold[row] = 0ull; }
                    if (a.fold2) { y += from_fix(row_fold2); a.fold2[row] = 0ull; }
                    a.y[row] = y + v;
                } else {
                    a.y[row] = v;
                    if (EPI == GV_CONV && row < a.conv_rows) {
                        const int K = a.conv_k;
                        float* st = a.conv_state + size_t(row) * (K - 1);
                        float acc = w_last * v;
#pragma unroll
                        for (int j = 0; j < GV_MAX_CONV; ++j)
                            if (j < K - 1) acc += cw[j] * cs[j];
                        a.conv_out[row] = silu(acc);
#pragma unroll
                        for (int j = 0; j + 1 < GV_MAX_CONV; ++j)
                            if (j + 1 < K - 1) st[j] = cs[j + 1];
                        if (K > 1) st[K - 2] = v;
                    }
                    if (EPI == GV_ARGMAX && v > best) { best = v; best_i = row; }
                }
            }
        }
        __syncthreads();
        issue(tile + GV_STAGES * gridDim.x, stage);
    }
    cp_async_wait<0>();
    if (EPI == GV_ARGMAX) {
        __shared__ float wb[GV_WARPS];
        __shared__ int wi[GV_WARPS];
        if (lane == 0) { wb[warp] = best; wi[warp] = best_i; }
        __syncthreads();
        if (tid == 0) {
            for (int w = 1; w < GV_WARPS; ++w)
                if (wb[w] > best || (wb[w] == best && wi[w] < best_i)) { best = wb[w]; best_i = wi[w]; }
            if (best_i != 0x7fffffff) {
                unsigned u = __float_as_uint(best);
                u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
                atomicMax(a.key, (unsigned long long)u << 32 | (unsigned long long)(0xffffffffu - unsigned(best_i)));
            }
        }
    }
}

// Fused MLP for one token (FusedMlp in gpu_ops.h). Block b owns the intermediate rows [r0, r1), n = r1 - r0
// <= rb (the grid splits I evenly). Dynamic shared memory (mlp_smem_bytes): xs [H] floats | gain [H] floats |
// act [rb] floats (padded to 16 bytes) | gate rows [rb][H] | up rows [rb][H] | down_t rows [rb][H].
// 512 threads and x read before the down_t copies are requested: 1,094.5 tok/s against 1,030.1 with 256
// threads and every copy before the wait (one H200, synthetic-weight 0.8B, same card; 256 threads with x
// first 1,066.7, 512 threads without 1,056.8; docs/engines.md session 6).
constexpr int MF_THREADS = 512, MF_WARPS = MF_THREADS / LB_WARP;
constexpr int MF_XPER = 3;  // x float4s a thread holds: H <= 4 * MF_THREADS * MF_XPER (6,144; the 27B has 5,120)
__global__ __launch_bounds__(MF_THREADS) void mlp_fused_kernel(FusedMlp a, int rb) {
    extern __shared__ __align__(16) unsigned char mf_smem[];
    const int H = a.H, I = a.I, tid = threadIdx.x, lane = tid % LB_WARP, warp = tid / LB_WARP;
    const int r0 = int((long long)blockIdx.x * I / gridDim.x), r1 = int((long long)(blockIdx.x + 1) * I / gridDim.x);
    const int n = r1 - r0, nch = n * (H / 8);
    float* xs = (float*)mf_smem;
    float* gs = xs + H;    // H % 8 == 0: 16-byte aligned
    float* act = gs + H;
    wtype* wg = (wtype*)(act + (rb + 3) / 4 * 4);
    wtype* wu = wg + size_t(rb) * H;
    wtype* wd = wu + size_t(rb) * H;
    // The weights do not depend on earlier kernels: the norm's gain and the block's gate and up rows (two
    // contiguous runs of n rows) are requested before the dependency wait, so they stream in while the
    // previous kernel finishes. x, the prologue's only round trip, is read right after the wait and only
    // then are the down_t rows requested: a read queues behind the block's outstanding copies, and x
    // behind 114 KB instead of 172 KB shortens the chain more than the later start of the down_t rows
    // costs. Groups: gain; gate and up rows; down_t rows (each phase waits only for its own).
    copy_to_smem<MF_THREADS>((uint4*)gs, (const uint4*)a.gain, H / 4);
    cp_async_commit();
    copy_to_smem<MF_THREADS>((uint4*)wg, (const uint4*)(a.gate_up + size_t(r0) * H), nch);
    copy_to_smem<MF_THREADS>((uint4*)wu, (const uint4*)(a.gate_up + (size_t(I) + r0) * H), nch);
    cp_async_commit();
    griddep_launch();
    // LB_MLP_EARLY_DOWN (a.early_down, an experiment; both modes measured slower, docs/engines.md session 13):
    // the down_t rows requested before the wait too, 1 = once the gate and up rows have landed, 2 = with
    // them. The default (0) requests them after x, below. Why the switch stays: with it, ptxas keeps this
    // kernel's block-uniform arithmetic on the uniform datapath (40 registers instead of 44), and that build's
    // default path measured 2.0% faster per token on three H200s than the kernel without it. The mechanism is
    // not known; tests/engines/test_cuda_compile.py holds the register count, and an edit here needs a new
    // same-card measurement.
    if (a.early_down) {
        if (a.early_down == 1) cp_async_wait<0>();
        copy_to_smem<MF_THREADS>((uint4*)wd, (const uint4*)(a.down_t + size_t(r0) * H), nch);
    }
    griddep_wait();  // from here on: x (complete: the out-projection before this kernel folded the previous
                     // MLP's accumulator into it) and acc (zero: that same fold, or embed_decode for layer 0)
    float4 xv[MF_XPER];
#pragma unroll
    for (int k = 0; k < MF_XPER; ++k) {
        const int i = (tid + k * MF_THREADS) * 4;
        xv[k] = i < H ? *(const float4*)(a.x + i) : make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < H) add_fix4(xv[k], a.x_acc, i);  // a fused DeltaNet layer's mixer output (delta_out)
    }
    if (!a.early_down) copy_to_smem<MF_THREADS>((uint4*)wd, (const uint4*)(a.down_t + size_t(r0) * H), nch);
    cp_async_commit();

    cp_async_wait<2>();
    __syncthreads();  // every thread's gain copies
    {  // xs = rmsnorm(x) * gain
        float ss = 0.f;
#pragma unroll
        for (int k = 0; k < MF_XPER; ++k)
            ss += xv[k].x * xv[k].x + xv[k].y * xv[k].y + xv[k].z * xv[k].z + xv[k].w * xv[k].w;
        const float inv = rsqrtf(block_sum(ss) / H + a.eps);
#pragma unroll
        for (int k = 0; k < MF_XPER; ++k) {
            const int i = (tid + k * MF_THREADS) * 4;
            if (i < H) {
                xs[i] = xv[k].x * inv * gs[i];
                xs[i + 1] = xv[k].y * inv * gs[i + 1];
                xs[i + 2] = xv[k].z * inv * gs[i + 2];
                xs[i + 3] = xv[k].w * inv * gs[i + 3];
            }
        }
    }
    cp_async_wait<1>();
    __syncthreads();  // xs, and every thread's gate and up copies
    // act[j] = silu(gate . xs) * (up . xs) for row r0 + j, one warp a row (the dots as in gemv_fused_kernel)
    const int nvec = H / 8;
    for (int j = warp; j < n; j += MF_WARPS) {
        const float g = warp_sum(dot8_lane((const uint4*)(wg + size_t(j) * H), xs, nvec, lane, LB_WARP));
        const float u = warp_sum(dot8_lane((const uint4*)(wu + size_t(j) * H), xs, nvec, lane, LB_WARP));
        if (lane == 0) act[j] = silu(g) * u;
    }
    cp_async_wait<0>();
    __syncthreads();  // act, and every thread's down_t copies; xs is no longer read
    // This block's share of all H outputs: thread c sums outputs [4c, 4c + 4) over the n rows in order (fixed
    // order: the partial does not depend on scheduling) into xs; then one atomic add per output (a RED at
    // L2), consecutive lanes on consecutive outputs so that a warp's 32 adds cover 8 sectors, not 32.
    for (int c = tid; c < H / 4; c += MF_THREADS) {
        float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
        for (int j = 0; j < n; ++j) {
            float f[4];
            const uint2 w = ((const uint2*)(wd + size_t(j) * H))[c];  // to registers first, as in dot8_lane
            unpack4(w, f);
            const float aj = act[j];
            o.x += aj * f[0]; o.y += aj * f[1]; o.z += aj * f[2]; o.w += aj * f[3];
        }
        ((float4*)xs)[c] = o;
    }
    __syncthreads();
    for (int i = tid; i < H; i += MF_THREADS) atomicAdd(a.acc + i, to_fix(xs[i]));
}

// out[c][r] = in[r][c], 2-byte elements; 32 x 32 tiles through shared memory, block (32, 8).
__global__ void transpose16_kernel(const unsigned short* in, int rows, int cols, unsigned short* out) {
    __shared__ unsigned short tile[32][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    for (int k = threadIdx.y; k < 32; k += blockDim.y) {
        const int r = blockIdx.y * 32 + k;
        if (r < rows && c < cols) tile[k][threadIdx.x] = in[size_t(r) * cols + c];
    }
    __syncthreads();
    const int r = blockIdx.y * 32 + threadIdx.x;
    for (int k = threadIdx.y; k < 32; k += blockDim.y) {
        const int cc = blockIdx.x * 32 + k;
        if (r < rows && cc < cols) out[size_t(cc) * rows + r] = tile[threadIdx.x][k];
    }
}

__global__ void embed_decode_kernel(const int* token, const wtype* E, int H, float* x, unsigned long long* key,
                                    unsigned long long* acc, int n_acc) {
    griddep_launch();
    griddep_wait();
    const wtype* row = E + size_t(*token) * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x) x[i] = w2f(row[i]);
    if (threadIdx.x == 0) *key = 0ull;
    // The accumulators (the fused MLP's, the DeltaNet mixers'): the previous token's LM head read the last
    // layers' outputs from them and nothing folded them; layer 0 needs them zero.
    for (int i = threadIdx.x; i < n_acc * H; i += blockDim.x) acc[i] = 0ull;
}

__global__ void decode_finish_kernel(const unsigned long long* key, int* next, int* pos, int* host_ring,
                                     int ring_mask) {
    griddep_wait();
    const int token = int(0xffffffffu - unsigned(*key & 0xffffffffull)), p = *pos;
    *next = token;
    *pos = p + 1;
    if (host_ring) host_ring[p & ring_mask] = token;  // a posted write over the bus: the kernel does not wait
}

// Gated DeltaNet decode step; grid (hv, dv / 32), 256 threads. Thread (rg = tid / 8, cq = tid % 8) owns
// columns c0 + 4 cq .. + 3 of the state at rows rg + 32 m (m < MR, dk = 32 MR), held in registers: the
// state slice is read once (before the dependency wait) and written once.
template <int MR>
__global__ __launch_bounds__(256) void delta_decode_kernel(const float* conv, const float* proj, int b_off,
                                                           const float* negA, const float* dt_bias, int hk, int hv,
                                                           int dv, float* state, float* out) {
    constexpr int dk = 32 * MR;
    const int h = blockIdx.x, c0 = blockIdx.y * 32, kh = h / (hv / hk);
    const int tid = threadIdx.x, cq = tid & 7, rg = tid >> 3, lane = tid & 31, warp = tid >> 5;
    float* S = state + size_t(h) * dk * dv + c0 + 4 * cq;
    float4 s[MR];
#pragma unroll
    for (int m = 0; m < MR; ++m) s[m] = *(const float4*)(S + size_t(rg + 32 * m) * dv);
    const float neg_a = negA[h], dtb = dt_bias[h];
    griddep_launch();
    griddep_wait();
    // every input of the step in one round trip: q, k, this thread's v columns, the b and a projections
    const float b = proj[b_off + h], a_raw = proj[b_off + hv + h];
    const float4 v = *(const float4*)(conv + size_t(2 * hk) * dk + size_t(h) * dv + c0 + 4 * cq);
    __shared__ float qs[dk], ks[dk], red[2][8][32], nrm[8][2];
    float sq = 0, sk = 0;
    for (int i = tid; i < dk; i += 256) {
        const float q = conv[size_t(kh) * dk + i], k = conv[size_t(hk) * dk + size_t(kh) * dk + i];
        qs[i] = q;
        ks[i] = k;
        sq += q * q;
        sk += k * k;
    }
    sq = warp_sum(sq);
    sk = warp_sum(sk);
    if (lane == 0) { nrm[warp][0] = sq; nrm[warp][1] = sk; }
    __syncthreads();
    sq = 0; sk = 0;
    for (int w = 0; w < 8; ++w) { sq += nrm[w][0]; sk += nrm[w][1]; }
    const float inv_q = rsqrtf(sq + 1e-6f) * rsqrtf(float(dk)), inv_k = rsqrtf(sk + 1e-6f);
    const float sp = softplus(a_raw + dtb);
    const float beta = sigmoidf(b), decay = __expf(neg_a * sp);
    float kr[MR], qr[MR];
#pragma unroll
    for (int m = 0; m < MR; ++m) { kr[m] = ks[rg + 32 * m] * inv_k; qr[m] = qs[rg + 32 * m] * inv_q; }
    float4 p = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int m = 0; m < MR; ++m) {
        s[m].x *= decay; s[m].y *= decay; s[m].z *= decay; s[m].w *= decay;
        p.x += s[m].x * kr[m]; p.y += s[m].y * kr[m]; p.z += s[m].z * kr[m]; p.w += s[m].w * kr[m];
    }
    for (int o = 8; o < 32; o <<= 1) {
        p.x += __shfl_xor_sync(0xffffffff, p.x, o); p.y += __shfl_xor_sync(0xffffffff, p.y, o);
        p.z += __shfl_xor_sync(0xffffffff, p.z, o); p.w += __shfl_xor_sync(0xffffffff, p.w, o);
    }
    if (lane < 8) *(float4*)&red[0][warp][4 * cq] = p;
    __syncthreads();
    float4 kv = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int w = 0; w < 8; ++w) {
        const float4 r = *(const float4*)&red[0][w][4 * cq];
        kv.x += r.x; kv.y += r.y; kv.z += r.z; kv.w += r.w;
    }
    const float4 u = make_float4(beta * (v.x - kv.x), beta * (v.y - kv.y), beta * (v.z - kv.z), beta * (v.w - kv.w));
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int m = 0; m < MR; ++m) {
        s[m].x += kr[m] * u.x; s[m].y += kr[m] * u.y; s[m].z += kr[m] * u.z; s[m].w += kr[m] * u.w;
        o.x += s[m].x * qr[m]; o.y += s[m].y * qr[m]; o.z += s[m].z * qr[m]; o.w += s[m].w * qr[m];
        *(float4*)(S + size_t(rg + 32 * m) * dv) = s[m];
    }
    for (int off = 8; off < 32; off <<= 1) {
        o.x += __shfl_xor_sync(0xffffffff, o.x, off); o.y += __shfl_xor_sync(0xffffffff, o.y, off);
        o.z += __shfl_xor_sync(0xffffffff, o.z, off); o.w += __shfl_xor_sync(0xffffffff, o.w, off);
    }
    if (lane < 8) *(float4*)&red[1][warp][4 * cq] = o;
    __syncthreads();
    if (tid < 8) {
        float4 r = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int w = 0; w < 8; ++w) {
            const float4 q = *(const float4*)&red[1][w][4 * tid];
            r.x += q.x; r.y += q.y; r.z += q.z; r.w += q.w;
        }
        *(float4*)(out + size_t(h) * dv + c0 + 4 * tid) = r;
    }
}

// Gated DeltaNet decode step and its gated out-projection (DeltaOut in gpu_ops.h); grid (hv, R = H / 128),
// 512 threads, dk = dv = 128. In ar's earlier graph the step (delta_decode_kernel) and the out-projection
// (a GATED gemv_fused_kernel) were two kernels with a boundary and three dependent round trips between
// them for 5 MB of bytes; a fusion that split the head over blocks had to exchange the head's sums of
// squares through a counter and gained nothing (docs/engines.md, session 7). Here the R blocks of a head each
// run the head's whole step, the same arithmetic on the same inputs (the state is read R times, from L2),
// so each has all 128 outputs for the norm and no block waits for another's result. One pass over the
// state gives both products the step needs, since with the decayed state g S and u = beta (v - g S^T k):
//   o = (g S + k u^T)^T q = g S^T q + u (k . q).
//   thread (warp w, lane c): state columns 4c .. 4c + 3 at rows w + 16 m, m < 8 (registers, read before
//     the dependency wait: an earlier graph launch wrote it); out_proj row r * 128 + tid / 4, columns
//     32 (tid % 4) .. + 31 of the head's 128 (64 bytes in registers, also before the wait).
//   block (h, r) writes back state columns [r 128 / R, (r + 1) 128 / R) only, once every block of the head has
//     used its copy: each block counts itself in on counters[h] after its pass over the state (a ticket),
//     and the writers wait for the count of their round (complete long before in practice).
// At most 80 registers (40 K of an SM's 64 K), so that the next kernel's blocks (the fused MLP: 512 threads,
// 44 registers, 176 KB of shared memory) fit beside a block of this one and start their weight copies early
// (a first version at 120 registers delayed the MLP by 1.5 us a layer: docs/engines.md, session 12).
#if defined(LB_CUDA)
#define LB_DO_BOUNDS __maxnreg__(80)
#else
#define LB_DO_BOUNDS __launch_bounds__(512)
#endif
constexpr int DO_THREADS = 512, DO_D = 128, DO_ROWS = 128, DO_WARPS = DO_THREADS / 32, DO_M = DO_D / DO_WARPS;
__global__ LB_DO_BOUNDS void delta_out_kernel(DeltaOut a) {
    const int h = blockIdx.x, r = blockIdx.y, R = gridDim.y, kh = h / (a.hv / a.hk);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    float* S = a.state + size_t(h) * DO_D * DO_D + 4 * lane;
    float4 s[DO_M];
#pragma unroll
    for (int m = 0; m < DO_M; ++m) s[m] = *(const float4*)(S + size_t(warp + DO_WARPS * m) * DO_D);
    const int orow = r * DO_ROWS + tid / 4, oq = tid % 4;
    const uint4* wp = (const uint4*)(a.W + size_t(orow) * a.hv * DO_D + size_t(h) * DO_D + 32 * oq);
    uint4 w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) w[j] = wp[j];
    const float neg_a = a.negA[h], dtb = a.dt_bias[h], gain = tid < DO_D ? a.gain[tid] : 0.f;
    griddep_launch();
    griddep_wait();

    // one round trip for every input: q, k, v, z (a quarter of the block each), b and a, the folded rows
    __shared__ float qkvz[4][DO_D], us[DO_D], ons[DO_D], nrm[DO_WARPS], kqw[DO_WARPS];
    __shared__ float4 red[2][DO_WARPS][32];
    const int part = tid / DO_D, e = tid % DO_D;
    const float* src = part == 0   ? a.conv + size_t(kh) * DO_D
                       : part == 1 ? a.conv + size_t(a.hk + kh) * DO_D
                       : part == 2 ? a.conv + size_t(2 * a.hk + h) * DO_D
                                   : a.proj + a.z_off + size_t(h) * DO_D;
    const float val = src[e];
    const float b = a.proj[a.b_off + h], a_raw = a.proj[a.b_off + a.hv + h];
    // rows [f0, f1) of the residual: x + fold_a + fold_b, in the order the in-projection summed them
    const int nb = a.hv * R, bi = r * a.hv + h, f0 = int((long long)bi * a.H / nb), f1 = int((long long)(bi + 1) * a.H / nb);
    const bool folds = tid < f1 - f0 && (a.fold_a || a.fold_b);
    float xf = 0.f;
    if (folds) {
        xf = a.x[f0 + tid];
        if (a.fold_a) xf += from_fix(ld_cg(a.fold_a + f0 + tid));
        if (a.fold_b) xf += from_fix(ld_cg(a.fold_b + f0 + tid));
    }
    qkvz[part][e] = val;
    const float sq = warp_sum(part < 2 ? val * val : 0.f);  // warps 0-3: q, 4-7: k
    if (lane == 0) nrm[warp] = sq;
    __syncthreads();
    const float inv_q = rsqrtf(nrm[0] + nrm[1] + nrm[2] + nrm[3] + 1e-6f) * rsqrtf(float(DO_D));
    const float inv_k = rsqrtf(nrm[4] + nrm[5] + nrm[6] + nrm[7] + 1e-6f);
    // the pass over the state: p = S^T k and t = S^T q for this thread's columns over its rows, k . q
    float4 p = make_float4(0.f, 0.f, 0.f, 0.f), t = p;
    float kq = 0.f;
#pragma unroll
    for (int m = 0; m < DO_M; ++m) {
        const float kk = qkvz[1][warp + DO_WARPS * m] * inv_k, qq = qkvz[0][warp + DO_WARPS * m] * inv_q;
        p.x += s[m].x * kk; p.y += s[m].y * kk; p.z += s[m].z * kk; p.w += s[m].w * kk;
        t.x += s[m].x * qq; t.y += s[m].y * qq; t.z += s[m].z * qq; t.w += s[m].w * qq;
        kq += kk * qq;
    }
    red[0][warp][lane] = p;
    red[1][warp][lane] = t;
    if (lane == 0) kqw[warp] = kq;
    __syncthreads();  // every thread has used its state copy: the block's ticket (thread 0 reads it at the end)
    unsigned ticket = 0;
    if (tid == 0) {
        __threadfence();
        ticket = atomicAdd(a.counters + h, 1u);
    }
    const float sp = softplus(a_raw + dtb);
    const float beta = sigmoidf(b), decay = __expf(neg_a * sp);
    // the head's output c = tid < 128 (column c: lane c / 4, component c % 4 of every warp's partials), its
    // sum of squares over warps 0-3, then the gated RMSNorm into ons
    float oc = 0.f;
    if (tid < DO_D) {
        float pc = 0.f, tc = 0.f, kqs = 0.f;
#pragma unroll
        for (int v = 0; v < DO_WARPS; ++v) {
            pc += ((const float*)red[0][v])[tid];
            tc += ((const float*)red[1][v])[tid];
            kqs += kqw[v];
        }
        const float u = beta * (qkvz[2][tid] - decay * pc);
        us[tid] = u;
        oc = decay * tc + u * kqs;
    }
    const float ss = warp_sum(oc * oc);
    if (lane == 0 && warp < DO_D / 32) nrm[warp] = ss;
    __syncthreads();
    if (tid < DO_D) {
        float n2 = 0.f;
#pragma unroll
        for (int v = 0; v < DO_D / 32; ++v) n2 += nrm[v];
        ons[tid] = gain * oc * silu(qkvz[3][tid]) * rsqrtf(n2 / DO_D + a.eps);
    }
    __syncthreads();
    // the out-projection tile: row orow's 32 columns of this thread, summed over the row's 4 threads
    float d = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        float wf[8];
        unpack8(w[j], wf);
        const float4 xa = ((const float4*)ons)[8 * oq + 2 * j], xb = ((const float4*)ons)[8 * oq + 2 * j + 1];
        d += wf[0] * xa.x + wf[1] * xa.y + wf[2] * xa.z + wf[3] * xa.w + wf[4] * xb.x + wf[5] * xb.y +
             wf[6] * xb.z + wf[7] * xb.w;
    }
    d += __shfl_xor_sync(0xffffffff, d, 1);
    d += __shfl_xor_sync(0xffffffff, d, 2);
    if (oq == 0) atomicAdd(a.acc + orow, to_fix(d));
    if (folds) {
        a.x[f0 + tid] = xf;
        if (a.fold_a) a.fold_a[f0 + tid] = 0ull;
        if (a.fold_b) a.fold_b[f0 + tid] = 0ull;
    }
    // the state, g S + k u^T: this block's columns, once the head's R blocks of this round have counted in
    if (tid == 0) {
        const unsigned target = (ticket / unsigned(R) + 1u) * unsigned(R);
        while (int(ld_acquire(a.counters + h) - target) < 0) {}
    }
    __syncthreads();
    const int cpb = DO_D / R;
    if (4 * lane >= r * cpb && 4 * lane < (r + 1) * cpb) {
        const float4 u = ((const float4*)us)[lane];
#pragma unroll
        for (int m = 0; m < DO_M; ++m) {
            const float kk = qkvz[1][warp + DO_WARPS * m] * inv_k;
            const float4 n = make_float4(decay * s[m].x + kk * u.x, decay * s[m].y + kk * u.y,
                                         decay * s[m].z + kk * u.z, decay * s[m].w + kk * u.w);
            *(float4*)(S + size_t(warp + DO_WARPS * m) * DO_D) = n;
        }
    }
}

// One position of a warp's online softmax for decode attention: the lanes hold PER elements each of the
// (scaled) query q, the position's k and v; m, l and acc (the lane's PER outputs) are updated in place.
template <int PER>
__device__ __forceinline__ void online_softmax_step(const float* q, const float* kf, const float* vf, float& m,
                                                    float& l, float* acc) {
    float d = 0.f;
#pragma unroll
    for (int k = 0; k < PER; ++k) d += q[k] * kf[k];
    const float score = warp_sum(d);
    const float m_new = fmaxf(m, score);
    const float corr = __expf(m - m_new), p = __expf(score - m_new);
    l = l * corr + p;
#pragma unroll
    for (int k = 0; k < PER; ++k) acc[k] = acc[k] * corr + p * vf[k];
    m = m_new;
}

// PER consecutive elements of a KV row starting at e0 (PER a multiple of 8 for 16-byte loads). FIX >= 0: the
// element type is DType(FIX), known at compile time, and `t` is ignored: the kernel then holds one path only.
template <int PER, int FIX = -1>
__device__ __forceinline__ void kv_load_run(const void* row, DType t, int e0, float* f) {
    if (FIX >= 0) t = DType(FIX);
    if (t == DType::BF16) {
#pragma unroll
        for (int c = 0; c < PER / 8; ++c) {
            const uint4 u = ((const uint4*)((const unsigned short*)row + e0))[c];
            const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                f[8 * c + 2 * j] = __uint_as_float(w[j] << 16);
                f[8 * c + 2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
            }
        }
    } else if (t == DType::F16) {
#pragma unroll
        for (int c = 0; c < PER / 8; ++c) {
            const uint4 u = ((const uint4*)((const __half*)row + e0))[c];
            const __half* hh = (const __half*)&u;
#pragma unroll
            for (int j = 0; j < 8; ++j) f[8 * c + j] = __half2float(hh[j]);
        }
    } else if (t == DType::F32) {
#pragma unroll
        for (int c = 0; c < PER / 4; ++c) {
            const float4 u = ((const float4*)((const float*)row + e0))[c];
            f[4 * c] = u.x; f[4 * c + 1] = u.y; f[4 * c + 2] = u.z; f[4 * c + 3] = u.w;
        }
    } else {
#pragma unroll
        for (int k = 0; k < PER; ++k) f[k] = kv_load(row, t, e0 + k);
    }
}

// Decode attention: grid (nkv, splits), 4 warps. Warp w of block b takes positions b*4 + w, + 4*splits, ...
// for all G = nh / nkv query heads of its KV head at once (each lane holds PER = hd / 32 consecutive
// elements), keeps an online softmax per head and writes a partial (m, l, acc) to scratch; the last block
// of a KV head to finish merges the 4*splits partials and applies the sigmoid gate.
constexpr int AD_WARPS = 4, AD_GMAX = 8;
template <int PER>
__global__ __launch_bounds__(AD_WARPS * 32) void attn_decode_kernel(const float* qkv, int nh, int nkv, const int* d_pos,
                                                                    const void* kcache, DType kt, const void* vcache,
                                                                    DType vt, float* scratch, int* counters, float* out) {
    constexpr int hd = 32 * PER;
    griddep_launch();
    griddep_wait();
    const int kvh = blockIdx.x, b = blockIdx.y, ns = gridDim.y, P = ns * AD_WARPS;
    const int G = nh / nkv, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int last = *d_pos;
    const int e0 = lane * PER;
    float q[AD_GMAX][PER], acc[AD_GMAX][PER], m[AD_GMAX], l[AD_GMAX];
    const float scale = rsqrtf(float(hd));
#pragma unroll
    for (int g = 0; g < AD_GMAX; ++g) {
        m[g] = -FLT_MAX;
        l[g] = 0.f;
#pragma unroll
        for (int k = 0; k < PER; ++k) {
            q[g][k] = g < G ? qkv[size_t(kvh * G + g) * 2 * hd + e0 + k] * scale : 0.f;
            acc[g][k] = 0.f;
        }
    }
    const size_t krow = kv_row_bytes(kt, hd), vrow = kv_row_bytes(vt, hd);
    for (int s = b * AD_WARPS + warp; s <= last; s += P) {
        float kf[PER], vf[PER];
        kv_load_run<PER>((const uint8_t*)kcache + (size_t(s) * nkv + kvh) * krow, kt, e0, kf);
        kv_load_run<PER>((const uint8_t*)vcache + (size_t(s) * nkv + kvh) * vrow, vt, e0, vf);
#pragma unroll
        for (int g = 0; g < AD_GMAX; ++g) {
            if (g >= G) break;
            online_softmax_step<PER>(q[g], kf, vf, m[g], l[g], acc[g]);
        }
    }
    // partials: acc [nh][P][hd], then (m, l) [nh][P][2]
    const int part = b * AD_WARPS + warp;
    float* ml = scratch + size_t(nh) * P * hd;
#pragma unroll
    for (int g = 0; g < AD_GMAX; ++g) {
        if (g >= G) break;
        const int h = kvh * G + g;
        if (lane == 0) { ml[(size_t(h) * P + part) * 2] = m[g]; ml[(size_t(h) * P + part) * 2 + 1] = l[g]; }
        float4* ap = (float4*)(scratch + (size_t(h) * P + part) * hd + e0);
#pragma unroll
        for (int k = 0; k < PER / 4; ++k) ap[k] = make_float4(acc[g][4 * k], acc[g][4 * k + 1], acc[g][4 * k + 2], acc[g][4 * k + 3]);
    }
    __threadfence();
    __syncthreads();
    __shared__ int is_last;
    if (threadIdx.x == 0) is_last = atomicAdd(&counters[kvh], 1) == ns - 1;
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    for (int g = warp; g < G; g += AD_WARPS) {
        const int h = kvh * G + g;
        const float2* hml = (const float2*)(ml + size_t(h) * P * 2);
        float M = -FLT_MAX;
        for (int p = 0; p < P; ++p) M = fmaxf(M, ld_cg(hml + p).x);
        float L = 0.f, o[PER];
#pragma unroll
        for (int k = 0; k < PER; ++k) o[k] = 0.f;
        for (int p = 0; p < P; ++p) {
            const float2 pm = ld_cg(hml + p);
            const float w = __expf(pm.x - M);
            L += pm.y * w;
            const float4* ap = (const float4*)(scratch + (size_t(h) * P + p) * hd + e0);
#pragma unroll
            for (int k = 0; k < PER / 4; ++k) {
                const float4 v = ld_cg(ap + k);
                o[4 * k] += v.x * w; o[4 * k + 1] += v.y * w; o[4 * k + 2] += v.z * w; o[4 * k + 3] += v.w * w;
            }
        }
        const float* gate = qkv + size_t(h) * 2 * hd + hd;
#pragma unroll
        for (int k = 0; k < PER; ++k) out[size_t(h) * hd + e0 + k] = o[k] / L * sigmoidf(gate[e0 + k]);
    }
    if (threadIdx.x == 0) counters[kvh] = 0;
}


// Flash-decoding attention for one token: grid (nkv, nb), AF_WARPS warps. The context 0..last is cut into
// `active` chunks of `per` = max(AF_MIN_PER, ceil(ctx / nb)) positions, so a short context takes a few blocks
// and a long one all nb; block b < active takes chunk b, the others return at once. Warp w takes positions
// w, w + AF_WARPS, ... of the chunk, U at a time (all U K and V rows requested before any is used, so a lane
// has 2U loads in flight), for all G <= GM query heads of its KV head. The block merges its warps in shared
// memory into one partial (m, l, acc) per query head; the last of the `active` blocks of a KV head (counter)
// merges the partials in block order and applies the sigmoid gate. The split depends only on the context
// length and nb, and every sum runs in a fixed order, so the result is the same whichever block ends last.
// KVF >= 0: K and V are both DType(KVF) (the bf16 default), fixed at compile time. Machine code is time here:
// the kernel runs once a layer, its code cold (the weight stream evicts it from L2), and the version that
// switched on the type at run time (every type's path, unrolled 2U times; 117 KB of sm_90 code against 52 KB
// now) took 17 us a call at short context against ~11 (CUPTI timeline, docs/engines.md session 9).
constexpr int AF_WARPS = 8, AF_MIN_PER = 32, AF_MAX_NB = 256;
template <int PER, int GM, int U, int KVF>
__global__ __launch_bounds__(AF_WARPS * 32) void attn_decode_flash_kernel(const float* qkv, int nh, int nkv,
                                                                          const int* d_pos, const void* kcache,
                                                                          DType kt, const void* vcache, DType vt,
                                                                          float* scratch, int* counters, float* out) {
    constexpr int hd = 32 * PER;
    if (KVF >= 0) kt = vt = DType(KVF);
    __shared__ float s_ml[AF_WARPS][GM][2];
    __shared__ __align__(16) float s_acc[AF_WARPS][hd];
    __shared__ float s_w[GM][AF_MAX_NB];
    __shared__ float s_L[GM];
    __shared__ int s_last;
    griddep_launch();
    griddep_wait();
    const int kvh = blockIdx.x, b = blockIdx.y, nb = gridDim.y;
    const int G = nh / nkv, warp = threadIdx.x / 32, lane = threadIdx.x % 32, e0 = lane * PER;
    const int ctx = *d_pos + 1;
    const int per = max(AF_MIN_PER, (ctx + nb - 1) / nb), active = (ctx + per - 1) / per;
    if (b >= active) return;
    const int p0 = b * per, p1 = min(ctx, p0 + per);

    float q[GM][PER], acc[GM][PER], m[GM], l[GM];
    const float scale = rsqrtf(float(hd));
#pragma unroll
    for (int g = 0; g < GM; ++g) {
        m[g] = -FLT_MAX;
        l[g] = 0.f;
#pragma unroll
        for (int k = 0; k < PER; ++k) {
            q[g][k] = g < G ? qkv[size_t(kvh * G + g) * 2 * hd + e0 + k] * scale : 0.f;
            acc[g][k] = 0.f;
        }
    }
    const size_t krow = kv_row_bytes(kt, hd), vrow = kv_row_bytes(vt, hd);
    for (int s = p0 + warp; s < p1; s += U * AF_WARPS) {
        float kf[U][PER], vf[U][PER];
#pragma unroll
        for (int u = 0; u < U; ++u) {  // positions past the chunk load row s again (cached) and are skipped
            const int su = s + u * AF_WARPS < p1 ? s + u * AF_WARPS : s;
            kv_load_run<PER, KVF>((const uint8_t*)kcache + (size_t(su) * nkv + kvh) * krow, kt, e0, kf[u]);
            kv_load_run<PER, KVF>((const uint8_t*)vcache + (size_t(su) * nkv + kvh) * vrow, vt, e0, vf[u]);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (s + u * AF_WARPS >= p1) break;
#pragma unroll
            for (int g = 0; g < GM; ++g) {
                if (g >= G) break;
                online_softmax_step<PER>(q[g], kf[u], vf[u], m[g], l[g], acc[g]);
            }
        }
    }

    // block merge, one query head at a time: the warps' accumulators rescaled to the block maximum, summed
    // in warp order. Partials: acc [nh][nb][hd], then (m, l) [nh][nb][2].
    float* ml = scratch + size_t(nh) * nb * hd;
    if (lane == 0) {
#pragma unroll
        for (int g = 0; g < GM; ++g) { s_ml[warp][g][0] = m[g]; s_ml[warp][g][1] = l[g]; }
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < GM; ++g) {
        if (g >= G) break;
        float M = -FLT_MAX;
#pragma unroll
        for (int w = 0; w < AF_WARPS; ++w) M = fmaxf(M, s_ml[w][g][0]);
        const float f = __expf(m[g] - M);  // 0 for a warp that had no position (m = -FLT_MAX)
#pragma unroll
        for (int k = 0; k < PER; ++k) s_acc[warp][e0 + k] = acc[g][k] * f;
        __syncthreads();
        const int h = kvh * G + g;
#pragma unroll 1  // one pass for hd <= 256; unrolled, this loop was half the kernel's machine code
        for (int e = threadIdx.x; e < hd; e += AF_WARPS * 32) {
            float o = 0.f;
#pragma unroll
            for (int w = 0; w < AF_WARPS; ++w) o += s_acc[w][e];
            scratch[(size_t(h) * nb + b) * hd + e] = o;
        }
        if (threadIdx.x == 0) {
            float L = 0.f;
            for (int w = 0; w < AF_WARPS; ++w) L += s_ml[w][g][1] * __expf(s_ml[w][g][0] - M);
            ml[(size_t(h) * nb + b) * 2] = M;
            ml[(size_t(h) * nb + b) * 2 + 1] = L;
        }
        __syncthreads();
    }
    __threadfence();
    if (threadIdx.x == 0) s_last = atomicAdd(&counters[kvh], 1) == active - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();

    // final merge: warp g computes head g's chunk weights exp(m_p - M) and L; then each thread takes
    // 4 consecutive outputs of one head and sums the chunks in order.
    if (warp < G) {
        const int h = kvh * G + warp;
        const float2* hml = (const float2*)(ml + size_t(h) * nb * 2);
        float M = -FLT_MAX;
        for (int p = lane; p < active; p += 32) M = fmaxf(M, ld_cg(hml + p).x);
        M = warp_max(M);
        float L = 0.f;
        for (int p = lane; p < active; p += 32) {
            const float2 v = ld_cg(hml + p);
            const float w = __expf(v.x - M);
            s_w[warp][p] = w;
            L += v.y * w;
        }
        L = warp_sum(L);
        if (lane == 0) s_L[warp] = L;
    }
    __syncthreads();
#pragma unroll 1
    for (int i = threadIdx.x; i < G * hd / 4; i += AF_WARPS * 32) {
        const int g = i / (hd / 4), e = 4 * (i % (hd / 4)), h = kvh * G + g;
        float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
        const float* part = scratch + size_t(h) * nb * hd + e;
#pragma unroll 8
        for (int p = 0; p < active; ++p) {
            const float w = s_w[g][p];
            const float4 v = ld_cg((const float4*)(part + size_t(p) * hd));
            o.x += w * v.x; o.y += w * v.y; o.z += w * v.z; o.w += w * v.w;
        }
        const float inv = 1.f / s_L[g];
        const float* gate = qkv + size_t(h) * 2 * hd + hd + e;
        float* dst = out + size_t(h) * hd + e;
        dst[0] = o.x * inv * sigmoidf(gate[0]);
        dst[1] = o.y * inv * sigmoidf(gate[1]);
        dst[2] = o.z * inv * sigmoidf(gate[2]);
        dst[3] = o.w * inv * sigmoidf(gate[3]);
    }
    if (threadIdx.x == 0) counters[kvh] = 0;
}


// Decode attention at a short context with attn_prep folded in (CUDA, bf16 K and V caches, head_dim 256):
// grid nh, one block of AS_WARPS warps per query head, no step across blocks. At a short context the two
// kernels it stands in for (attn_prep, then the flash kernel: chunks, block merge, last-block merge) took
// ~16 us a layer for about 1 us of work (CUPTI timeline, docs/engines.md session 9): a chain of dependent
// round trips and a kernel boundary. Here:
//  - before the dependency wait, each warp requests the K and V rows of its first AS_U cached positions
//    (w, w + AS_WARPS, ...). Safe: the caches up to the step's position and the position itself were
//    written by earlier graph launches (prefill, or the previous step, whose last kernel advances d_pos),
//    which are complete before this launch starts;
//  - after it, one round trip reads the head's q and gate and its KV head's k and v rows; q and k are
//    normalised (gain) and rotated (partial RoPE) in shared memory as attn_prep does, k and v rounded to
//    bf16 as the cache stores them, and the first query head of each KV head writes them to the caches;
//  - each warp runs an online softmax over its positions (the current one, from shared memory, on warp
//    pos % AS_WARPS), and the warps merge in warp order: o = softmax(q K^T / sqrt(hd)) V * sigmoid(gate).
// Positions past the first AS_WARPS * AS_U are loaded batch by batch after the wait (the host takes this
// kernel up to a context of attn_decode_short_ctx()).
constexpr int AS_WARPS = 16, AS_U = 8, AS_HD = 256;
__global__ __launch_bounds__(AS_WARPS * 32) void attn_decode_short_kernel(const float* qkv, int nh, int nkv, int rot,
                                                                          float theta, const float* q_gain,
                                                                          const float* k_gain, float eps,
                                                                          const int* d_pos, unsigned short* kcache,
                                                                          unsigned short* vcache, float* out) {
    constexpr int hd = AS_HD, PER = hd / 32, BATCH = AS_WARPS * AS_U;  // a lane's elements: e0 .. e0 + 7
    __shared__ __align__(16) float sq[hd], sk[hd], sv[hd];
    __shared__ float s_red[AS_WARPS][2], s_ml[AS_WARPS][2];
    __shared__ __align__(16) float s_acc[AS_WARPS][hd];
    const int h = blockIdx.x, G = nh / nkv, kvh = h / G, half = rot / 2;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, e0 = lane * PER;
    const bool el = tid < hd;  // thread tid holds element tid of the q, k, v and gate rows
    const int pos = *d_pos;    // this step's position (see above); the context is pos + 1
    const float gq = el ? q_gain[tid] : 0.f, gk = el ? k_gain[tid] : 0.f;
    const float inv_freq = tid < half ? rope_inv_freq(tid, rot, theta) : 0.f;
    uint4 kr[AS_U], vr[AS_U];
    auto load_batch = [&](int s0) {
#pragma unroll
        for (int u = 0; u < AS_U; ++u) {
            const int s = s0 + warp + u * AS_WARPS;
            if (s < pos) {
                const size_t at = (size_t(s) * nkv + kvh) * hd + e0;
                kr[u] = *(const uint4*)(kcache + at);
                vr[u] = *(const uint4*)(vcache + at);
            }
        }
    };
    load_batch(0);
    griddep_launch();
    griddep_wait();

    const float* qrow = qkv + size_t(h) * 2 * hd;
    const float* krow = qkv + size_t(2) * nh * hd + size_t(kvh) * hd;
    const float* vrow = krow + size_t(nkv) * hd;
    float xq = 0.f, xk = 0.f, xv = 0.f, gate = 0.f;
    if (el) { xq = qrow[tid]; gate = qrow[hd + tid]; xk = krow[tid]; xv = vrow[tid]; }
    {  // the two RMSNorms' sums of squares, one block reduction, warps summed in order
        const float a = warp_sum(xq * xq), b = warp_sum(xk * xk);
        if (lane == 0) { s_red[warp][0] = a; s_red[warp][1] = b; }
        __syncthreads();
        float ssq = 0.f, ssk = 0.f;
#pragma unroll
        for (int w = 0; w < AS_WARPS; ++w) { ssq += s_red[w][0]; ssk += s_red[w][1]; }
        if (el) {
            sq[tid] = xq * rsqrtf(ssq / hd + eps) * gq;
            sk[tid] = xk * rsqrtf(ssk / hd + eps) * gk;
        }
    }
    __syncthreads();
    if (tid < half) {
        float sn, cs;
        sincosf(float(pos) * inv_freq, &sn, &cs);
        // rope_rotate of q and k with all four loads first (two rope_rotate calls schedule differently
        // from the code measured in docs/engines.md session 11; the arithmetic is the same)
        const float qa = sq[tid], qb = sq[tid + half], ka = sk[tid], kb = sk[tid + half];
        sq[tid] = qa * cs - qb * sn;
        sq[tid + half] = qb * cs + qa * sn;
        sk[tid] = ka * cs - kb * sn;
        sk[tid + half] = kb * cs + ka * sn;
    }
    __syncthreads();
    if (el) {  // this position's k and v as the cache holds them
        const unsigned short kb = bf16_bits(sk[tid]), vb = bf16_bits(xv);
        if (h % G == 0) {
            const size_t at = (size_t(pos) * nkv + kvh) * hd + tid;
            kcache[at] = kb;
            vcache[at] = vb;
        }
        sk[tid] = bf16_value(kb);
        sv[tid] = bf16_value(vb);
    }
    __syncthreads();

    const float scale = rsqrtf(float(hd));
    float q[PER], acc[PER], m = -FLT_MAX, l = 0.f;
#pragma unroll
    for (int k = 0; k < PER; ++k) { q[k] = sq[e0 + k] * scale; acc[k] = 0.f; }
    for (int s0 = 0;; s0 += BATCH) {
#pragma unroll
        for (int u = 0; u < AS_U; ++u) {
            if (s0 + warp + u * AS_WARPS >= pos) break;
            float kf[PER], vf[PER];
            unpack8(kr[u], kf);  // wtype is bf16 in every build that takes this kernel (attn_decode_short_ctx)
            unpack8(vr[u], vf);
            online_softmax_step<PER>(q, kf, vf, m, l, acc);
        }
        if (s0 + BATCH >= pos) break;
        load_batch(s0 + BATCH);
    }
    if (warp == pos % AS_WARPS) {
        float kf[PER], vf[PER];
#pragma unroll
        for (int k = 0; k < PER; ++k) { kf[k] = sk[e0 + k]; vf[k] = sv[e0 + k]; }
        online_softmax_step<PER>(q, kf, vf, m, l, acc);
    }

    // the warps' partials rescaled to the block maximum and summed in warp order
    if (lane == 0) { s_ml[warp][0] = m; s_ml[warp][1] = l; }
    __syncthreads();
    float M = -FLT_MAX;
#pragma unroll
    for (int w = 0; w < AS_WARPS; ++w) M = fmaxf(M, s_ml[w][0]);
    const float f = __expf(m - M);  // 0 for a warp that had no position (m = -FLT_MAX)
#pragma unroll
    for (int k = 0; k < PER; ++k) s_acc[warp][e0 + k] = acc[k] * f;
    __syncthreads();
    if (el) {
        float L = 0.f, o = 0.f;
#pragma unroll
        for (int w = 0; w < AS_WARPS; ++w) {
            L += s_ml[w][1] * __expf(s_ml[w][0] - M);
            o += s_acc[w][tid];
        }
        out[size_t(h) * hd + tid] = o / L * sigmoidf(gate);
    }
}

}  // namespace

// ----------------------------------------------------------------------------------------- launchers

namespace {
struct DecodeCfg {
    bool ready = false, pdl = false;
    int sms = 1;
    size_t smem_block = 48 * 1024, smem_sm = 64 * 1024;
    size_t tile = 16 * 1024;  // GEMV weight tile bytes (LB_GV_TILE)
    int max_per_sm = 8;       // GEMV blocks per SM cap (LB_GV_PER_SM)
    int prewait = 1;          // GEMV tiles requested before the dependency wait, of GV_STAGES (LB_GV_PREWAIT)
    size_t mlp_smem_block = 48 * 1024, mlp_static = 0;  // fused MLP: dynamic shared memory a block may take
} g_dec;

// Launch with the programmatic-stream-serialization attribute when PDL is on (sm_90+, CUDA).
template <typename... KArgs, typename... Args>
void launch_k(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, gpuStream_t s, Args... args) {
#if defined(LB_CUDA)
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = g_dec.pdl ? 1 : 0;
    GPU_CHECK(cudaLaunchKernelEx(&cfg, kernel, KArgs(args)...));
#else
    kernel<<<grid, block, smem, s>>>(KArgs(args)...);
#endif
}

}  // namespace


namespace {

#if defined(LB_CUDA)
int current_device_attr(cudaDeviceAttr attr) {
    int dev = 0, v = 0;
    GPU_CHECK(cudaGetDevice(&dev));
    GPU_CHECK(cudaDeviceGetAttribute(&v, attr, dev));
    return v;
}
#endif
// The most dynamic shared memory a block may opt into (one device per process: read once).
int smem_optin_limit() {
#if defined(LB_CUDA)
    static const int limit = current_device_attr(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    return limit;
#else
    return 48 * 1024;
#endif
}
// Launch with `smem` bytes of dynamic shared memory. CUDA kernels must opt in above 48 KB: each kernel's
// limit is raised on its first launch, and again if a later launch needs more.
template <typename... KArgs, typename... Args>
void launch_smem(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, gpuStream_t s, Args... args) {
#if defined(LB_CUDA)
    static std::vector<std::pair<void (*)(KArgs...), size_t>> raised;  // kernels of this signature
    auto it = std::find_if(raised.begin(), raised.end(), [&](const auto& r) { return r.first == kernel; });
    if (it == raised.end() || it->second < smem) {
        GPU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        if (it == raised.end()) raised.emplace_back(kernel, smem);
        else it->second = smem;
    }
#endif
    kernel<<<grid, block, smem, s>>>(KArgs(args)...);
}

// A device buffer that only grows, for prefill scratch (split-K partials, delta-rule chunk data). Growing
// synchronises the stream, so it is refused (nullptr) during graph capture; callers then fall back.
struct GrowBuffer {
    float* p = nullptr;
    size_t cap = 0;  // floats
    float* get(size_t floats, gpuStream_t s) {
        if (floats <= cap) return p;
#if defined(LB_CUDA)
        cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
        GPU_CHECK(cudaStreamIsCapturing(s, &st));
        if (st != cudaStreamCaptureStatusNone) return nullptr;
#endif
        GPU_CHECK(gpuStreamSynchronize(s));
        if (p) GPU_CHECK(gpuFree(p));
        p = nullptr;
        GPU_CHECK(gpuMalloc(&p, floats * sizeof(float)));
        cap = floats;
        return p;
    }
};

GrowBuffer g_dr_prep;  // delta-rule chunk data (delta_chunk_prep_kernel)

#if defined(LB_CUDA)
// Split-K for GEMMs with few output tiles: at prefill lengths of a few hundred tokens the 1024-wide
// projections (down, out, o_proj) have 144 tiles for 132 multiprocessors, one 4-warp block each, which
// leaves the tensor cores waiting on memory. The K loop is cut so that there are about four blocks per
// multiprocessor; the partials go to a workspace and are summed in split order, so results do not depend
// on block scheduling. LB_GPU_SPLITK: blocks a multiprocessor to aim for (default 4; 0 turns it off).
GrowBuffer g_splitk;

int gemm_splits(int tiles, int in, size_t count, gpuStream_t s) {
    static const int per_sm = std::getenv("LB_GPU_SPLITK") ? std::max(0, std::atoi(std::getenv("LB_GPU_SPLITK"))) : 4;
    static const int sms = current_device_attr(cudaDevAttrMultiProcessorCount);
    if (per_sm == 0 || count % 4 != 0) return 1;
    const int ksteps = (in + TK - 1) / TK;
    const int splits = std::min({(per_sm * sms) / std::max(1, tiles), ksteps / 8, 8});  // >= 8 K steps a split
    if (splits < 2 || !g_splitk.get(size_t(splits) * count, s)) return 1;
    return splits;
}
#endif
}  // namespace

void embed(const int* d_tokens, int n, const wtype* E, int H, float* x, gpuStream_t s) {
    embed_kernel<<<n, 256, 0, s>>>(d_tokens, E, H, x);
}

void matmul(const float* x, int n, int in, const wtype* W, int out, float* y, bool accumulate, gpuStream_t s) {
    const int warps = 8;
    const dim3 grid((out + warps - 1) / warps);
#if !defined(__HIPCC__) && !defined(LB_USE_HIP)
    if (n > 8) {
        const dim3 g2((out + TN - 1) / TN, (n + TM - 1) / TM);
        if (in % 8 == 0 && !std::getenv("LB_GPU_OLD_GEMM")) {
            const int splits = gemm_splits(int(g2.x * g2.y), in, size_t(n) * out, s);
            const int ksteps = ((in + TK - 1) / TK + splits - 1) / splits;
            if (splits == 1) {
                gemm_vec_kernel<<<g2, 128, 0, s>>>(x, n, in, W, out, y, accumulate, ksteps, nullptr);
            } else {
                gemm_vec_kernel<<<dim3(g2.x, g2.y, splits), 128, 0, s>>>(x, n, in, W, out, y, accumulate, ksteps,
                                                                         g_splitk.p);
                const size_t count = size_t(n) * out;
                gemm_splitk_sum_kernel<<<unsigned((count / 4 + 255) / 256), 256, 0, s>>>(g_splitk.p, splits, count,
                                                                                         y, accumulate);
            }
        } else {
            gemm_kernel<<<g2, 128, 0, s>>>(x, n, in, W, out, y, accumulate);
        }
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
    static const bool old_conv = env_on("LB_GPU_OLD_CONV");
    if (!old_conv) {
        const dim3 grid((C + 127) / 128, (n + CONV_TT - 1) / CONV_TT);
        switch (K) {
#define LB_CONV_CASE(k) case k: conv1d_silu_par_kernel<k><<<grid, 128, 0, s>>>(x, ldx, n, C, w, state, y); return;
            LB_CONV_CASE(1) LB_CONV_CASE(2) LB_CONV_CASE(3) LB_CONV_CASE(4)
            LB_CONV_CASE(5) LB_CONV_CASE(6) LB_CONV_CASE(7) LB_CONV_CASE(8)
#undef LB_CONV_CASE
            default: break;
        }
    }
    conv1d_silu_kernel<<<(C + 63) / 64, 64, 0, s>>>(x, ldx, n, C, K, w, state, y);
}

void deltanet_prep(float* y, int ldy, const float* proj, int ldp, int b_off, const float* negA, const float* dt_bias,
                   int n, int hk, int dk, int hv, float* g, float* beta, gpuStream_t s) {
    deltanet_prep_kernel<<<dim3(n, 2 * hk + 1), 128, 0, s>>>(y, ldy, proj, ldp, b_off, negA, dt_bias, hk, dk, hv, g, beta);
}

void delta_rule(const float* qkv, int ld, int n, int hk, int hv, int dk, int dv, const float* g, const float* beta,
                float* state, float* out, gpuStream_t s) {
    const size_t smem = sizeof(float) * (2 * DC * dk + 3 * DC * dv + 2 * DC * DC + 2 * DC);
    static const int cb = [] {  // LB_GPU_DR_CB: value columns per block of the column-split kernel (16 or 32)
        const char* e = std::getenv("LB_GPU_DR_CB");
        return e && (std::atoi(e) == 16 || std::atoi(e) == 32) ? std::atoi(e) : DR_CB;
    }();
    if (dv % cb == 0 && dk <= 256 && !std::getenv("LB_GPU_OLD_DELTA")) {
        const int limit = smem_optin_limit();
        // the two-pass (WY) form, unless LB_GPU_DR_WY=0 or its chunk data cannot be allocated (graph capture)
        static const bool wy = !env_off("LB_GPU_DR_WY");
        const size_t sp = dr_prep_smem(32, dk), sw = dr_wy_smem(32, dk, DR_CB);
        const int chunks = (n + 31) / 32;
        float* prep = nullptr;
        if (wy && dv % DR_CB == 0 && sp <= size_t(limit) && sw <= size_t(limit) &&
            (prep = g_dr_prep.get(size_t(chunks) * hv * dr_prep_floats<32>(), s))) {
            launch_smem(delta_chunk_prep_kernel<32>, dim3(chunks, hv), dim3(256), sp, s, qkv, ld, n, hk, hv, dk, g, beta, prep);
            launch_smem(delta_rule_wy_kernel<32, DR_CB>, dim3(hv, dv / DR_CB), dim3(256), sw, s, qkv, ld, n, hk, hv, dk, dv,
                        prep, state, out);
            return;
        }
        const size_t s32 = delta_cols_smem(32, dk, cb), s16 = delta_cols_smem(16, dk, cb);
        const dim3 grid(hv, dv / cb);
        auto go = [&](auto kernel, size_t smem_cols) {
            launch_smem(kernel, grid, dim3(256), smem_cols, s, qkv, ld, n, hk, hv, dk, dv, g, beta, state, out);
        };
        if (s32 <= size_t(limit)) return cb == 32 ? go(delta_rule_cols_kernel<32, 32>, s32) : go(delta_rule_cols_kernel<32, 16>, s32);
        if (s16 <= size_t(limit)) return cb == 32 ? go(delta_rule_cols_kernel<16, 32>, s16) : go(delta_rule_cols_kernel<16, 16>, s16);
    }
    launch_smem(delta_rule_kernel, dim3(hv), dim3(256), smem, s, qkv, ld, n, hk, hv, dk, dv, g, beta, state, out);
}

void gated_rmsnorm(const float* x, const float* z, int ldz, const float* gain, float* y, int n, int heads, int dim,
                   float eps, gpuStream_t s) {
    gated_rmsnorm_kernel<<<n * heads, 128, 0, s>>>(x, z, ldz, gain, y, heads, dim, eps);
}

// The attention kernels built for a bf16 K and V cache (the default) carry that path alone; any other cache
// type, or LB_GPU_ATTN_ANYKV=1 (for A/B timing), takes the kernels that switch on the type at run time.
static bool kv_bf16_kernels(DType kt, DType vt) {
    static const bool any_kv = env_on("LB_GPU_ATTN_ANYKV");
    return kt == DType::BF16 && vt == DType::BF16 && !any_kv;
}

void attn_prep(float* qkv, int ld, int n, int nh, int nkv, int hd, int rot, float theta, const float* q_gain,
               const float* k_gain, float eps, const int* d_pos, void* kcache, DType kt, void* vcache, DType vt,
               gpuStream_t s) {
    if (hd > AP_MAX_HD || rot > hd) lb::fail("unsupported", "attention head_dim > 512 on the GPU");
    auto* kernel = kv_bf16_kernels(kt, vt) ? attn_prep_kernel<int(DType::BF16)> : attn_prep_kernel<-1>;
    launch_k(kernel, dim3(n, nh + nkv), dim3(AP_THREADS), 0, s, qkv, ld, nh, nkv, hd, rot, theta, q_gain, k_gain, eps,
             d_pos, kcache, kt, vcache, vt);
}

void attention(const float* qkv, int ld, int n, int nh, int nkv, int hd, const int* d_pos, const void* kcache, DType kt,
               const void* vcache, DType vt, float* out, gpuStream_t s) {
    if (hd > 512) lb::fail("unsupported", "head_dim above 512");
#if defined(LB_CUDA)
    // The tiled kernel for prefill (n >= 8; one-token steps keep the one-block-per-row kernel).
    static const bool old_attn = env_on("LB_GPU_OLD_ATTN");
    const int G = nkv > 0 ? nh / nkv : 0;
    if (!old_attn && n >= 8 && G > 0 && nh % nkv == 0 && TA_QV % G == 0 && ld % 4 == 0 &&
        (hd == 128 || hd == 256)) {
        const size_t limit = size_t(smem_optin_limit());
        auto go = [&](auto kernel, dim3 grid, int threads, size_t smem) {
            launch_smem(kernel, grid, dim3(threads), smem, s, qkv, ld, n, nh, nkv, d_pos, kcache, kt, vcache, vt, out);
        };
        // tensor cores unless LB_GPU_ATTN_TILED=1 (the fp32 kernel below)
        static const bool tiled = env_on("LB_GPU_ATTN_TILED");
        if (!tiled && n >= 16 && AW_QV % G == 0) {
            const dim3 gw((n + AW_QV / G - 1) / (AW_QV / G), nkv);
            if (hd == 256 && attention_wmma_smem<256>() <= limit)
                return go(attention_wmma_kernel<256>, gw, AW_THREADS, attention_wmma_smem<256>());
            if (hd == 128 && attention_wmma_smem<128>() <= limit)
                return go(attention_wmma_kernel<128>, gw, AW_THREADS, attention_wmma_smem<128>());
        }
        const dim3 grid((n + TA_QV / G - 1) / (TA_QV / G), nkv);
        if (hd == 256 && attention_tiled_smem<256>() <= limit)
            return go(attention_tiled_kernel<256>, grid, TA_THREADS, attention_tiled_smem<256>());
        if (hd == 128 && attention_tiled_smem<128>() <= limit)
            return go(attention_tiled_kernel<128>, grid, TA_THREADS, attention_tiled_smem<128>());
    }
#endif
    attention_kernel<<<dim3(n, nh), ATT_WARPS * LB_WARP, 0, s>>>(qkv, ld, nh, nkv, hd, d_pos, kcache, kt, vcache, vt, out);
}

void silu_mul(const float* gu, int n, int I, float* out, gpuStream_t s) {
    const size_t total = size_t(n) * I;
    silu_mul_kernel<<<unsigned((total + 255) / 256), 256, 0, s>>>(gu, n, I, out);
}

void argmax(const float* x, int n, int* d_out, gpuStream_t s) { argmax_kernel<<<1, 1024, 0, s>>>(x, n, d_out); }

void add_pos(int* d_pos, int n, gpuStream_t s) { add_pos_kernel<<<1, 1, 0, s>>>(d_pos, n); }

// ----------------------------------------------------------------------------------------- fused decode launchers

namespace {
size_t gv_xs_bytes(int in) { return ((size_t(in) * 4 + 15) / 16) * 16; }
}  // namespace

void decode_setup(int device) {
    gpuDeviceProp p;
    GPU_CHECK(gpuGetDeviceProperties(&p, device));
    g_dec.sms = p.multiProcessorCount;
#if defined(LB_CUDA)
    // dynamic shared memory a GEMV block may take: the opt-in limit less room for its static arrays
    g_dec.smem_block = p.sharedMemPerBlockOptin - 2048;
    g_dec.smem_sm = p.sharedMemPerMultiprocessor;
    g_dec.pdl = p.major >= 9 && !env_off("LB_GPU_PDL");
#else
    g_dec.smem_block = p.sharedMemPerBlock;
    g_dec.smem_sm = p.maxSharedMemoryPerMultiProcessor;
    g_dec.pdl = false;
#endif
#if defined(LB_CUDA)
    void (*kernels[])(FusedGemv, int, int, int) = {
        gemv_fused_kernel<GV_PLAIN, GV_STORE>,    gemv_fused_kernel<GV_PLAIN, GV_ADD>,
        gemv_fused_kernel<GV_RMSNORM, GV_STORE>,  gemv_fused_kernel<GV_RMSNORM, GV_CONV>,
        gemv_fused_kernel<GV_RMSNORM, GV_ARGMAX>, gemv_fused_kernel<GV_GATED, GV_ADD>,
        gemv_fused_kernel<GV_SILU, GV_ADD>};
    for (auto k : kernels) {
        cudaFuncAttributes fa;
        GPU_CHECK(cudaFuncGetAttributes(&fa, k));
        g_dec.smem_block = std::min(g_dec.smem_block, size_t(p.sharedMemPerBlockOptin) - fa.sharedSizeBytes);
    }
    for (auto k : kernels)
        GPU_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(g_dec.smem_block)));
    {
        cudaFuncAttributes fa;
        GPU_CHECK(cudaFuncGetAttributes(&fa, mlp_fused_kernel));
        g_dec.mlp_static = fa.sharedSizeBytes;
        g_dec.mlp_smem_block = size_t(p.sharedMemPerBlockOptin) - fa.sharedSizeBytes;
        GPU_CHECK(cudaFuncSetAttribute(mlp_fused_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       int(g_dec.mlp_smem_block)));
    }
#else
    g_dec.mlp_static = 1024;  // room for the kernel's static arrays (block_sum)
    g_dec.mlp_smem_block = p.sharedMemPerBlock > g_dec.mlp_static ? p.sharedMemPerBlock - g_dec.mlp_static : 0;
#endif
    if (const char* t = std::getenv("LB_GV_TILE")) g_dec.tile = size_t(std::max(1024, std::atoi(t)));
    if (const char* t = std::getenv("LB_GV_PER_SM")) g_dec.max_per_sm = std::max(1, std::atoi(t));
    if (const char* t = std::getenv("LB_GV_PREWAIT")) g_dec.prewait = std::min(GV_STAGES, std::max(0, std::atoi(t)));
    g_dec.ready = true;
}
bool decode_pdl() { return g_dec.pdl; }

bool gemv_fused_ok(int in, int pro, int head_dim) {
    if (in % 8 != 0 || in <= 0) return false;
    // GATED: each thread takes whole 8-element chunks and every pass covers all threads (in % (8 GV_THREADS)
    // == 0; whole warps, in % 256, would be enough for the shuffles), each head's chunks within one warp
    // (head_dim / 8 divides 32)
    if (pro == GV_GATED && (head_dim <= 0 || head_dim % 8 != 0 || 32 % (head_dim / 8) != 0 || in % head_dim != 0 ||
                            in % (8 * GV_THREADS) != 0 || in / head_dim > GV_MAX_HEADS))
        return false;
    // the input vector plus at least GV_STAGES tiles of one row
    return gv_xs_bytes(in) + size_t(GV_STAGES) * in * sizeof(wtype) + 1024 <= g_dec.smem_block;
}

void gemv_fused(const FusedGemv& a, gpuStream_t s) {
    if (!g_dec.ready) lb::fail("internal", "decode_setup not called");
    if (!gemv_fused_ok(a.in, a.pro, a.head_dim)) lb::fail("internal", "gemv_fused: unsupported shape");
    const size_t row_bytes = size_t(a.in) * sizeof(wtype), xs = gv_xs_bytes(a.in);
    // Tiles of about 16 KB (3 stages in flight per block), capped by the block's shared memory.
    size_t tile = std::min<size_t>(g_dec.tile, (g_dec.smem_block - xs - 1024) / GV_STAGES);
    int rb = int(std::max<size_t>(1, tile / row_bytes));
    rb = std::min(rb, a.out);
    const size_t smem = xs + size_t(GV_STAGES) * rb * row_bytes;
    const int ntiles = (a.out + rb - 1) / rb;
    const int per_sm = int(std::max<size_t>(1, std::min<size_t>(g_dec.max_per_sm, g_dec.smem_sm / (smem + 1024))));
    auto go = [&](void (*kernel)(FusedGemv, int, int, int)) {
        int fit = per_sm;  // and as many as registers allow: a grid past one wave would run a second wave
#if defined(LB_CUDA)
        GPU_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, GV_THREADS, smem));
#endif
        const int grid = std::min(ntiles, g_dec.sms * std::max(1, std::min(per_sm, fit)));
        launch_k(kernel, dim3(grid), dim3(GV_THREADS), smem, s, a, rb, ntiles, g_dec.prewait);
    };
    const int mode = a.pro * 4 + a.epi;
    switch (mode) {
        case GV_PLAIN * 4 + GV_STORE: go(gemv_fused_kernel<GV_PLAIN, GV_STORE>); break;
        case GV_PLAIN * 4 + GV_ADD: go(gemv_fused_kernel<GV_PLAIN, GV_ADD>); break;
        case GV_RMSNORM * 4 + GV_STORE: go(gemv_fused_kernel<GV_RMSNORM, GV_STORE>); break;
        case GV_RMSNORM * 4 + GV_CONV: go(gemv_fused_kernel<GV_RMSNORM, GV_CONV>); break;
        case GV_RMSNORM * 4 + GV_ARGMAX: go(gemv_fused_kernel<GV_RMSNORM, GV_ARGMAX>); break;
        case GV_GATED * 4 + GV_ADD: go(gemv_fused_kernel<GV_GATED, GV_ADD>); break;
        case GV_SILU * 4 + GV_ADD: go(gemv_fused_kernel<GV_SILU, GV_ADD>); break;
        default: lb::fail("internal", "gemv_fused: unsupported prologue/epilogue pair");
    }
}

void embed_decode(const int* d_token, const wtype* E, int H, float* x, unsigned long long* key,
                  unsigned long long* acc, int n_acc, gpuStream_t s) {
    embed_decode_kernel<<<1, 256, 0, s>>>(d_token, E, H, x, key, acc, acc ? n_acc : 0);
}

namespace {
// mlp_fused_kernel's dynamic shared memory for rb intermediate rows a block
size_t mlp_smem_bytes(int H, int rb) {
    return size_t(H) * 8 + size_t((rb + 3) / 4) * 16 + 3 * size_t(rb) * H * sizeof(wtype);
}
}  // namespace

bool mlp_fused_ok(int H, int I) {
    return g_dec.ready && H > 0 && I > 0 && H % 8 == 0 && H <= 4 * MF_THREADS * MF_XPER &&
           mlp_smem_bytes(H, 1) <= g_dec.mlp_smem_block;
}

void mlp_fused(const FusedMlp& a, gpuStream_t s) {
    if (!mlp_fused_ok(a.H, a.I) || !a.acc) lb::fail("internal", "mlp_fused: unsupported shape");
    // LB_GPU_MLP_PER_SM: blocks a multiprocessor to aim for (default 1: 978 tok/s against 944 with 2 on an
    // H200, half the atomics; docs/engines.md session 5). The I rows are split over sms * per_sm blocks, as
    // long as per_sm blocks' rows fit in a multiprocessor's shared memory (the runtime keeps 1 KB a block);
    // where they do not (smaller GPUs, larger models), fewer rows a block and more blocks, which then run in
    // waves. H200, 0.8B: 28 rows, 128 blocks of 176 KB, one wave.
    static const int want = std::max(1, std::getenv("LB_GPU_MLP_PER_SM") ? std::atoi(std::getenv("LB_GPU_MLP_PER_SM")) : 1);
    int rb = 0;
    for (int per = want; per >= 1 && rb == 0; --per) {
        const size_t share = g_dec.smem_sm / size_t(per);
        if (share <= 1024 + g_dec.mlp_static) continue;
        const size_t cap = std::min(g_dec.mlp_smem_block, share - 1024 - g_dec.mlp_static);
        int r = (a.I + g_dec.sms * per - 1) / (g_dec.sms * per);
        while (r > 0 && mlp_smem_bytes(a.H, r) > cap) --r;
        rb = r;
    }
    rb = std::max(rb, 1);  // one row a block fits (mlp_fused_ok)
    const int grid = (a.I + rb - 1) / rb;  // then every block's share, I * (b + 1) / grid - I * b / grid, <= rb
    static const int early = [] {  // LB_MLP_EARLY_DOWN: an experiment (mlp_fused_kernel)
        const char* e = std::getenv("LB_MLP_EARLY_DOWN");
        return e ? std::clamp(std::atoi(e), 0, 2) : 0;
    }();
    FusedMlp b = a;
    b.early_down = early;
    launch_k(mlp_fused_kernel, dim3(grid), dim3(MF_THREADS), mlp_smem_bytes(a.H, rb), s, b, rb);
}

void transpose(const wtype* in, int rows, int cols, wtype* out, gpuStream_t s) {
    static_assert(sizeof(wtype) == 2, "transpose16_kernel moves 2-byte elements");
    transpose16_kernel<<<dim3(unsigned((cols + 31) / 32), unsigned((rows + 31) / 32)), dim3(32, 8), 0, s>>>(
        (const unsigned short*)in, rows, cols, (unsigned short*)out);
    GPU_CHECK(gpuGetLastError());
}

bool delta_decode_ok(int dk, int dv) { return (dk == 128 || dk == 64 || dk == 256) && dv % 32 == 0; }

void delta_decode(const float* conv, const float* proj, int b_off, const float* negA, const float* dt_bias, int hk,
                  int hv, int dk, int dv, float* state, float* out, gpuStream_t s) {
    const dim3 grid(hv, dv / 32);
    switch (dk) {
        case 64: launch_k(delta_decode_kernel<2>, grid, dim3(256), 0, s, conv, proj, b_off, negA, dt_bias, hk, hv, dv, state, out); break;
        case 128: launch_k(delta_decode_kernel<4>, grid, dim3(256), 0, s, conv, proj, b_off, negA, dt_bias, hk, hv, dv, state, out); break;
        case 256: launch_k(delta_decode_kernel<8>, grid, dim3(256), 0, s, conv, proj, b_off, negA, dt_bias, hk, hv, dv, state, out); break;
        default: lb::fail("internal", "delta_decode: unsupported key head dim");
    }
}

bool delta_out_ok(int H, int dk, int dv, int hk, int hv) {
    const int R = H / DO_ROWS;
    return dk == DO_D && dv == DO_D && hk > 0 && hv % hk == 0 && H % DO_ROWS == 0 && R >= 1 && R <= 16 &&
           (DO_D / R) % 4 == 0 && DO_D % R == 0;
}

void delta_out(const DeltaOut& a, gpuStream_t s) {
    if (!delta_out_ok(a.H, DO_D, DO_D, a.hk, a.hv)) lb::fail("internal", "delta_out: unsupported shape");
    launch_k(delta_out_kernel, dim3(a.hv, a.H / DO_ROWS), dim3(DO_THREADS), 0, s, a);
}

bool attention_decode_ok(int nh, int nkv, int hd) {
    return nkv > 0 && nh % nkv == 0 && nh / nkv <= AD_GMAX && (hd == 256 || hd == 128);
}
static bool old_attention_decode() {
    static const bool old = env_on("LB_GPU_OLD_ATTN_DEC");
    return old;
}
int attention_decode_blocks(int nkv, int max_ctx) {
    if (old_attention_decode()) return max_ctx <= 2048 ? 8 : max_ctx <= 8192 ? 16 : 32;
    // one wave: the flash kernel's 8-warp blocks fit one to a multiprocessor
    return std::clamp((g_dec.sms + nkv - 1) / nkv, 1, AF_MAX_NB);
}
// acc, then (m, l): the session-1 kernel keeps a partial per warp, the flash kernel one per block
size_t attention_decode_scratch(int nh, int hd, int blocks) { return size_t(nh) * blocks * AD_WARPS * (hd + 2); }

void attention_decode(const float* qkv, int nh, int nkv, int hd, const int* d_pos, const void* kcache, DType kt,
                      const void* vcache, DType vt, int blocks, float* scratch, int* counters, float* out,
                      gpuStream_t s) {
    if (hd != 256 && hd != 128) lb::fail("internal", "attention_decode: unsupported head dim");
    if (old_attention_decode()) {
        const dim3 grid(nkv, blocks), block(AD_WARPS * 32);
        if (hd == 256)
            launch_k(attn_decode_kernel<8>, grid, block, 0, s, qkv, nh, nkv, d_pos, kcache, kt, vcache, vt, scratch, counters, out);
        else
            launch_k(attn_decode_kernel<4>, grid, block, 0, s, qkv, nh, nkv, d_pos, kcache, kt, vcache, vt, scratch, counters, out);
        return;
    }
    const dim3 grid(nkv, std::min(blocks, AF_MAX_NB)), block(AF_WARPS * 32);
    const bool wide = nh / nkv > 4;  // GM = 8 slots hold more registers: two positions in flight, not four
    auto go = [&](auto kernel) {
        launch_k(kernel, grid, block, 0, s, qkv, nh, nkv, d_pos, kcache, kt, vcache, vt, scratch, counters, out);
    };
    auto pick = [&](auto kvf) {  // kvf: std::integral_constant of the KV type fixed at compile time, or -1
        constexpr int F = decltype(kvf)::value;
        if (hd == 256) wide ? go(attn_decode_flash_kernel<8, 8, 2, F>) : go(attn_decode_flash_kernel<8, 4, 4, F>);
        else wide ? go(attn_decode_flash_kernel<4, 8, 2, F>) : go(attn_decode_flash_kernel<4, 4, 4, F>);
    };
    if (kv_bf16_kernels(kt, vt)) pick(std::integral_constant<int, int(DType::BF16)>{});
    else pick(std::integral_constant<int, -1>{});
}

int attn_decode_short_ctx(int nh, int nkv, int hd, int rot, DType kt, DType vt) {
#if defined(LB_CUDA)
    // LB_GPU_ATTN_SHORT=N: the largest context that takes the kernel (0: never); default two batches
    static const int limit = [] {
        const char* e = std::getenv("LB_GPU_ATTN_SHORT");
        return e ? std::max(0, std::atoi(e)) : 2 * AS_WARPS * AS_U;
    }();
    // The kernel decodes the bf16 cache rows with the build's unpack8: bf16 weight builds only (the sm_75
    // build's wtype is half; it keeps the flash path).
#if defined(LB_GPU_FP16)
    constexpr bool bf16_build = false;
#else
    constexpr bool bf16_build = true;
#endif
    const bool fits = bf16_build && hd == AS_HD && nkv > 0 && nh % nkv == 0 && rot % 2 == 0 && rot <= hd &&
                      kv_bf16_kernels(kt, vt) && !old_attention_decode();
    return fits ? limit : 0;
#else
    (void)nh; (void)nkv; (void)hd; (void)rot; (void)kt; (void)vt;
    return 0;  // HIP: not ported (the flash path runs)
#endif
}

void attn_decode_short(const float* qkv, int nh, int nkv, int rot, float theta, const float* q_gain,
                       const float* k_gain, float eps, const int* d_pos, void* kcache, void* vcache, float* out,
                       gpuStream_t s) {
    launch_k(attn_decode_short_kernel, dim3(nh), dim3(AS_WARPS * 32), 0, s, qkv, nh, nkv, rot, theta, q_gain, k_gain,
             eps, d_pos, (unsigned short*)kcache, (unsigned short*)vcache, out);
}

void decode_finish(const unsigned long long* key, int* d_next, int* d_pos, int* host_ring, int ring_mask,
                   gpuStream_t s) {
    launch_k(decode_finish_kernel, dim3(1), dim3(1), 0, s, key, d_next, d_pos, host_ring, ring_mask);
}

}  // namespace lb::gpu
