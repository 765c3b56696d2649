// y (=|+=) x W^T with W in GGUF's block formats (q4_K, q5_K, q6_K, q8_0, q4_0) kept as the file stores
// them, so that a step streams the file's bytes, not a bf16 copy of them; and the embedding lookup from such
// a table. CPU reference: decode_row (../quant.cpp, ggml's dequantisation) then ../cpu/matmul.cpp.
//
// Weights are dequantised in registers exactly as ggml does (fp32: d * scale * q - dmin * min), except on
// qmma_kernel's q4_K route (sc q exact in fp16, d and dmin applied to the sums: see its comment). Kernels:
//  * qmv_kernel<T, N> (q4_K, q6_K; n <= kQuantGemvMax, and up to kQmvMaxRows in passes of 8 where qmma_kernel
//    is not built: the fp16 build, HIP): the decode GEMV, built to stream the weights (see its comment:
//    16-byte loads a step ahead, scales factored out of the dot products; one round of resident blocks whose
//    warps run their groups of rows as one sequence). For one token it also takes the RMSNorm before it and
//    an MLP's SwiGLU after it (matmul_quant_rmsnorm: the decode step's folds).
//  * qmma_kernel<T, NT> (q4_K, q6_K; kQuantGemvMax < n <= kQmmaMaxRows, CUDA): a verify's rows on the tensor
//    cores, weights dequantised in registers and each block read once for all rows; a block's K slice of the
//    activations staged once (q4_K: fp16 scaled per token and super-block; q6_K: bf16), no barrier in the K
//    loop (split-K partials summed in split order).
//  * qgemv_kernel<T, N> (the other types, and q4_K / q6_K matrices qmv_kernel does not take: a q4_K matrix
//    not 16-byte aligned; the fp16 build and HIP above kQmvMaxRows; n <= kQuantGemvMax, or over groups of
//    that many where no tensor-core kernel is built): 8 elements at a time (dq8), one warp per two output
//    rows, fp32 FMA.
//  * qgemm_kernel<T> (n above, below kGemmTcMinRows, or gemm_tc's fallback under graph capture): 64 tokens x
//    64 rows a block; the K loop dequantises a 64 x 64 weight tile to bf16 in shared memory and multiplies on
//    the tensor cores (fp32 accumulation; activations rounded to bf16 as the bf16 GEMM does). Each weight
//    block is read once per 64 tokens, so a verify of up to 64 rows streams the weights once. Split-K
//    (partials summed in split order) when the output tiles do not fill the GPU.
//  * n >= kGemmTcMinRows (prefill): gemm_tc.cu, W dequantised to a bf16 panel then one bf16 GEMM.
//    HIP: GEMV over groups of tokens (no tensor-core path yet).
// The element type WT (the backend's wtype, tagged DType::BF16 or F16) runs through the same kernels, for the
// parts of a matrix the file stores in f32/f16/bf16 next to quantised ones.
#include "common.cuh"
#include "mma.cuh"
#include "quant_blocks.cuh"

// The tensor-core kernels (bf16 mma: sm_80 and later): CUDA builds with bf16 weights. The fp16 build (sm_75)
// and HIP run the GEMV kernels over groups of tokens instead.
#if defined(LB_CUDA) && !defined(LB_GPU_FP16)
#define LB_QUANT_MMA 1
#else
#define LB_QUANT_MMA 0
#endif

namespace lb::gpu {

namespace {

constexpr DType kWT = kWtypeDType;

template <DType T>
__device__ __forceinline__ size_t row_bytes(int in) {
    if constexpr (T == DType::Q4_K) return size_t(in / 256) * 144;
    else if constexpr (T == DType::Q5_K) return size_t(in / 256) * 176;
    else if constexpr (T == DType::Q6_K) return size_t(in / 256) * 210;
    else if constexpr (T == DType::Q8_0) return size_t(in / 32) * 34;
    else if constexpr (T == DType::Q4_0) return size_t(in / 32) * 18;
    else return size_t(in) * sizeof(wtype);
}

constexpr int kRowsPerWarp = 2, kGemvWarps = 4;

// One warp per kRowsPerWarp output rows; lane c takes elements [8c, 8c + 8) of every 256: each warp step reads
// one 256-element run of each row (one k-quant super-block), coalesced. x (fp32, in % 8 == 0) is read as
// float4 and shared by the warp's rows.
template <DType T, int N>
__global__ __launch_bounds__(kGemvWarps * 32) void qgemv_kernel(const float* __restrict__ x, int in,
                                                                const uint8_t* __restrict__ W, int out,
                                                                float* __restrict__ y, int ldy, bool accumulate) {
    const int lane = threadIdx.x % 32;
    const int row0 = (blockIdx.x * kGemvWarps + threadIdx.x / 32) * kRowsPerWarp;
    if (row0 >= out) return;
    const size_t rb = row_bytes<T>(in);
    const uint8_t* rows[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) rows[r] = W + size_t(min(row0 + r, out - 1)) * rb;
    float acc[N][kRowsPerWarp];
#pragma unroll
    for (int t = 0; t < N; ++t)
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) acc[t][r] = 0.f;
    for (int k = lane * 8; k < in; k += 256) {
        float w[kRowsPerWarp][8];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) dq8<T>(rows[r], k, w[r]);
#pragma unroll
        for (int t = 0; t < N; ++t) {
            const float4 a = *(const float4*)(x + size_t(t) * in + k);
            const float4 b = *(const float4*)(x + size_t(t) * in + k + 4);
#pragma unroll
            for (int r = 0; r < kRowsPerWarp; ++r)
                acc[t][r] += w[r][0] * a.x + w[r][1] * a.y + w[r][2] * a.z + w[r][3] * a.w + w[r][4] * b.x +
                             w[r][5] * b.y + w[r][6] * b.z + w[r][7] * b.w;
        }
    }
#pragma unroll
    for (int t = 0; t < N; ++t)
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) {
            const float v = warp_sum(acc[t][r]);
            if (lane == 0 && row0 + r < out) {
                float* dst = y + size_t(t) * ldy + row0 + r;
                *dst = accumulate ? *dst + v : v;
            }
        }
}

// qmv_kernel<T, N, R> (q4_K and q6_K): the decode / verify GEMV built to stream the weights. A GEMV at n = 1
// moves ~0.56 (q4_K) or ~0.82 (q6_K) bytes an element, so at the copy bandwidth the multiprocessors can issue
// only ~4 instructions an element: the kernel is counted in instructions (measured, H200: the largest q4_K
// matrices (0.56 bytes an element) and the q6_K LM head (0.82) both ran at ~2.9e12 elements/s, not at one
// byte rate: issue-bound). Here:
//  * 8 lanes take one super-block (256 elements) of a row, 32 elements each, with one 16-byte load of quants
//    (+ one of the 16-byte header: q4_K) or six 4-byte loads (q6_K, whose 210-byte blocks are only 2-byte
//    aligned); a warp reads 4 consecutive super-blocks of each of its R rows a step, and the next step's
//    bytes are loaded into the other of two register sets before this step's arithmetic (no copies);
//  * the scales come out of the dot product: a lane's run of elements shares one scale (and min), so
//    sum_i (d sc q_i - dmin m) x_i = d sc (sum_i q_i x_i) - dmin m (sum_i x_i); the sum of x is shared by
//    the rows. q4_K: a lane's two 6-bit scales and mins come out of the 12 scale bytes without branches
//    (the lanes of a warp take different sub-blocks);
//  * q4_K quants as subnormal floats: the bits of a 4-bit q are the float q * 2^-149, so a quant costs one
//    byte permute and one FMA a token. The activations are scaled by 2^80 (exact), so each product and
//    partial sum is exactly 2^-69 times the one of the plain q * x (a power-of-two scale commutes with
//    rounding while the values stay normal: magnitudes above 2^-57) and the run's dot is scaled back by 2^69
//    (exact). q6_K's signed quants take 2^23 + q as a float and a subtraction (exact).
// Each row's sums are the same operations in the same order whatever R (so R is a launch choice, not a
// numerics one), written with explicit roundings (__fmul_rn, fmaf, __fadd_rn) so that the compiler cannot
// regroup them. fp32 throughout; the grouping differs from the reference's (a few ulp, within the GEMV's 1e-5).
// n tokens run in passes of up to kQmvTokens, each pass streaming the weights once.
constexpr int kQmvWarps = 4, kQmvTokens = 8;
// q4_K at 1-2 tokens: R = 4 rows a warp from this many output rows up (fewer warps; the activations' loads and
// sums shared by more rows), else 2 (more warps for the 5,120-row outputs, whose time is their latency).
constexpr int kQmvWideRows = 16384;

template <DType T>
struct QmvRaw;  // one super-block's bytes of one lane (loaded a step ahead)

template <>
struct QmvRaw<DType::Q4_K> {
    uint4 q;  // 16 bytes of quants: 16 low nibbles (sub-block 2g), 16 high (2g + 1)
    uint4 h;  // the block's header: fp16 d and dmin; the 12 bytes of 6-bit scales and mins
    __device__ __forceinline__ void load(const uint8_t* b, int t) {
        q = *(const uint4*)(b + 16 + 16 * t);  // t = lane % 8: bytes [16 t, 16 t + 16) of qs
        h = *(const uint4*)b;
    }
};

template <>
struct QmvRaw<DType::Q6_K> {
    uint32_t a0, a1, c0, c1, h0, h1;  // ql[l0, l0 + 8), ql[l0 + 32, l0 + 40), qh[l0, l0 + 8) of one half
    int32_t sc;                       // its 4 int8 scales (runs of 8 at +0, +32, +64, +96), packed
    uint16_t d;
    __device__ __forceinline__ void load(const uint8_t* b, int t) {
        const int half = t >> 2, l0 = 8 * (t & 3);
        const uint8_t* ql = b + 64 * half + l0;
        const uint8_t* qh = b + 128 + 32 * half + l0;
        a0 = ld32_a2(ql); a1 = ld32_a2(ql + 4); c0 = ld32_a2(ql + 32); c1 = ld32_a2(ql + 36);
        h0 = ld32_a2(qh); h1 = ld32_a2(qh + 4);
        const uint8_t* s = b + 192 + 8 * half + (l0 >> 4);
        sc = int32_t(uint32_t(s[0]) | (uint32_t(s[2]) << 8) | (uint32_t(s[4]) << 16) | (uint32_t(s[6]) << 24));
        d = ld16(b + 208);
    }
};

