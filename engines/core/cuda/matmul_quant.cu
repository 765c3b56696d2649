// y (=|+=) x W^T with W in GGUF's block formats (q4_K, q5_K, q6_K, q8_0, q4_0) kept as the file stores
// them, so that a step streams the file's bytes, not a bf16 copy of them; and the embedding lookup from such
// a table. CPU reference: decode_row (../quant.cpp, ggml's dequantisation) then ../cpu/matmul.cpp.
//
// Weights are dequantised in registers exactly as ggml does (fp32: d * scale * q - dmin * min), 8 elements at
// a time (dq8); two kernels use them:
//  * qgemv_kernel<T, N> (n <= kQuantGemvMax): one warp per two output rows, fp32 FMA, all n tokens share each
//    dequantised weight. Decode (n = 1). qgemv32_kernel<T, N> (the qgemv32 knob): the same with a lane taking a
//    32-element scale group at a time (dq32), which spends fewer instructions on addresses and scales.
//  * qgemm_kernel<T> (n above): 64 tokens x 64 rows a block; the K loop dequantises a 64 x 64 weight tile to
//    bf16 in shared memory and multiplies on the tensor cores (fp32 accumulation; activations rounded to
//    bf16 as the bf16 GEMM does). Each weight block is read once per 64 tokens, so a verify of up to 64 rows
//    streams the weights once. Split-K (partials summed in split order) when the output tiles do not fill
//    the GPU. HIP: GEMV over groups of tokens (no tensor-core path yet).
// The element type WT (the backend's wtype, tagged DType::BF16 or F16) runs through the same kernels, for the
// parts of a matrix the file stores in f32/f16/bf16 next to quantised ones.
#include "common.cuh"
#include "quant_blocks.cuh"

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

// As qgemv_kernel, lane c taking a whole 32-element scale group (elements [32c, 32c + 32) of every 1024):
// the block address and scales once a group, the quants four a word (dq32). Tuning::qgemv32.
template <DType T, int N>
__global__ __launch_bounds__(kGemvWarps * 32) void qgemv32_kernel(const float* __restrict__ x, int in,
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
    for (int k = lane * 32; k < in; k += 1024) {
        float w[kRowsPerWarp][32];
#pragma unroll
        for (int r = 0; r < kRowsPerWarp; ++r) dq32<T>(rows[r], k, w[r]);
#pragma unroll
        for (int t = 0; t < N; ++t) {
#pragma unroll
            for (int c = 0; c < 8; ++c) {
                const float4 a = *(const float4*)(x + size_t(t) * in + k + 4 * c);
#pragma unroll
                for (int r = 0; r < kRowsPerWarp; ++r)
                    acc[t][r] += w[r][4 * c] * a.x + w[r][4 * c + 1] * a.y + w[r][4 * c + 2] * a.z + w[r][4 * c + 3] * a.w;
            }
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

#if defined(LB_CUDA)
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

// y[t][c] (+)= sum over z of part[z][t][c], in split order.
__global__ void qsplit_sum_kernel(const float* __restrict__ part, int splits, int n, int out, float* __restrict__ y,
                                  int ldy, bool accumulate) {
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
            gpuStream_t s, bool gemv32) {
    const unsigned gemv_blocks = unsigned((out + kGemvWarps * kRowsPerWarp - 1) / (kGemvWarps * kRowsPerWarp));
#if defined(LB_CUDA)
    if (n > kQuantGemvMax) {
        const int tiles = ((out + QN - 1) / QN) * ((n + QM - 1) / QM), ksteps_all = in / QKS;
        // Split-K while the tiles leave multiprocessors idle (>= 4 K steps a split); the partials need scratch,
        // which is refused during graph capture (then one split).
        int splits = std::min({(4 * context().sms + tiles - 1) / tiles, ksteps_all / 4, 16});
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
        if (gemv32 && T != kWT && in % 32 == 0) {
            switch (m) {
                case 1: qgemv32_kernel<T, 1><<<gemv_blocks, kGemvWarps * 32, 0, s>>>(xt, in, W, out, yt, ldy, accumulate); break;
                case 2: qgemv32_kernel<T, 2><<<gemv_blocks, kGemvWarps * 32, 0, s>>>(xt, in, W, out, yt, ldy, accumulate); break;
                case 3: qgemv32_kernel<T, 3><<<gemv_blocks, kGemvWarps * 32, 0, s>>>(xt, in, W, out, yt, ldy, accumulate); break;
                default: qgemv32_kernel<T, 4><<<gemv_blocks, kGemvWarps * 32, 0, s>>>(xt, in, W, out, yt, ldy, accumulate); break;
            }
            continue;
        }
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

// y[t][(j * nk + kh) * ph + e] = x[t][(kh * r + j) * ph + e]: value heads grouped -> tiled.
__global__ void heads_to_tiled_kernel(const float* __restrict__ x, int nk, int r, int ph, float* __restrict__ y) {
    const int width = nk * r * ph;
    const float* xt = x + size_t(blockIdx.x) * width;
    float* yt = y + size_t(blockIdx.x) * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        const int head = i / ph, e = i % ph, j = head / nk, kh = head % nk;
        yt[i] = xt[(kh * r + j) * ph + e];
    }
}

}  // namespace

bool quant_type_ok(DType t) {
    return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K || t == DType::Q8_0 || t == DType::Q4_0;
}

void matmul_quant(const float* x, int n, int in, const void* W, DType t, int out, float* y, int ldy, bool accumulate,
                  gpuStream_t s, int gemv) {
    const bool g32 = gemv == 32 || (gemv == 0 && tuning().qgemv32);
    if (in % 8 != 0 || (t != kWT && in % int(dtype_block_elems(t)) != 0) || (n > kQuantGemvMax && in % 64 != 0))
        fail("unsupported", std::string("matmul_quant: ") + dtype_name(t) + " rows of " + std::to_string(in) +
                                " elements (needs whole blocks, a multiple of 64 above " +
                                std::to_string(kQuantGemvMax) + " rows)");
    const uint8_t* w = (const uint8_t*)W;
    switch (t) {
        case DType::Q4_K: return launch<DType::Q4_K>(x, n, in, w, out, y, ldy, accumulate, s, g32);
        case DType::Q5_K: return launch<DType::Q5_K>(x, n, in, w, out, y, ldy, accumulate, s, g32);
        case DType::Q6_K: return launch<DType::Q6_K>(x, n, in, w, out, y, ldy, accumulate, s, g32);
        case DType::Q8_0: return launch<DType::Q8_0>(x, n, in, w, out, y, ldy, accumulate, s, g32);
        case DType::Q4_0: return launch<DType::Q4_0>(x, n, in, w, out, y, ldy, accumulate, s, g32);
        default:
            if (t == kWT) return launch<kWT>(x, n, in, w, out, y, ldy, accumulate, s, false);
            fail("unsupported", std::string("matmul_quant: element type ") + dtype_name(t));
    }
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
    heads_to_tiled_kernel<<<n, 256, 0, s>>>(x, nk, nv / nk, per_head, y);
}

}  // namespace lb::gpu
