// y (=|+=) x W^T: a GEMV for up to 8 tokens, the tensor-core GEMM above (gemm_tc.cu; the fp16 build for
// sm_75 keeps a wmma GEMM here). CPU reference: ../cpu/matmul.cpp.
#include "common.cuh"

namespace lb::gpu {

namespace {

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

#if defined(LB_CUDA) && defined(LB_GPU_FP16)
// The fp16 build (sm_75: no bf16 mma, no cp.async): a wmma GEMM. Tensor-core GEMM: 64x64 output tile per block of 4 warps (2x2 warps of 32x32), K step 32. The fp32
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
__global__ __launch_bounds__(128) void gemm_vec_kernel(const float* __restrict__ x, int n, int in,
                                                        const wtype* __restrict__ W, int out, float* __restrict__ y,
                                                        bool accumulate) {
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
    const int kt0 = 0, nk = (in + TK - 1) / TK;
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
    for (int e = tid; e < TM * TN; e += blockDim.x) {
        const int r = e / TN, cc = e % TN;
        const int gm = m0 + r, gn = n0 + cc;
        if (gm < n && gn < out) {
            float* dst = y + size_t(gm) * out + gn;
            *dst = accumulate ? *dst + Cs[r][cc] : Cs[r][cc];
        }
    }
}

#endif


}  // namespace

void matmul(const float* x, int n, int in, const wtype* W, int out, float* y, bool accumulate, gpuStream_t s) {
    const int warps = 8;
    const dim3 grid((out + warps - 1) / warps);
#if defined(LB_CUDA) && !defined(LB_GPU_FP16)
    // gemm_tc refuses only when its scratch is refused (graph capture): then GEMV groups, as HIP
    if (n > 8 && gemm_tc(x, n, in, W, kWtypeDType, out, y, out, accumulate, s)) return;
#elif defined(LB_CUDA)
    if (n > 8) {
        const dim3 g2((out + TN - 1) / TN, (n + TM - 1) / TM);
        if (in % 8 == 0) gemm_vec_kernel<<<g2, 128, 0, s>>>(x, n, in, W, out, y, accumulate);
        else gemm_kernel<<<g2, 128, 0, s>>>(x, n, in, W, out, y, accumulate);
        return;
    }
#endif
    if (n > 8) {  // HIP: GEMV over groups of 8 tokens (a rocWMMA GEMM is future work)
        for (int t0 = 0; t0 < n; t0 += 8) {
            const int m = std::min(8, n - t0);
            if (m < 8) { matmul(x + size_t(t0) * in, m, in, W, out, y + size_t(t0) * out, accumulate, s); continue; }
            gemv_kernel<8><<<grid, warps * LB_WARP, 0, s>>>(x + size_t(t0) * in, in, W, out, y + size_t(t0) * out, accumulate);
        }
        return;
    }
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

}  // namespace lb::gpu