// q4_K's 6-bit scales and mins (ggml's get_scale_min_k4) of the pair of sub-blocks 2g, 2g + 1 (g < 4) from the
// 12 scale bytes in 3 words, both branches computed: the scales in bytes 0 and 1 of *sc2, the mins in those of
// *mn2. j = 2g + e < 4 reads bytes j, j + 4; j >= 4 (g >= 2) bytes j + 4, j - 4, j.
__device__ __forceinline__ void q4k_sm_pair(int g, uint32_t s0, uint32_t s1, uint32_t s2, uint32_t* sc2,
                                            uint32_t* mn2) {
    const int sh = 16 * (g & 1);
    const uint32_t b0 = (s0 >> sh) & 0xFFFFu, b1 = (s1 >> sh) & 0xFFFFu, b2 = (s2 >> sh) & 0xFFFFu;
    const uint32_t lo_sc = b0 & 0x3F3Fu, lo_mn = b1 & 0x3F3Fu;
    const uint32_t hi_sc = (b2 & 0x0F0Fu) | ((b0 & 0xC0C0u) >> 2), hi_mn = ((b2 >> 4) & 0x0F0Fu) | ((b1 & 0xC0C0u) >> 2);
    *sc2 = g < 2 ? lo_sc : hi_sc;
    *mn2 = g < 2 ? lo_mn : hi_mn;
}
// the 4 bytes of w as floats (each < 2^8) minus `off`: exact
__device__ __forceinline__ void unpack4(uint32_t w, float off, float* v) {
    float f[4];
    bytes_f(w, f);
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = f[e] - (8388608.f + off);
}
#if defined(LB_CUDA)
// byte e of w (each < 2^8) as the subnormal float byte * 2^-149 (NVIDIA GPUs run FMAs on subnormals at full
// rate and keep them unless built with -ftz)
__device__ __forceinline__ float sub_f(uint32_t w, int e) { return __uint_as_float(__byte_perm(w, 0u, 0x4440u + e)); }
// 2^80 and 2^-80 * 2^149 (see above)
constexpr float kQmvUp = 0x1p80f, kQmvBack = 0x1p69f;
#else
// HIP: byte e of w as a plain float (2^23 + q, minus 2^23), no scaling: the same sums
__device__ __forceinline__ float sub_f(uint32_t w, int e) { return small_f((w >> (8 * e)) & 0xFFu); }
constexpr float kQmvUp = 1.f, kQmvBack = 1.f;
#endif

// One step of qmv_kernel: super-block blk of each of the R rows (the lane's 32 elements of it), N tokens.
// PRE (q4_K, one token): x is already scaled by kQmvUp and xsum holds the sums of its runs of 16 (unscaled,
// the same operations as below), both computed once in qmv_kernel's prologue instead of every step.
template <DType T, int N, int R, bool PRE = false>
__device__ __forceinline__ void qmv_step(const QmvRaw<T> (&w)[R], const float* __restrict__ x, int in, int blk,
                                         int t, float (&acc)[N][R], const float* __restrict__ xsum = nullptr) {
    static_assert(!PRE || (T == DType::Q4_K && N == 1), "pre-scaled activations: q4_K, one token");
    if constexpr (T == DType::Q4_K) {
        const int g = t >> 1, h = t & 1;
        const int k0 = blk * 256 + 64 * g + 16 * h;  // the low nibbles' run; the high nibbles' at k0 + 32
        float dl[R], ml[R], dh[R], mh[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const float d = h2f(uint16_t(w[r].h.x & 0xFFFF)), dmin = h2f(uint16_t(w[r].h.x >> 16));
            uint32_t sc2, mn2;
            q4k_sm_pair(g, w[r].h.y, w[r].h.z, w[r].h.w, &sc2, &mn2);
            dl[r] = d * small_f(sc2 & 0xFFu);
            ml[r] = dmin * small_f(mn2 & 0xFFu);
            dh[r] = d * small_f(sc2 >> 8);
            mh[r] = dmin * small_f(mn2 >> 8);
        }
#pragma unroll
        for (int i = 0; i < N; ++i) {
            const float* xt = x + size_t(i) * in + k0;
            float4 a[4], b[4];
            float sl = 0.f, sh = 0.f;
            if constexpr (PRE) {
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    a[c] = *(const float4*)(xt + 4 * c);
                    b[c] = *(const float4*)(xt + 32 + 4 * c);
                }
                sl = xsum[k0 >> 4];
                sh = xsum[(k0 >> 4) + 2];
            } else {
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    a[c] = *(const float4*)(xt + 4 * c);
                    b[c] = *(const float4*)(xt + 32 + 4 * c);
                    sl += (a[c].x + a[c].y) + (a[c].z + a[c].w);
                    sh += (b[c].x + b[c].y) + (b[c].z + b[c].w);
                }
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    a[c] = make_float4(a[c].x * kQmvUp, a[c].y * kQmvUp, a[c].z * kQmvUp, a[c].w * kQmvUp);
                    b[c] = make_float4(b[c].x * kQmvUp, b[c].y * kQmvUp, b[c].z * kQmvUp, b[c].w * kQmvUp);
                }
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const uint32_t q[4] = {w[r].q.x, w[r].q.y, w[r].q.z, w[r].q.w};
                float pl = 0.f, ph = 0.f;
#pragma unroll
                for (int c = 0; c < 4; ++c) {  // each run of 4: ((q0 a0 + q1 a1) + q2 a2) + q3 a3, then added
                    const uint32_t lo = q[c] & 0x0F0F0F0Fu, hi = (q[c] >> 4) & 0x0F0F0F0Fu;
                    const float tl = fmaf(sub_f(lo, 3), a[c].w, fmaf(sub_f(lo, 2), a[c].z,
                                          fmaf(sub_f(lo, 0), a[c].x, __fmul_rn(sub_f(lo, 1), a[c].y))));
                    const float th = fmaf(sub_f(hi, 3), b[c].w, fmaf(sub_f(hi, 2), b[c].z,
                                          fmaf(sub_f(hi, 0), b[c].x, __fmul_rn(sub_f(hi, 1), b[c].y))));
                    pl = __fadd_rn(pl, tl);
                    ph = __fadd_rn(ph, th);
                }
                pl = __fmul_rn(pl, kQmvBack);
                ph = __fmul_rn(ph, kQmvBack);
                acc[i][r] = __fadd_rn(acc[i][r], __fadd_rn(fmaf(dl[r], pl, -__fmul_rn(ml[r], sl)),
                                                           fmaf(dh[r], ph, -__fmul_rn(mh[r], sh))));
            }
        }
    } else {  // q6_K: runs of 8 at l0 + {0, 32, 64, 96} of one 128-element half, one scale each
        const int half = t >> 2, l0 = 8 * (t & 3);
        const int k0 = blk * 256 + 128 * half + l0;
        float q[R][4][8], ds[R][4];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const QmvRaw<T>& c = w[r];
            const uint32_t a[2] = {c.a0, c.a1}, cc[2] = {c.c0, c.c1}, hh[2] = {c.h0, c.h1};
#pragma unroll
            for (int i = 0; i < 2; ++i) {  // 6-bit quants: low 4 bits from ql, high 2 from qh; minus 32
                unpack4((a[i] & 0x0F0F0F0Fu) | ((hh[i] << 4) & 0x30303030u), 32.f, &q[r][0][4 * i]);
                unpack4((cc[i] & 0x0F0F0F0Fu) | ((hh[i] << 2) & 0x30303030u), 32.f, &q[r][1][4 * i]);
                unpack4(((a[i] >> 4) & 0x0F0F0F0Fu) | (hh[i] & 0x30303030u), 32.f, &q[r][2][4 * i]);
                unpack4(((cc[i] >> 4) & 0x0F0F0F0Fu) | ((hh[i] >> 2) & 0x30303030u), 32.f, &q[r][3][4 * i]);
            }
            const float d = h2f(c.d);
#pragma unroll
            for (int j = 0; j < 4; ++j) ds[r][j] = d * float(int8_t(uint32_t(c.sc) >> (8 * j)));
        }
#pragma unroll
        for (int i = 0; i < N; ++i) {
            const float* xt = x + size_t(i) * in + k0;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float4 a = *(const float4*)(xt + 32 * j), b = *(const float4*)(xt + 32 * j + 4);
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const float* v = q[r][j];
                    acc[i][r] += ds[r][j] * (v[0] * a.x + v[1] * a.y + v[2] * a.z + v[3] * a.w + v[4] * b.x +
                                             v[5] * b.y + v[6] * b.z + v[7] * b.w);
                }
            }
        }
    }
}

// Asks L2 for the 16-byte-aligned run inside [p, p + bytes) (sm_90 CUDA: cp.async.bulk.prefetch.L2, which
// takes no registers and is not waited for; elsewhere nothing): weights a warp reads a step later, so that
// more of the stream is in flight than the registers' one step ahead, and before the dependency wait.
__device__ __forceinline__ void prefetch_l2(const void* p, size_t bytes) {
#if defined(LB_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const uintptr_t a = (uintptr_t(p) + 15) & ~uintptr_t(15), e = (uintptr_t(p) + bytes) & ~uintptr_t(15);
    if (e > a) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(a), "r"(uint32_t(e - a)));
#else
    (void)p;
    (void)bytes;
#endif
}

// The inverse RMS of the row x[0, dim) exactly as rmsnorm_kernel (norms.cu) computes it with its 256 threads:
// thread v's sum of squares over elements v, v + 256, ... in that order, each warp's sums by warp_sum, the 8
// warp sums added in order, rsqrtf(sum / dim + eps); computed here by a block of kQmvWarps warps, each lane
// taking the 256-thread kernel's threads of its lane in the warps w, w + kQmvWarps, ... (the same values in
// the same operations), so that the fused GEMV's normalised x is bitwise the one rmsnorm_kernel writes.
// Elements are loaded 8 a reference thread at a time before their sums (zeros past dim add nothing), so
// that a row costs a few memory round trips, not one an element.
constexpr int kNormRef = 256;  // norms.cu's kNormThreads
static_assert(kNormRef % (kQmvWarps * 32) == 0, "the 256-thread partition over the block's warps");
__device__ float qmv_rms_inv(const float* __restrict__ x, int dim, float eps) {
    constexpr int M = kNormRef / (kQmvWarps * 32), U = 8;
    __shared__ float part[kNormRef / 32];
    __shared__ float total;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    float ss[M];
#pragma unroll
    for (int m = 0; m < M; ++m) ss[m] = 0.f;
    for (int k0 = 0; k0 < dim; k0 += kNormRef * U) {
        float v[M][U];
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int i = k0 + kNormRef * u + 32 * (warp + kQmvWarps * m) + lane;  // reference thread's
                v[m][u] = i < dim ? x[i] : 0.f;
            }
#pragma unroll
        for (int m = 0; m < M; ++m)
#pragma unroll
            for (int u = 0; u < U; ++u) ss[m] += v[m][u] * v[m][u];
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
        const float w = warp_sum(ss[m]);
        if (lane == 0) part[warp + kQmvWarps * m] = w;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0;
        for (int i = 0; i < kNormRef / 32; ++i) t += part[i];
        total = t;
    }
    __syncthreads();
    return rsqrtf(total / dim + eps);
}

// What qmv_kernel does around its products: kQmvPlain, y (=|+=) x W^T; kQmvNorm (n = 1): x is first replaced,
// in shared memory (in floats), by rmsnorm(x) * gain as rmsnorm_kernel computes it (qmv_rms_inv), the decode
// step's RMSNorm folded into the GEMV after it; kQmvSwiglu: that, and W's rows are an MLP's gate [0, out / 2)
// and up [out / 2, out): a group takes R / 2 rows of each and writes y[i] = silu(gate_i) * up_i as
// silu_mul_kernel computes it (mlp.cu), y of out / 2 floats; the MLP's silu_mul folded in too.
constexpr int kQmvPlain = 0, kQmvNorm = 1, kQmvSwiglu = 2;

// Grid: at most one round of resident blocks (launch_qmv); warp w of W takes the groups of R output rows
// w, w + W, ... and runs their steps (4 super-blocks of each row) as one sequence, the next step's bytes
// loaded before this step's arithmetic across the groups' seams too, so that a warp's loads stay in flight
// from its first step to its last (a block a group of rows drained the pipeline at each block's end, and a
// 5,120-column row is only 5 steps) and no block waits to be scheduled. Each row's sums are the same
// operations in the same order as with one warp a group. MODE: kQmvPlain, kQmvNorm or kQmvSwiglu (above).
template <DType T, int N, int R, int MODE>
__global__ __launch_bounds__(kQmvWarps * 32) void qmv_kernel(const float* __restrict__ x, int in,
                                                              const uint8_t* __restrict__ W, int out,
                                                              float* __restrict__ y, int ldy, bool accumulate,
                                                              const float* __restrict__ gain, float eps) {
    constexpr int BB = T == DType::Q4_K ? 144 : 210, H2 = R / 2;
    constexpr bool kSwiglu = MODE == kQmvSwiglu;
    // q4_K with a shared x: x scaled by kQmvUp and its runs' sums after it (qmv_smem), made once a block
    constexpr bool kPre = MODE != kQmvPlain && T == DType::Q4_K;
    static_assert(!kSwiglu || (N == 1 && R % 2 == 0), "SwiGLU: one token, gate and up rows in pairs");
    extern __shared__ float qmv_xs[];  // kQmvNorm, kQmvSwiglu: the normalised x (qmv_smem)
    const int lane = threadIdx.x % 32, t = lane % 8, sub = lane / 8;
    const int nblk = in / 256, steps = (nblk + 3) / 4, half = out / 2;
    const int groups = kSwiglu ? half / H2 : (out + R - 1) / R;  // kSwiglu: half % H2 == 0 (launch_qmv)
    const int stride = gridDim.x * kQmvWarps;
    const size_t rb = size_t(nblk) * BB;
    // row r of group g
    auto row_of = [&](int g, int r) { return kSwiglu ? (r < H2 ? g * H2 + r : half + g * H2 + r - H2) : g * R + r; };
    float acc[N][R];
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[i][r] = 0.f;
    auto next = [&](int& g, int& s) {
        if (++s >= steps) {
            s = 0;
            g += stride;
        }
    };
    // step s of group g into w (nothing past the last group; a lane past the row's super-blocks loads nothing),
    // and the step after it asked of L2 (lane r: row r's 4 super-blocks), two steps ahead of the arithmetic
    auto load = [&](QmvRaw<T>(&w)[R], int g, int s) {
        const int blk = 4 * s + sub;
        if (g < groups && blk < nblk)
#pragma unroll
            for (int r = 0; r < R; ++r) w[r].load(W + size_t(min(row_of(g, r), out - 1)) * rb + size_t(blk) * BB, t);
        next(g, s);
        const int row = row_of(g, lane);
        if (lane < R && g < groups && row < out)
            prefetch_l2(W + size_t(row) * rb + size_t(4 * s) * BB, size_t(min(4, nblk - 4 * s)) * BB);
    };
    // the step's arithmetic; after a group's last step its R sums (warp_sum) are written and reset
    auto run = [&](const QmvRaw<T>(&w)[R], int g, int s, const float* xv) {
        const int blk = 4 * s + sub;
        if (blk < nblk) qmv_step<T, N, R, kPre>(w, xv, in, blk, t, acc, xv + in);
        if (s != steps - 1) return;
        if constexpr (kSwiglu) {
            float v[R];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                v[r] = warp_sum(acc[0][r]);
                acc[0][r] = 0.f;
            }
            if (lane == 0)
#pragma unroll
                for (int r = 0; r < H2; ++r) y[g * H2 + r] = silu(v[r]) * v[r + H2];
        } else {
#pragma unroll
            for (int i = 0; i < N; ++i)
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    const float v = warp_sum(acc[i][r]);
                    acc[i][r] = 0.f;
                    const int row = g * R + r;
                    if (lane == 0 && row < out) {
                        float* dst = y + size_t(i) * ldy + row;
                        *dst = accumulate ? *dst + v : v;
                    }
                }
        }
    };
    QmvRaw<T> wa[R], wb[R];  // the steps in turn
    int g = blockIdx.x * kQmvWarps + threadIdx.x / 32, s = 0;
    load(wa, g, s);
    constexpr int kT = kQmvWarps * 32;
    // the norm's gain (a weight) into shared memory before the wait too; thread j later reads its own elements
    if constexpr (MODE != kQmvPlain)
        for (int i = threadIdx.x; i < in; i += kT) qmv_xs[i] = gain[i];
    // launched with programmatic dependent launch (launch_k): the first weight bytes are requested while the
    // kernel before still runs; x and y (its outputs) are read only after the wait
    griddep_launch();
    griddep_wait();
    const float* xv = x;
    if constexpr (MODE != kQmvPlain) {
        const float inv = qmv_rms_inv(x, in, eps);
        for (int i0 = threadIdx.x; i0 < in; i0 += 8 * kT) {  // 8 loads, then 8 stores
            float a[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) a[u] = i0 + kT * u < in ? x[i0 + kT * u] : 0.f;
#pragma unroll
            for (int u = 0; u < 8; ++u)
                if (i0 + kT * u < in) qmv_xs[i0 + kT * u] = a[u] * inv * qmv_xs[i0 + kT * u];
        }
        __syncthreads();
        if constexpr (kPre) {  // a thread a run of 16: its sum as qmv_step takes it, then the run scaled
            for (int j = threadIdx.x; j < in / 16; j += kT) {
                float4 v[4];
                float sum = 0.f;
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    v[c] = *(const float4*)(qmv_xs + 16 * j + 4 * c);
                    sum += (v[c].x + v[c].y) + (v[c].z + v[c].w);
                }
                qmv_xs[in + j] = sum;
#pragma unroll
                for (int c = 0; c < 4; ++c)
                    *(float4*)(qmv_xs + 16 * j + 4 * c) =
                        make_float4(v[c].x * kQmvUp, v[c].y * kQmvUp, v[c].z * kQmvUp, v[c].w * kQmvUp);
            }
            __syncthreads();
        }
        xv = qmv_xs;
    }
    while (g < groups) {
        int g1 = g, s1 = s;
        next(g1, s1);
        load(wb, g1, s1);
        run(wa, g, s, xv);
        if (g1 >= groups) break;
        int g2 = g1, s2 = s1;
        next(g2, s2);
        load(wa, g2, s2);
        run(wb, g1, s1, xv);
        g = g2;
        s = s2;
    }
}

// Blocks of a qmv_kernel launch: the fewest that give every warp the same number of groups (k rounds, the
// last warps one fewer) within the resident blocks (its registers; a shared x: smem bytes). All warps then
// end together; with the most resident blocks instead, 8,704 groups over 2,112 warps (the 27B's gate_up
// fold) would leave 12% of the warps a fifth round alone, streaming at a fraction of the bandwidth.
template <DType T, int N, int R, int MODE>
int qmv_grid(int groups, size_t smem) {
#if defined(LB_CUDA)
    static const int per_sm = [] {
        int b = 0;
        GPU_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, qmv_kernel<T, N, R, MODE>, kQmvWarps * 32, 0));
        return std::max(b, 1);
    }();
    int fit = per_sm;
    if (smem > 0) fit = std::max(1, std::min(fit, int(context().dec.smem_sm / (smem + 1024))));
    const long warps = long(fit) * context().sms * kQmvWarps;
    const long k = std::max(1L, (groups + warps - 1) / warps);  // rounds of groups a warp
    return int(std::max(1L, (groups + kQmvWarps * k - 1) / (kQmvWarps * k)));
#else
    const int want = (groups + kQmvWarps - 1) / kQmvWarps;
    (void)smem;
    return want;  // HIP: one group a warp, as many blocks as that takes
#endif
}

// qmv_kernel's dynamic shared memory: none for kQmvPlain; else the normalised x (in floats), for q4_K scaled
// by kQmvUp and followed by the sums of its runs of 16 (in / 16 floats)
template <DType T, int MODE>
constexpr size_t qmv_smem(int in) {
    return MODE == kQmvPlain ? 0 : sizeof(float) * (size_t(in) + (T == DType::Q4_K ? size_t(in) / 16 : 0));
}

template <DType T, int N, int R, int MODE>
void launch_qmv_nr(const float* x, int in, const uint8_t* W, int out, float* y, int ldy, bool accumulate,
                   gpuStream_t s, const float* gain, float eps) {
    const size_t smem = qmv_smem<T, MODE>(in);
    const int groups = MODE == kQmvSwiglu ? out / R : (out + R - 1) / R;
    const int blocks = qmv_grid<T, N, R, MODE>(groups, smem);
    launch_k(qmv_kernel<T, N, R, MODE>, dim3(blocks), dim3(kQmvWarps * 32), smem, s, x, in, W, out, y, ldy,
             accumulate, gain, eps);
}

// rows: the rows a warp, 0: by the matrix (4 for q4_K at 1-2 tokens and >= kQmvWideRows rows, else 2); 2 or 4:
// that (the op check's timing compares them; 4 applies to q4_K at 1-2 tokens only). gain != nullptr: n = 1,
// x normalised first (kQmvNorm; qmv_smem bytes of shared memory, at most kQmvNormMaxIn elements); swiglu: and
// the SwiGLU of the two halves of the rows written (kQmvSwiglu; out % 4 == 0).
constexpr int kQmvNormMaxIn = 11264;  // qmv_smem <= 46.75 KB (and the norm's 36 static bytes): no opt-in
template <DType T>
void launch_qmv(const float* x, int n, int in, const uint8_t* W, int out, float* y, int ldy, bool accumulate,
                gpuStream_t s, int rows, const float* gain = nullptr, float eps = 0.f, bool swiglu = false) {
    // R = 4: q4_K at up to 2 tokens (more would spill registers; q6_K's 32 unpacked floats a row would too)
    const bool r4 = T == DType::Q4_K && n <= 2 && (rows == 4 || (rows == 0 && out >= kQmvWideRows));
    constexpr int R4 = T == DType::Q4_K ? 4 : 2;
    if (gain && swiglu) {
        if (r4) return launch_qmv_nr<T, 1, R4, kQmvSwiglu>(x, in, W, out, y, ldy, false, s, gain, eps);
        return launch_qmv_nr<T, 1, 2, kQmvSwiglu>(x, in, W, out, y, ldy, false, s, gain, eps);
    }
    if (gain) {
        if (r4) return launch_qmv_nr<T, 1, R4, kQmvNorm>(x, in, W, out, y, ldy, accumulate, s, gain, eps);
        return launch_qmv_nr<T, 1, 2, kQmvNorm>(x, in, W, out, y, ldy, accumulate, s, gain, eps);
    }
    if constexpr (T == DType::Q4_K) {
        if (r4) {
            if (n == 1) return launch_qmv_nr<T, 1, 4, kQmvPlain>(x, in, W, out, y, ldy, accumulate, s, nullptr, 0.f);
            return launch_qmv_nr<T, 2, 4, kQmvPlain>(x, in, W, out, y, ldy, accumulate, s, nullptr, 0.f);
        }
    }
    for (int t0 = 0; t0 < n; t0 += kQmvTokens) {
        const int m = std::min(kQmvTokens, n - t0);
        const float* xt = x + size_t(t0) * in;
        float* yt = y + size_t(t0) * ldy;
        switch (m) {
#define LB_QMV_CASE(M) \
    case M: launch_qmv_nr<T, M, 2, kQmvPlain>(xt, in, W, out, yt, ldy, accumulate, s, nullptr, 0.f); break;
            LB_QMV_CASE(1) LB_QMV_CASE(2) LB_QMV_CASE(3) LB_QMV_CASE(4)
            LB_QMV_CASE(5) LB_QMV_CASE(6) LB_QMV_CASE(7)
            default: launch_qmv_nr<T, 8, 2, kQmvPlain>(xt, in, W, out, yt, ldy, accumulate, s, nullptr, 0.f); break;
#undef LB_QMV_CASE
        }
    }
}

#if LB_QUANT_MMA
// qmma_kernel<T, NT> (q4_K and q6_K, 5..72 rows: a verify's, DDTree budget 64 included): the tensor cores on weights
// dequantised in registers, each block read once for all rows. A warp computes 16 output rows at a time and
// runs mma.m16n8k16 (fp32 accumulate) over NT tiles of 8 tokens. The K order inside an mma is free (a dot
// product), so each lane's A fragment (rows g, g + 8; k 2q, 2q + 1, 2q + 8, 2q + 9 of 16) takes elements of a
// 64-element run that lane owns in every super-block, exactly the bytes it loads:
//   q4_K: lane q owns elements [64q, 64q + 64): its 32 quant bytes (two 16-byte loads), sub-block 2q in the low
//   nibbles, 2q + 1 in the high ones;
//   q6_K: lane q owns elements 128h + l + 32j (h = q / 2, l in [16 (q % 2), + 16), j < 4).
// Two numerical contracts (fp32 sums in both):
//   q4_K, exact quants in fp16: the A operand is sc q (6-bit scale times 4-bit quant, <= 945: exact in fp16),
//   the B operand the activations of each (token, super-block) scaled by 2^e (max |x| 2^e in [2^9, 2^10): no
//   overflow, ~11 bits each) rounded to fp16; a super-block's products go to fresh accumulators, folded into
//   the group's sums as acc += 2^-e (d acc_sb - dmin sum_j m_j xs_j), xs_j the sub-block sums of the staged
//   activations (fp32 at staging, into the mma as fp16 hi + lo: one more mma a tile). The weights enter exact
//   (ggml's fp32 d sc q - dmin m is rounded, this is not), the activations with fp16's 2^-11.
//   q6_K (int8 scales: sc q up to 4,096, not exact in fp16): weights dequantised in fp32 as ggml does, then
//   rounded to bf16 (as qgemm_kernel and gemm_tc), activations rounded to bf16.
//
// The verify's product must stream the weights at the copy bandwidth, so nothing in the K loop waits for the
// block: a block (grid (row blocks, K splits)) stages its split's activations, all NT tiles of tokens over the
// split's super-blocks, in shared memory ONCE (one barrier), then each warp runs its row groups (16
// rows: groups w, w + W, ... for warp w of W in the split, numbered across the blocks first so that a last,
// partial round spreads over the multiprocessors) over those super-blocks as one sequence of steps
// (a step: one super-block of the group's 16 rows, 2.3 KB of q4_K), the next step's weights loaded into
// registers before this step's arithmetic, across group seams, and step s + kQmmaAhead asked of L2. The
// staged activations are permuted within each super-block so that the two chunks a lane takes together are
// one 16-byte shared-memory read and a quarter-warp's reads (2 tokens x 4 lanes) fall in distinct banks.
// A split's slice of activations for all tiles must fit the shared memory, so the host splits
// K (partials summed in split order by qsplit_sum_kernel: fixed order, identical run to run); where the
// partials' scratch is refused (graph capture) one split restages its slice chunk by chunk for each round of
// row groups (a barrier pair a chunk). A group's sums are the same operations in the same order whichever
// warp or block takes it, except a last round's groups split over several warps (below, at up to 3 tiles): the
// split count and, for those groups, the grid are part of the numerics (both fixed for a device and a shape:
// identical run to run).
// One block of 16 warps a multiprocessor (128 registers a thread: the whole register file), so that all of its
// warps share one staged slice, as long a slice as the shared memory holds.
constexpr int kQmmaWarps = 16;
constexpr int kQmmaAhead = 3;  // steps asked of L2 ahead of the one in registers (~7-10 KB a warp)
constexpr int kQmmaSmemBudget = 224 * 1024;  // shared memory of a block at most (sm_90: 227 KB)
// Staged activations: token rows of `chunk` super-blocks of 256 16-bit values plus 32 (16 words: a row stride of
// 16 banks mod 32, so tokens g and g + 1 of a quarter-warp's reads take the two halves of the banks). q4_K adds
// for each (super-block, token) its 8 sub-block sums as fp16 hi, lo (32 bytes: lane q reads hi_2q, hi_2q+1,
// lo_2q, lo_2q+1 at byte 8q) and 2^-e (4 bytes), after the activations.
__host__ __device__ constexpr int qmma_row_elems(int chunk) { return chunk * 256 + 32; }
constexpr int kQmmaSideBytes = 36;
template <DType T>
inline size_t qmma_smem_bytes(int nt, int chunk) {
    const size_t side = T == DType::Q4_K ? size_t(chunk) * kQmmaSideBytes : 0;
    return size_t(8 * nt) * (size_t(qmma_row_elems(chunk)) * 2 + side);
}

// q6_K's staged order within a super-block, in units of 4 elements: lane q's chunks c, c + 1 (c even) sit at
// 4-unit 8 (c / 2) + 2 q, + 1, one 16-byte read. qmma_k4 gives the x elements 4 k4 .. 4 k4 + 3 staged at unit p4:
// the chunk c = 2 (p4 / 8) + p4 % 2 of lane q = (p4 / 2) % 4, which holds elements 128h + 16l + 32j + 4m + e with
// q = 2h + l, c = 4j + m (qmma_chunk6's order).
__device__ __forceinline__ int qmma_k4(int p4) {
    const int c = 2 * (p4 >> 3) + (p4 & 1), q = (p4 >> 1) & 3;
    return 32 * (q >> 1) + 8 * (c >> 2) + 4 * (q & 1) + (c & 3);
}
// q4_K's: word w (w < 8) of lane q's 32 quant bytes holds elements 64q + 4w + i (low nibbles, chunk w) and
// 64q + 32 + 4w + i (high, chunk w + 8); both chunks are one 16-byte read at 4-unit 8w + 2q, + 1, each unit
// stored as the fp16 pairs (x0, x2), (x1, x3): the nibbles of bytes 0 and 2 of a word make one fp16 pair
// (qmma_q4_pair), those of bytes 1 and 3 the other. Element unit k4 (elements 4 k4 .. + 3) is staged at:
__host__ __device__ constexpr int qmma_q4_p4(int k4) {
    return 8 * (k4 & 7) + 2 * (k4 >> 4) + ((k4 >> 3) & 1);
}

template <DType T>
struct QmmaRaw;

template <>
struct QmmaRaw<DType::Q4_K> {
    uint4 lo, hi;  // quant bytes [32q, 32q + 32) of qs
    uint32_t dm, s0, s1, s2;
    __device__ __forceinline__ void load(const uint8_t* b, int q) {
        lo = *(const uint4*)(b + 16 + 32 * q);
        hi = *(const uint4*)(b + 32 + 32 * q);
        const uint4 h = *(const uint4*)b;  // fp16 d, dmin; the 12 scale bytes
        dm = h.x;
        s0 = h.y;
        s1 = h.z;
        s2 = h.w;
    }
    __device__ __forceinline__ uint32_t word(int w) const {
        const uint32_t src[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
        return src[w];
    }
};

template <>
struct QmmaRaw<DType::Q6_K> {
    uint32_t A[4], C[4], H[4];  // ql[l0, l0 + 16), ql[l0 + 32, l0 + 48), qh[l0, l0 + 16) of half h
    int32_t sc;                 // the 4 scales of runs j = 0..3, packed
    uint16_t d;
    __device__ __forceinline__ void load(const uint8_t* b, int q) {
        const int h = q >> 1, l0 = 16 * (q & 1);
        const uint8_t* ql = b + 64 * h + l0;
        const uint8_t* qh = b + 128 + 32 * h + l0;
#pragma unroll
        for (int m = 0; m < 4; ++m) {
            A[m] = ld32_a2(ql + 4 * m);
            C[m] = ld32_a2(ql + 32 + 4 * m);
            H[m] = ld32_a2(qh + 4 * m);
        }
        const uint8_t* s = b + 192 + 8 * h + (l0 >> 4);
        sc = int32_t(uint32_t(s[0]) | (uint32_t(s[2]) << 8) | (uint32_t(s[4]) << 16) | (uint32_t(s[6]) << 24));
        d = ld16(b + 208);
    }
};

// q6_K: the 4 weights of chunk c (elements P(4c) .. P(4c + 3) of the lane's run) as two bf16 pairs, dequantised
// in fp32 as ggml does (sc: d times the run's int8 scale, qmma_scales6).
__device__ __forceinline__ void qmma_chunk6(const QmmaRaw<DType::Q6_K>& w, int c, const float sc[4], uint32_t* p01,
                                            uint32_t* p23) {
    float v[4];
    const int j = c >> 2, m = c & 3;
    uint32_t word;
    if (j == 0) word = (w.A[m] & 0x0F0F0F0Fu) | ((w.H[m] << 4) & 0x30303030u);
    else if (j == 1) word = (w.C[m] & 0x0F0F0F0Fu) | ((w.H[m] << 2) & 0x30303030u);
    else if (j == 2) word = ((w.A[m] >> 4) & 0x0F0F0F0Fu) | (w.H[m] & 0x30303030u);
    else word = ((w.C[m] >> 4) & 0x0F0F0F0Fu) | ((w.H[m] >> 2) & 0x30303030u);
    unpack4(word, 32.f, v);
#pragma unroll
    for (int e = 0; e < 4; ++e) v[e] = sc[j] * v[e];
    __nv_bfloat162 a = __floats2bfloat162_rn(v[0], v[1]), b = __floats2bfloat162_rn(v[2], v[3]);
    *p01 = *(uint32_t*)&a;
    *p23 = *(uint32_t*)&b;
}

__device__ __forceinline__ void qmma_scales6(const QmmaRaw<DType::Q6_K>& w, float sc[4]) {
    const float d = h2f(w.d);
#pragma unroll
    for (int j = 0; j < 4; ++j) sc[j] = d * float(int8_t(uint32_t(w.sc) >> (8 * j)));
}

// fp16 pairs in 32-bit registers (PTX f16x2: the low half first)
__device__ __forceinline__ uint32_t hfma2_u(uint32_t a, uint32_t b, uint32_t c) {
    uint32_t d;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
__device__ __forceinline__ uint32_t hmul2_u(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
__device__ __forceinline__ uint32_t hsub2_u(uint32_t a, uint32_t b) {
    uint32_t d;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}

// A q4_K row's step constants for the lane's sub-blocks 2q (low nibbles) and 2q + 1 (high): the fp16 pairs
// (sc_2q, sc_2q+1 2^-4) and (-1024 sc_2q, -64 sc_2q+1) that turn magic-number nibbles into sc q (qmma_q4_pair
// takes one half of each, broadcast: an operand swizzle of HFMA2, no instruction), the mins (m_2q, m_2q+1) as
// an fp16 pair (the min mma's A operand), and the fp16 d, dmin (converted where used: fewer registers). All
// exact: 6-bit integers times 2^-4, -2^6, -2^10 (<= 64,512 < 65,504).
struct QmmaQ4 {
    uint32_t mul, add, m, dm;
};
__device__ __forceinline__ QmmaQ4 qmma_q4_scales(const QmmaRaw<DType::Q4_K>& w, int q) {
    uint32_t sc2, mn2;  // the 6-bit scales and mins of sub-blocks 2q, 2q + 1 (no branch on the lane's q)
    q4k_sm_pair(q, w.s0, w.s1, w.s2, &sc2, &mn2);
    QmmaQ4 r;
    r.dm = w.dm;
    // a byte b < 2^10 in the mantissa of 0x6400 (1024) is the fp16 1024 + b; 1024 comes off exactly
    const uint32_t k1024 = 0x64006400u;
    const uint32_t sc = hsub2_u(__byte_perm(sc2, 0x64u, 0x4140u), k1024);  // (sc_2q, sc_2q+1)
    r.mul = hmul2_u(sc, 0x2C003C00u);                                     // (sc_2q, sc_2q+1 2^-4)
    r.add = hmul2_u(sc, 0xD400E400u);                                     // (-1024 sc_2q, -64 sc_2q+1)
    r.m = hsub2_u(__byte_perm(mn2, 0x64u, 0x4140u), k1024);               // (m_2q, m_2q+1)
    return r;
}
__device__ __forceinline__ float qmma_d(uint32_t dm) { return h2f(uint16_t(dm & 0xFFFF)); }
__device__ __forceinline__ float qmma_dmin(uint32_t dm) { return h2f(uint16_t(dm >> 16)); }
// half H of an fp16 pair in both halves
template <int H>
__device__ __forceinline__ uint32_t hbcast(uint32_t v) {
    const __half2 h = *(const __half2*)&v, r = H ? __high2half2(h) : __low2half2(h);
    return *(const uint32_t*)&r;
}
// Quant word w's nibble pairs as A operands, sc q exact: bits 0 and 16 (mask 0x000F000F, scale lo) or 4 and 20
// (0x00F000F0, hi: 1024 + 16 q) OR 0x64006400 are the fp16 pair 1024 + 2^p q; one fma with sc 2^-p and
// -1024 sc 2^-p gives sc q (the exact product and sum, < 2^16, are rounded once, to themselves).
// `magic` holds 0x64006400 in a register (qmma_magic): with both constants immediate the mask-and-or is two
// LOP3s (one immediate an instruction), with one in a register one.
template <uint32_t kMask>
__device__ __forceinline__ uint32_t qmma_q4_pair(uint32_t w, uint32_t magic, uint32_t mul, uint32_t add) {
    uint32_t v;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(v) : "r"(w), "n"(kMask), "r"(magic));  // (w & mask) | magic
    return hfma2_u(v, mul, add);
}
// 0x64006400, opaque to the compiler's constant folding
__device__ __forceinline__ uint32_t qmma_magic() {
    uint32_t m;
    asm volatile("mov.b32 %0, 0x64006400;" : "=r"(m));
    return m;
}

// Grid (row blocks, K splits of `per` super-blocks); kQmmaWarps warps; `iters` row groups a warp (the same for every
// warp: the barriers of a chunked split are uniform). n <= 8 NT tokens (the rest of the last tile is zeros);
// qmma_smem_bytes<T>(NT, chunk) of dynamic shared memory. part: the split partials [split][n][out], or null (one
// split: y written directly).
template <DType T, int NT>
__global__ __launch_bounds__(kQmmaWarps * 32, 1) void qmma_kernel(const float* __restrict__ x, int n, int in,
                                                                const uint8_t* __restrict__ W, int out,
                                                                float* __restrict__ y, int ldy, bool accumulate,
                                                                int per, int chunk, int iters,
                                                                float* __restrict__ part) {
    constexpr bool kQ4 = T == DType::Q4_K;
    constexpr int BB = kQ4 ? 144 : 210, NTOK = 8 * NT;
    // the last round's split over warps (below) at up to 3 tiles: above, its registers would spill (ptxas -v)
    constexpr bool kTail = NT <= 3;
    extern __shared__ __align__(16) unsigned char qmma_smem[];
    uint16_t* xs = (uint16_t*)qmma_smem;  // [NTOK][qmma_row_elems(chunk)] fp16 (q4_K) or bf16 (q6_K)
    const int rs = qmma_row_elems(chunk);
    // q4_K: the sub-block sums [chunk][NTOK][4 lanes] (uint2: 4 fp16) and 2^-e [chunk][NTOK] after xs
    uint2* xsum = (uint2*)(qmma_smem + size_t(NTOK) * rs * 2);
    float* xinv = (float*)(xsum + size_t(chunk) * NTOK * 4);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane >> 2, q = lane & 3;
    const int nblk = in / 256, sb_lo = blockIdx.y * per, nsb = min(nblk, sb_lo + per) - sb_lo;
    const size_t rb = size_t(nblk) * BB;
    // warp w of block b is the split's warp w gx + b: a round's last groups fall on every block, not on a few
    const int groups = (out + 15) / 16, wid = warp * gridDim.x + blockIdx.x, wstride = gridDim.x * kQmmaWarps;
    const bool chunked = nsb > chunk;  // the split's slice does not fit: restaged for each round of groups

    // super-block sb_lo + j of rows g and g + 8 of group grp
    auto load = [&](QmmaRaw<T>& a, QmmaRaw<T>& b, int grp, int j) {
        const int row = 16 * grp + g;
        const size_t off = size_t(sb_lo + j) * BB;
        a.load(W + size_t(min(row, out - 1)) * rb + off, q);
        b.load(W + size_t(min(row + 8, out - 1)) * rb + off, q);
    };
    // the same block of the group's 16 rows asked of L2 (lane r < 16: row r), widened to whole 16-byte runs
    // (a q6_K block is 2-byte aligned; a run that holds a byte of the matrix lies in its mapped pages)
    auto prefetch = [&](int grp, int j) {
        const int row = 16 * grp + lane;
        if (lane >= 16 || grp >= groups || row >= out) return;
        const uintptr_t p = uintptr_t(W + size_t(row) * rb + size_t(sb_lo + j) * BB);
        const uintptr_t a = p & ~uintptr_t(15);
        prefetch_l2((const void*)a, size_t(((p + BB + 15) & ~uintptr_t(15)) - a));
    };
    // q6_K: super-blocks [sb_lo + j0, + cnt) of the n tokens -> xs as bf16 in qmma_k4's order (tokens >= n: zeros);
    // consecutive threads write consecutive 8 bytes (no bank conflicts) and read 16 bytes each of one 1 KB row;
    // U (a std::integral_constant) float4s a thread loaded before any is stored, U round trips of L2 in flight;
    // U = 0: a loop unrolled by 4 (fewer registers: the chunked split restages inside the K loop)
    auto stage6 = [&](int j0, int cnt, auto u) {
        constexpr int U = decltype(u)::value, kT = kQmmaWarps * 32;
        const int per_tok = cnt * 64, total = NTOK * per_tok;  // float4s a token, in all
        if constexpr (U == 0) {
#pragma unroll 4
            for (int i = threadIdx.x; i < total; i += kT) {
                const int t = i / per_tok, r = i - t * per_tok, sbl = r >> 6, p4 = r & 63;
                const float4 v = t < n ? *(const float4*)(x + size_t(t) * in + size_t(sb_lo + j0 + sbl) * 256 +
                                                          4 * qmma_k4(p4))
                                       : make_float4(0.f, 0.f, 0.f, 0.f);
                __nv_bfloat162 p[2] = {__floats2bfloat162_rn(v.x, v.y), __floats2bfloat162_rn(v.z, v.w)};
                *(uint2*)&xs[size_t(t) * rs + 256 * sbl + 4 * p4] = *(const uint2*)p;
            }
        } else {
            for (int i0 = threadIdx.x; i0 < total; i0 += U * kT) {
                float4 v[U];
#pragma unroll
                for (int k = 0; k < U; ++k) {
                    const int i = i0 + k * kT, t = i / per_tok, r = i - t * per_tok;
                    const size_t at = size_t(t) * in + size_t(sb_lo + j0 + (r >> 6)) * 256 + 4 * qmma_k4(r & 63);
                    v[k] = i < total && t < n ? *(const float4*)(x + at) : make_float4(0.f, 0.f, 0.f, 0.f);
                }
#pragma unroll
                for (int k = 0; k < U; ++k) {
                    const int i = i0 + k * kT, t = i / per_tok, r = i - t * per_tok;
                    __nv_bfloat162 p[2] = {__floats2bfloat162_rn(v[k].x, v[k].y),
                                           __floats2bfloat162_rn(v[k].z, v[k].w)};
                    if (i < total) *(uint2*)&xs[size_t(t) * rs + 256 * (r >> 6) + 4 * (r & 63)] = *(const uint2*)p;
                }
            }
        }
    };
    // q4_K: the same super-blocks -> xs as fp16 in qmma_q4_p4's order, with xsum and xinv. 16 consecutive
    // threads take one (token, super-block), 16 elements each (4 float4s), its max |x| in 4 shuffles, e from
    // its exponent, each value times 2^e rounded to fp16 (exact scaling: a power of two) and summed in fp32
    // by sub-block (a thread's 16 in order, then the pair of threads of its sub-block). U (a
    // std::integral_constant): (token, super-block)s a half-warp loads before any is stored.
    auto stage4 = [&](int j0, int cnt, auto u) {
        constexpr int U = decltype(u)::value, kHalves = 2 * kQmmaWarps;
        const int units = NTOK * cnt, k = lane & 15;
        // warp-uniform trip count: the shuffles need both half-warps
        for (int u0 = 2 * warp; u0 < units; u0 += U * kHalves) {
            float4 v[U][4];
#pragma unroll
            for (int h = 0; h < U; ++h) {
                const int ui = u0 + h * kHalves + (lane >> 4), t = ui / cnt, sbl = ui - t * cnt;
                const float4* src = (const float4*)(x + size_t(t) * in + size_t(sb_lo + j0 + sbl) * 256 + 16 * k);
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    v[h][e] = ui < units && t < n ? src[e] : make_float4(0.f, 0.f, 0.f, 0.f);
            }
#pragma unroll
            for (int h = 0; h < U; ++h) {
                const int ui = u0 + h * kHalves + (lane >> 4), t = ui / cnt, sbl = ui - t * cnt;
                float m = 0.f;
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    m = fmaxf(fmaxf(m, fmaxf(fabsf(v[h][e].x), fabsf(v[h][e].y))),
                              fmaxf(fabsf(v[h][e].z), fabsf(v[h][e].w)));
#pragma unroll
                for (int o = 1; o < 16; o <<= 1) m = fmaxf(m, __shfl_xor_sync(0xFFFFFFFFu, m, o));
                // max |x| 2^e in [2^9, 2^10): e = 9 - floor(log2 max) (136 - the biased exponent); zero: 1;
                // at most 2^126 (max |x| below 2^-117: values that small lose bits, not range)
                const int e = m > 0.f ? min(126, 136 - int(__float_as_uint(m) >> 23)) : 0;
                const float up = __uint_as_float(uint32_t(127 + e) << 23);
                float sum = 0.f;
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const __half h0 = __float2half_rn(v[h][i].x * up), h1 = __float2half_rn(v[h][i].y * up),
                                 h2 = __float2half_rn(v[h][i].z * up), h3 = __float2half_rn(v[h][i].w * up);
                    sum = __fadd_rn(__fadd_rn(__fadd_rn(__fadd_rn(sum, __half2float(h0)), __half2float(h1)),
                                              __half2float(h2)),
                                    __half2float(h3));
                    const __half2 p[2] = {__halves2half2(h0, h2), __halves2half2(h1, h3)};
                    if (ui < units)
                        *(uint2*)&xs[size_t(t) * rs + 256 * sbl + 4 * qmma_q4_p4(4 * k + i)] = *(const uint2*)p;
                }
                sum = __fadd_rn(sum, __shfl_xor_sync(0xFFFFFFFFu, sum, 1));  // the same sum in both (a + b = b + a)
                if (ui < units && (k & 1) == 0) {
                    // sub-block sb = k / 2 of lane sb / 2: hi at half 4 (sb / 2) + sb % 2, lo 2 halves after it
                    const int sb = k >> 1;
                    const __half hi = __float2half_rn(sum), lo = __float2half_rn(__fsub_rn(sum, __half2float(hi)));
                    __half* s = (__half*)&xsum[(size_t(sbl) * NTOK + t) * 4 + (sb >> 1)];
                    s[sb & 1] = hi;
                    s[2 + (sb & 1)] = lo;
                }
                if (ui < units && k == 0) xinv[sbl * NTOK + t] = __uint_as_float(uint32_t(127 - e) << 23);
            }
        }
    };
    auto stage = [&](int j0, int cnt, auto u) {
        // q4_K: 2 (token, super-block)s in flight up to 3 tiles (8 float4s a thread, as U = 8 below), 1 above
        // (at 4 tiles 2 spill registers: ptxas -v)
        if constexpr (kQ4) stage4(j0, cnt, std::integral_constant<int, (decltype(u)::value == 0 || NT > 3) ? 1 : 2>());
        else stage6(j0, cnt, u);
    };

    const uint32_t magic = qmma_magic();  // q4_K: qmma_q4_pair
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;

    // The last round: `ta` of the block's warps hold a group (warps 0 .. ta - 1: groups are numbered across
    // the blocks first). Where they are few, each of those groups is split over `ts` warps of the block, each a
    // contiguous K run of the split's super-blocks, summed in shared memory in run order after the loop
    // (qmma_tail): the round then runs on ta ts warps, not ta alone. One warp streaming by itself runs at its
    // own latency, not at the multiprocessor's share of the bandwidth; by qmma_plan the 27B's gate_up at 4 rows
    // leaves one group of 20 steps to a lone warp on 64 of 132 multiprocessors after a full round, at 9 and 23
    // rows one of 10 steps, ssm_out 4 warps of 3 steps. Not in a chunked split (its barriers need every warp
    // on the same super-block). The split depends on the grid (ta, ts): fixed for a device and a shape.
    const int last = iters - 1, left_b = groups - last * wstride - int(blockIdx.x);
    const int ta = left_b <= 0 ? 0 : min(kQmmaWarps, (left_b + int(gridDim.x) - 1) / int(gridDim.x));
    const int ts = (!kTail || chunked || ta == 0 || ta == kQmmaWarps) ? 1 : min(kQmmaWarps / ta, nsb);
    // round it of this warp: its group and super-blocks [j0, j1) of the split
    auto range = [&](int it, int& grp, int& j0, int& j1) {
        grp = wid + it * wstride;
        j0 = 0;
        j1 = nsb;
        if (it == last && ts > 1) {
            if (warp < ta * ts) {
                const int p = warp % ts;
                grp = (warp / ts) * int(gridDim.x) + int(blockIdx.x) + it * wstride;
                j0 = nsb * p / ts;
                j1 = nsb * (p + 1) / ts;
            } else {
                grp = groups;
                j0 = j1 = 0;
            }
        } else if (kTail && grp >= groups && !chunked) {
            j0 = j1 = 0;  // nothing to stream (a chunked split's warps all take every step: its barriers)
        }
    };
    // step s (>= 1) after super-block j of round it (group grp, super-blocks up to j1) asked of L2: in this
    // round, else in the next (a hint: not further)
    auto prefetch_ahead = [&](int it, int grp, int j, int j1, int s) {
        int pj = j + s;
        if (pj < j1) return prefetch(grp, pj);
        if (it + 1 >= iters) return;
        int g2, a2, b2;
        range(it + 1, g2, a2, b2);
        pj = a2 + pj - j1;
        if (pj < b2) prefetch(g2, pj);
    };
    QmmaRaw<T> ca, cb, na, nb;
    // a warp's steps in order: round it (group grp), super-blocks j .. j1 - 1; rounds without steps skipped;
    // it == iters: done. The first step's weights and the next kQmmaAhead asked of memory before the staging.
    int it = 0, grp = 0, j = 0, j1 = 0;
    for (; it < iters; ++it) {
        range(it, grp, j, j1);
        if (j < j1) break;
    }
    if (it < iters && grp < groups) load(ca, cb, grp, j);
    if (it < iters)
        for (int s = 1; s <= kQmmaAhead; ++s) prefetch_ahead(it, grp, j, j1, s);
    // launched with programmatic dependent launch (launch_k): the weights above are requested while the kernel
    // before still runs; x, y and the partials are touched only after the wait
    griddep_launch();
    griddep_wait();
    if (!chunked) {  // the split's slice at once (23 rows, 10 super-blocks: 30 float4s a thread, 4 round trips)
        stage(0, nsb, std::integral_constant<int, NT <= 4 ? 8 : 0>());
        __syncthreads();
    }
    float* pz = part ? part + size_t(blockIdx.y) * n * out : nullptr;
    // the group's sums over this split (C fragment: acc[t][0, 1]: row g, tokens 8t + 2q, + 1; acc[t][2, 3]:
    // row g + 8) to y or the split's partials
    auto put = [&](int grp, int t, int e, float v) {
        const int tok = 8 * t + 2 * q + (e & 1), row = 16 * grp + g + (e < 2 ? 0 : 8);
        if (grp < groups && tok < n && row < out) {
            if (pz) {
                pz[size_t(tok) * out + row] = v;
            } else {
                float* dst = y + size_t(tok) * ldy + row;
                *dst = accumulate ? *dst + v : v;
            }
        }
    };
    while (it < iters) {
        if (chunked && j % chunk == 0) {  // every warp is on the same super-block here (no tail split)
            __syncthreads();              // every warp done with the previous chunk
            stage(j, min(chunk, nsb - j), std::integral_constant<int, 0>());
            __syncthreads();
        }
        // the next step, its weights loaded before this step's arithmetic
        int nit = it, ngrp = grp, nj = j + 1, nj1 = j1;
        if (nj >= j1)
            for (++nit; nit < iters; ++nit) {
                range(nit, ngrp, nj, nj1);
                if (nj < nj1) break;
            }
        if (nit < iters && ngrp < groups) load(na, nb, ngrp, nj);
        prefetch_ahead(it, grp, j, j1, kQmmaAhead + 1);
        if (grp < groups) {
            const int jj = j % chunk;  // the super-block's place in the staged slice
            if constexpr (kQ4) {
                const QmmaQ4 sa = qmma_q4_scales(ca, q), sb = qmma_q4_scales(cb, q);
                // the mins first: sum_j m_j xs_j (rows g, g + 8; tokens 8t + 2q, + 1) through one mma a tile,
                // A = (m_2q, m_2q+1) at k 2q, 2q + 1 and again at 2q + 8, 2q + 9; B = the sums' hi, then lo
                const float2* inv = (const float2*)&xinv[jj * NTOK + 2 * q];  // 2^-e of tokens 8t + 2q, + 1: inv[4t]
                {
                    const uint32_t am[4] = {sa.m, sb.m, sa.m, sb.m};
#pragma unroll
                    for (int t = 0; t < NT; ++t) {
                        const uint2 bm = xsum[(size_t(jj) * NTOK + 8 * t + g) * 4 + q];
                        const float2 iv = inv[4 * t];
                        float mn[4];
                        mma_f16_16816_z(mn, am, bm.x, bm.y);
                        acc[t][0] = __fmaf_rn(-qmma_dmin(sa.dm) * iv.x, mn[0], acc[t][0]);
                        acc[t][1] = __fmaf_rn(-qmma_dmin(sa.dm) * iv.y, mn[1], acc[t][1]);
                        acc[t][2] = __fmaf_rn(-qmma_dmin(sb.dm) * iv.x, mn[2], acc[t][2]);
                        acc[t][3] = __fmaf_rn(-qmma_dmin(sb.dm) * iv.y, mn[3], acc[t][3]);
                    }
                }
                // then sum sc q x over the super-block into fresh accumulators: word w gives the mma of chunk w
                // (low nibbles: bytes 0, 2 at k 2q, 2q + 1; bytes 1, 3 at 2q + 8, 2q + 9) and of chunk w + 8
                float sx[NT][4];
                const uint16_t* xj = xs + 256 * jj + 8 * q;
#pragma unroll
                for (int w = 0; w < 8; ++w) {
                    const uint32_t wa = ca.word(w), wb = cb.word(w), wa8 = wa >> 8, wb8 = wb >> 8;
                    const uint32_t a0[4] = {
                        qmma_q4_pair<0x000F000Fu>(wa, magic, hbcast<0>(sa.mul), hbcast<0>(sa.add)),
                        qmma_q4_pair<0x000F000Fu>(wb, magic, hbcast<0>(sb.mul), hbcast<0>(sb.add)),
                        qmma_q4_pair<0x000F000Fu>(wa8, magic, hbcast<0>(sa.mul), hbcast<0>(sa.add)),
                        qmma_q4_pair<0x000F000Fu>(wb8, magic, hbcast<0>(sb.mul), hbcast<0>(sb.add))};
                    const uint32_t a1[4] = {
                        qmma_q4_pair<0x00F000F0u>(wa, magic, hbcast<1>(sa.mul), hbcast<1>(sa.add)),
                        qmma_q4_pair<0x00F000F0u>(wb, magic, hbcast<1>(sb.mul), hbcast<1>(sb.add)),
                        qmma_q4_pair<0x00F000F0u>(wa8, magic, hbcast<1>(sa.mul), hbcast<1>(sa.add)),
                        qmma_q4_pair<0x00F000F0u>(wb8, magic, hbcast<1>(sb.mul), hbcast<1>(sb.add))};
#pragma unroll
                    for (int t = 0; t < NT; ++t) {  // both chunks' activations in one 16-byte read a tile
                        const uint4 bx = *(const uint4*)&xj[size_t(8 * t + g) * rs + 32 * w];
                        if (w == 0) mma_f16_16816_z(sx[t], a0, bx.x, bx.y);
                        else mma_f16_16816(sx[t], a0, bx.x, bx.y);
                        mma_f16_16816(sx[t], a1, bx.z, bx.w);
                    }
                }
#pragma unroll
                for (int t = 0; t < NT; ++t) {
                    const float2 iv = inv[4 * t];
                    acc[t][0] = __fmaf_rn(qmma_d(sa.dm) * iv.x, sx[t][0], acc[t][0]);
                    acc[t][1] = __fmaf_rn(qmma_d(sa.dm) * iv.y, sx[t][1], acc[t][1]);
                    acc[t][2] = __fmaf_rn(qmma_d(sb.dm) * iv.x, sx[t][2], acc[t][2]);
                    acc[t][3] = __fmaf_rn(qmma_d(sb.dm) * iv.y, sx[t][3], acc[t][3]);
                }
            } else {
                float sa[4], sbv[4];
                qmma_scales6(ca, sa);
                qmma_scales6(cb, sbv);
                const uint16_t* xj = xs + 256 * jj + 8 * q;
#pragma unroll
                for (int c = 0; c < 16; c += 2) {
                    // A fragments of chunks c, c + 1: {row g: k 2q, 2q+1}, {row g + 8}, {row g: k 2q+8, 2q+9},
                    // {row g + 8}
                    uint32_t a0[4], a1[4];
                    qmma_chunk6(ca, c, sa, &a0[0], &a0[2]);
                    qmma_chunk6(cb, c, sbv, &a0[1], &a0[3]);
                    qmma_chunk6(ca, c + 1, sa, &a1[0], &a1[2]);
                    qmma_chunk6(cb, c + 1, sbv, &a1[1], &a1[3]);
#pragma unroll
                    for (int t = 0; t < NT; ++t) {  // both chunks' activations in one 16-byte read a tile
                        const uint4 bx = *(const uint4*)&xj[size_t(8 * t + g) * rs + 16 * c];
                        mma_bf16_16816(acc[t], a0, bx.x, bx.y);
                        mma_bf16_16816(acc[t], a1, bx.z, bx.w);
                    }
                }
            }
        }
        ca = na;
        cb = nb;
        if (nit != it && !(it == last && ts > 1)) {  // a whole group done: out, cleared
#pragma unroll
            for (int t = 0; t < NT; ++t)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    put(grp, t, e, acc[t][e]);
                    acc[t][e] = 0.f;
                }
        }
        it = nit;
        grp = ngrp;
        j = nj;
        j1 = nj1;
    }
    if (ts > 1) {  // qmma_tail: the last round's K runs, summed in run order by the group's first warp
        // [kQmmaWarps][NT][4][32] over the staged activations: 8 KB NT <= qmma_smem_bytes<T>(NT, chunk), as a split
        // of ts >= 2 super-blocks staged at once has chunk >= 2
        float* red = (float*)qmma_smem;
        __syncthreads();                 // every warp done with them
        if (warp < ta * ts)
#pragma unroll
            for (int t = 0; t < NT; ++t)
#pragma unroll
                for (int e = 0; e < 4; ++e) red[((warp * NT + t) * 4 + e) * 32 + lane] = acc[t][e];
        __syncthreads();
        if (warp < ta * ts && warp % ts == 0) {
            const int grp = (warp / ts) * int(gridDim.x) + int(blockIdx.x) + last * wstride;
#pragma unroll
            for (int t = 0; t < NT; ++t)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    float v = acc[t][e];
                    for (int p = 1; p < ts; ++p) v = __fadd_rn(v, red[(((warp + p) * NT + t) * 4 + e) * 32 + lane]);
                    put(grp, t, e, v);
                }
        }
    }
}
#endif

#if LB_QUANT_MMA
constexpr int QM = 64, QN = 64, QKS = 64, QPAD = 8;

// Block (tile of 64 rows, tile of 64 tokens, K split z): 4 warps, each 32 tokens x 32 rows of the tile.
// Per K step of 64: thread t stages half of weight row t / 2 (32 elements: four dq8) and 32 activations.
template <DType T>
__global__ __launch_bounds__(128) void qgemm_kernel(const float* __restrict__ x, int n, int in,
                                                    const uint8_t* __restrict__ W, int out, float* __restrict__ y,
                                                    int ldy, bool accumulate, int ksteps, float* __restrict__ part) {
    using namespace nvcuda;
    struct Tiles {
        __nv_bfloat16 A[QM][QKS + QPAD];
        __nv_bfloat16 B[QN][QKS + QPAD];
    };
    constexpr size_t kSmem = sizeof(Tiles) > sizeof(float) * QM * (QN + 4) ? sizeof(Tiles) : sizeof(float) * QM * (QN + 4);
    __shared__ __align__(32) unsigned char smem[kSmem];
    Tiles& tl = *(Tiles*)smem;
    float(*Cs)[QN + 4] = (float(*)[QN + 4])smem;  // after the K loop
    const int m0 = blockIdx.y * QM, n0 = blockIdx.x * QN;
    const int tid = threadIdx.x, warp = tid / 32, wm = warp / 2, wn = warp % 2;
    const size_t rb = row_bytes<T>(in);
    const int wrow = tid >> 1, wk = 32 * (tid & 1);
    const uint8_t* wp = W + size_t(min(n0 + wrow, out - 1)) * rb;
    const bool wvalid = n0 + wrow < out;
    const int arow = tid >> 1, ak = 32 * (tid & 1);
    const float* xp = x + size_t(min(m0 + arow, n - 1)) * in;
    const bool avalid = m0 + arow < n;

    wmma::fragment<wmma::accumulator, 16, 16, 16, float> c[2][2];
    for (int i = 0; i < 2; ++i) for (int j = 0; j < 2; ++j) wmma::fill_fragment(c[i][j], 0.f);
    const int kt0 = blockIdx.z * ksteps, kt1 = min(in / QKS, kt0 + ksteps);
    for (int kt = kt0; kt < kt1; ++kt) {
        const int k0 = kt * QKS;
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            float v[8];
            dq8<T>(wp, k0 + wk + 8 * q, v);
            __nv_bfloat162 p[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) p[i] = __floats2bfloat162_rn(wvalid ? v[2 * i] : 0.f, wvalid ? v[2 * i + 1] : 0.f);
            *(uint4*)&tl.B[wrow][wk + 8 * q] = *(const uint4*)p;
            const float4 a = avalid ? *(const float4*)(xp + k0 + ak + 8 * q) : make_float4(0.f, 0.f, 0.f, 0.f);
            const float4 b = avalid ? *(const float4*)(xp + k0 + ak + 8 * q + 4) : make_float4(0.f, 0.f, 0.f, 0.f);
            __nv_bfloat162 pa[4] = {__floats2bfloat162_rn(a.x, a.y), __floats2bfloat162_rn(a.z, a.w),
                                    __floats2bfloat162_rn(b.x, b.y), __floats2bfloat162_rn(b.z, b.w)};
            *(uint4*)&tl.A[arow][ak + 8 * q] = *(const uint4*)pa;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < QKS; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b[2];
            for (int i = 0; i < 2; ++i) wmma::load_matrix_sync(a[i], &tl.A[wm * 32 + i * 16][kk], QKS + QPAD);
            for (int j = 0; j < 2; ++j) wmma::load_matrix_sync(b[j], &tl.B[wn * 32 + j * 16][kk], QKS + QPAD);
            for (int i = 0; i < 2; ++i) for (int j = 0; j < 2; ++j) wmma::mma_sync(c[i][j], a[i], b[j], c[i][j]);
        }
        __syncthreads();
    }
    for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j)
            wmma::store_matrix_sync(&Cs[wm * 32 + i * 16][wn * 32 + j * 16], c[i][j], QN + 4, wmma::mem_row_major);
    __syncthreads();
    float* pz = part ? part + size_t(blockIdx.z) * n * out : nullptr;
    for (int e = tid; e < QM * QN; e += blockDim.x) {
        const int r = e / QN, cc = e % QN, gm = m0 + r, gn = n0 + cc;
        if (gm < n && gn < out) {
            if (pz) {
                pz[size_t(gm) * out + gn] = Cs[r][cc];
            } else {
                float* dst = y + size_t(gm) * ldy + gn;
                *dst = accumulate ? *dst + Cs[r][cc] : Cs[r][cc];
            }
        }
    }
}

// y[t][c] (+)= sum over z of part[z][t][c], in split order. After qmma_kernel launched with programmatic
// dependent launch (launch_k), so that its launch overlaps the GEMM's last round; the partials and y are read
// only after the wait.
__global__ void qsplit_sum_kernel(const float* __restrict__ part, int splits, int n, int out, float* __restrict__ y,
                                  int ldy, bool accumulate) {
    griddep_launch();
    griddep_wait();
    const size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x, count = size_t(n) * out;
    if (i >= count) return;
    const size_t t = i / out, c = i % out;
    float a = accumulate ? y[t * ldy + c] : 0.f;
    for (int z = 0; z < splits; ++z) a += part[size_t(z) * count + i];
    y[t * ldy + c] = a;
}
#endif

template <DType T>
void launch(const float* x, int n, int in, const uint8_t* W, int out, float* y, int ldy, bool accumulate,
            gpuStream_t s) {
    const unsigned gemv_blocks = unsigned((out + kGemvWarps * kRowsPerWarp - 1) / (kGemvWarps * kRowsPerWarp));
#if LB_QUANT_MMA
    if (n >= kGemmTcMinRows && gemm_tc(x, n, in, W, T, out, y, ldy, accumulate, s)) return;
    if (n > kQuantGemvMax) {
        const int tiles = ((out + QN - 1) / QN) * ((n + QM - 1) / QM), ksteps_all = in / QKS;
        // Split-K while the tiles leave multiprocessors idle (>= 4 K steps a split); the partials need scratch,
        // which is refused during graph capture (then one split).
        int splits = splitk_count(tiles, ksteps_all, 4, tuning().gemm_splitk_per_sm);
        if (splits < 2 || !context().splitk.get(size_t(splits) * n * out, s)) splits = 1;
        const int ksteps = (ksteps_all + splits - 1) / splits;
        const dim3 grid((out + QN - 1) / QN, (n + QM - 1) / QM, splits);
        qgemm_kernel<T><<<grid, 128, 0, s>>>(x, n, in, W, out, y, ldy, accumulate, ksteps,
                                             splits > 1 ? context().splitk.p : nullptr);
        if (splits > 1) {
            const size_t count = size_t(n) * out;
            qsplit_sum_kernel<<<unsigned((count + 255) / 256), 256, 0, s>>>(context().splitk.p, splits, n, out, y, ldy,
                                                                          accumulate);
        }
        return;
    }
#endif
    for (int t0 = 0; t0 < n; t0 += kQuantGemvMax) {
        const int m = std::min(kQuantGemvMax, n - t0);
        const float* xt = x + size_t(t0) * in;
        float* yt = y + size_t(t0) * ldy;
        switch (m) {
            case 1: qgemv_kernel<T, 1><<<gemv_blocks, kGemvWarps * 32, 0, s>>>(xt, in, W, out, yt, ldy, accumulate); break;
            case 2: qgemv_kernel<T, 2><<<gemv_blocks, kGemvWarps * 32, 0, s>>>(xt, in, W, out, yt, ldy, accumulate); break;
            case 3: qgemv_kernel<T, 3><<<gemv_blocks, kGemvWarps * 32, 0, s>>>(xt, in, W, out, yt, ldy, accumulate); break;
            default: qgemv_kernel<T, 4><<<gemv_blocks, kGemvWarps * 32, 0, s>>>(xt, in, W, out, yt, ldy, accumulate); break;
        }
    }
}

template <DType T>
__global__ void embed_quant_kernel(const int* tokens, const uint8_t* E, int H, float* x) {
    const uint8_t* row = E + size_t(tokens[blockIdx.x]) * row_bytes<T>(H);
    for (int k = 8 * threadIdx.x; k < H; k += 8 * blockDim.x) {
        float v[8];
        dq8<T>(row, k, v);
        float* dst = x + size_t(blockIdx.x) * H + k;
        *(float4*)dst = make_float4(v[0], v[1], v[2], v[3]);
        *(float4*)(dst + 4) = make_float4(v[4], v[5], v[6], v[7]);
    }
}

// y[t][(j * nk + kh) * ph + e] = x[t][(kh * r + j) * ph + e]: value heads grouped -> tiled. One element a
// thread over a grid (width / 256, tokens): a decode step's row is one round trip, not one per 256 elements.
__global__ void heads_to_tiled_kernel(const float* __restrict__ x, int n, int nk, int r, int ph,
                                      float* __restrict__ y) {
    griddep_launch();
    griddep_wait();
    const int width = nk * r * ph, i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= width) return;
    const int head = i / ph, e = i % ph, j = head / nk, kh = head % nk, src = (kh * r + j) * ph + e;
    for (int t = blockIdx.y; t < n; t += gridDim.y) y[size_t(t) * width + i] = x[size_t(t) * width + src];
}

}  // namespace

bool quant_type_ok(DType t) {
    return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K || t == DType::Q8_0 || t == DType::Q4_0;
}

#if LB_QUANT_MMA
// A qmma launch: `splits` K splits of `per` super-blocks, staged `chunk` at a time (chunk >= per: once), a grid of
// gx row blocks a split, each warp `iters` row groups of 16.
struct QmmaPlan {
    int splits = 1, per = 1, chunk = 1, gx = 1, iters = 1;
};

// The plan that minimises the time, counted in bytes over the whole GPU: the warps' steps (a block's share of
// its split's row groups, ceil(groups / gx) x per steps of 16 blocks, over its kQmmaWarps warps: the groups of
// a last, partial round fall on every block, so a multiprocessor's work, not its slowest warp's, is the
// measure), the split partials written and summed (8 bytes each, counted at half as they stay in L2, and ~8 MB
// for the sum kernel's launch) and the activations staged (fp32 from L2, at half). A split's slice is staged
// once where per <= chunk_max, else restaged for each round of groups. Splits only where the scratch may grow
// (can_split). gx is as many blocks as a round of `slots` holds for the split.
inline QmmaPlan qmma_plan(int out, int nblk, int n, int nt, int bb, int chunk_max, long slots, bool can_split) {
    const long groups = (out + 15) / 16, warp_slots = slots * kQmmaWarps;
    QmmaPlan best;
    double best_cost = 0;
    for (int sp = 1; sp <= (can_split ? std::min(nblk, 32) : 1); ++sp) {
        const int per = (nblk + sp - 1) / sp, used = (nblk + per - 1) / per;
        if (sp > 1 && used != sp) continue;  // the same as a smaller count
        const long gx = std::min(std::max(1L, slots / used), (groups + kQmmaWarps - 1) / kQmmaWarps);
        const long iters = (groups + gx * kQmmaWarps - 1) / (gx * kQmmaWarps);
        const int chunk = std::min(per, chunk_max);
        const long restage = per > chunk ? iters : 1;
        const double steps = double((groups + gx - 1) / gx) * per * bb * warp_slots;
        const double partials = used > 1 ? 4.0 * used * n * out + 8e6 : 0.0;
        const double staged = 0.5 * double(gx) * used * restage * 8 * nt * per * 256 * 4;
        const double cost = steps + partials + staged;
        if (sp == 1 || cost < 0.98 * best_cost) {
            best = {used, per, chunk, int(gx), int(iters)};
            best_cost = cost;
        }
    }
    return best;
}

template <DType T, int NT>
void launch_qmma_nt(const float* x, int n, int in, const uint8_t* W, int out, float* y, int ldy, bool accumulate,
                    gpuStream_t s, bool split) {
    // Per device: the most super-blocks a block stages at once, the kernel's shared-memory limit raised to that
    // size (above 48 KB; every launch asks at most that), and the resident blocks a multiprocessor at it.
    struct QmmaDevice {
        int device, chunk_max, per_sm;
    };
    static std::vector<QmmaDevice> devs;
    const int device = context().device;
    auto it = std::find_if(devs.begin(), devs.end(), [&](const QmmaDevice& d) { return d.device == device; });
    if (it == devs.end()) {
        // a token's bytes: 64 fixed, 512 (+ q4_K's side data) a super-block
        const int per_sb = 512 + (T == DType::Q4_K ? kQmmaSideBytes : 0);
        const int chunk_max = std::max(1, (std::min(context().smem_optin, kQmmaSmemBudget) / (8 * NT) - 64) / per_sb);
        const int smem = int(qmma_smem_bytes<T>(NT, chunk_max));
        GPU_CHECK(cudaFuncSetAttribute(qmma_kernel<T, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        int b = 0;
        GPU_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, qmma_kernel<T, NT>, kQmmaWarps * 32, smem));
        it = devs.insert(devs.end(), QmmaDevice{device, chunk_max, std::max(b, 1)});
    }
    const int chunk_max = it->chunk_max;
    constexpr int BB = T == DType::Q4_K ? 144 : 210;
    const int nblk = in / 256;
    const long slots = long(it->per_sm) * context().sms;
    QmmaPlan p = qmma_plan(out, nblk, n, NT, BB, chunk_max, slots, split);
    // the partials need scratch, refused during graph capture (then one split, restaged chunk by chunk)
    float* part = nullptr;
    if (p.splits > 1 && !(part = context().splitk.get(size_t(p.splits) * n * out, s)))
        p = qmma_plan(out, nblk, n, NT, BB, chunk_max, slots, false);
    launch_k(qmma_kernel<T, NT>, dim3(p.gx, p.splits), dim3(kQmmaWarps * 32), qmma_smem_bytes<T>(NT, p.chunk), s, x, n,
             in, W, out, y, ldy, accumulate, p.per, p.chunk, p.iters, part);
    if (p.splits > 1) {
        const size_t count = size_t(n) * out;
        launch_k(qsplit_sum_kernel, dim3(unsigned((count + 255) / 256)), dim3(256), 0, s, (const float*)part, p.splits,
                 n, out, y, ldy, accumulate);
    }
}

template <DType T>
void launch_qmma(const float* x, int n, int in, const uint8_t* W, int out, float* y, int ldy, bool accumulate,
                 gpuStream_t s, bool split) {
    switch ((n + 7) / 8) {
#define LB_QMMA_CASE(NT) \
    case NT: return launch_qmma_nt<T, NT>(x, n, in, W, out, y, ldy, accumulate, s, split);
        LB_QMMA_CASE(1) LB_QMMA_CASE(2) LB_QMMA_CASE(3) LB_QMMA_CASE(4) LB_QMMA_CASE(5) LB_QMMA_CASE(6)
        LB_QMMA_CASE(7) LB_QMMA_CASE(8)
        default: return launch_qmma_nt<T, 9>(x, n, in, W, out, y, ldy, accumulate, s, split);
#undef LB_QMMA_CASE
    }
}
#endif

// Which kernel takes a q4_K / q6_K matrix (the other types: launch<T>): qmma_kernel above kQuantGemvMax rows
// (CUDA bf16 builds), qmv_kernel up to kQmvMaxRows, then launch<T>. `gemv` (gpu_ops.h) is the op check's and
// --time-quant's hook for naming one kernel; the engines pass 0.
// (unused without LB_QUANT_MMA)
[[maybe_unused]] static bool qmma_takes(DType t, int n, int in, const void* W, int gemv) {
#if LB_QUANT_MMA
    if ((t != DType::Q4_K && t != DType::Q6_K) || in % 256 != 0 || n > kQmmaMaxRows) return false;
    if (t == DType::Q4_K && (uintptr_t(W) & 15) != 0) return false;
    return gemv == 2 || gemv == 5 || (gemv == 0 && n > kQuantGemvMax);
#else
    (void)t; (void)n; (void)in; (void)W; (void)gemv;
    return false;
#endif
}

static bool qmv_takes(DType t, int n, int in, const void* W, int gemv) {
    if ((t != DType::Q4_K && t != DType::Q6_K) || in % 256 != 0 || n > kQmvMaxRows) return false;
    if (t == DType::Q4_K && (uintptr_t(W) & 15) != 0) return false;  // 16-byte loads of whole blocks
    return gemv == 0 || gemv == 1 || gemv == 3 || gemv == 4;
}

void matmul_quant(const float* x, int n, int in, const void* W, DType t, int out, float* y, int ldy, bool accumulate,
                  gpuStream_t s, int gemv) {
#if LB_QUANT_MMA
    if (qmma_takes(t, n, in, W, gemv)) {
        const bool split = gemv != 5;
        if (t == DType::Q4_K)
            return launch_qmma<DType::Q4_K>(x, n, in, (const uint8_t*)W, out, y, ldy, accumulate, s, split);
        return launch_qmma<DType::Q6_K>(x, n, in, (const uint8_t*)W, out, y, ldy, accumulate, s, split);
    }
#endif
    if (qmv_takes(t, n, in, W, gemv)) {
        const int rows = gemv == 3 ? 2 : gemv == 4 ? 4 : 0;
        if (t == DType::Q4_K) return launch_qmv<DType::Q4_K>(x, n, in, (const uint8_t*)W, out, y, ldy, accumulate, s, rows);
        return launch_qmv<DType::Q6_K>(x, n, in, (const uint8_t*)W, out, y, ldy, accumulate, s, rows);
    }
    if (in % 8 != 0 || (t != kWT && in % int(dtype_block_elems(t)) != 0) || (n > kQuantGemvMax && in % 64 != 0))
        fail("unsupported", std::string("matmul_quant: ") + dtype_name(t) + " rows of " + std::to_string(in) +
                                " elements (needs whole blocks, a multiple of 64 above " +
                                std::to_string(kQuantGemvMax) + " rows)");
    const uint8_t* w = (const uint8_t*)W;
    switch (t) {
        case DType::Q4_K: return launch<DType::Q4_K>(x, n, in, w, out, y, ldy, accumulate, s);
        case DType::Q5_K: return launch<DType::Q5_K>(x, n, in, w, out, y, ldy, accumulate, s);
        case DType::Q6_K: return launch<DType::Q6_K>(x, n, in, w, out, y, ldy, accumulate, s);
        case DType::Q8_0: return launch<DType::Q8_0>(x, n, in, w, out, y, ldy, accumulate, s);
        case DType::Q4_0: return launch<DType::Q4_0>(x, n, in, w, out, y, ldy, accumulate, s);
        default:
            if (t == kWT) return launch<kWT>(x, n, in, w, out, y, ldy, accumulate, s);
            fail("unsupported", std::string("matmul_quant: element type ") + dtype_name(t));
    }
}

bool matmul_quant_rmsnorm(const float* x, const float* gain, float eps, int in, const void* W, DType t, int out,
                          float* y, int ldy, bool accumulate, gpuStream_t s, bool swiglu) {
    if (!qmv_takes(t, 1, in, W, 0) || in > kQmvNormMaxIn || (swiglu && (out % 4 != 0 || accumulate))) return false;
    const uint8_t* w = (const uint8_t*)W;
    if (t == DType::Q4_K) launch_qmv<DType::Q4_K>(x, 1, in, w, out, y, ldy, accumulate, s, 0, gain, eps, swiglu);
    else launch_qmv<DType::Q6_K>(x, 1, in, w, out, y, ldy, accumulate, s, 0, gain, eps, swiglu);
    return true;
}

void embed_quant(const int* d_tokens, int n, const void* E, DType t, int H, float* x, gpuStream_t s) {
    if (H % 8 != 0 || H % int(dtype_block_elems(t)) != 0)
        fail("unsupported", std::string("embed_quant: ") + dtype_name(t) + " rows of " + std::to_string(H));
    const uint8_t* e = (const uint8_t*)E;
    const int threads = std::min(256, std::max(32, H / 8));
    switch (t) {
        case DType::Q4_K: embed_quant_kernel<DType::Q4_K><<<n, threads, 0, s>>>(d_tokens, e, H, x); return;
        case DType::Q5_K: embed_quant_kernel<DType::Q5_K><<<n, threads, 0, s>>>(d_tokens, e, H, x); return;
        case DType::Q6_K: embed_quant_kernel<DType::Q6_K><<<n, threads, 0, s>>>(d_tokens, e, H, x); return;
        case DType::Q8_0: embed_quant_kernel<DType::Q8_0><<<n, threads, 0, s>>>(d_tokens, e, H, x); return;
        case DType::Q4_0: embed_quant_kernel<DType::Q4_0><<<n, threads, 0, s>>>(d_tokens, e, H, x); return;
        default: fail("unsupported", std::string("embed_quant: element type ") + dtype_name(t));
    }
}

void heads_to_tiled(const float* x, int n, int nk, int nv, int per_head, float* y, gpuStream_t s) {
    const int width = nv * per_head;
    launch_k(heads_to_tiled_kernel, dim3(unsigned((width + 255) / 256), unsigned(std::min(n, 65535))), dim3(256), 0, s,
             x, n, nk, nv / nk, per_head, y);
}

}  // namespace lb::gpu
