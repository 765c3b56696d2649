// RMSNorm and the DeltaNet output's gated RMSNorm. CPU reference: ../cpu/norms.cpp.
#include "common.cuh"

namespace lb::gpu {

namespace {

constexpr int kNormThreads = 256;

// One block a row. PER > 0 (dim <= kNormThreads * PER): a thread's elements are loaded into registers at
// once, so that a row costs one memory round trip instead of one per element of the strided loop (a decode
// step runs 129 of these on a single row, each on the critical path); the sums are the same as the loop's
// (the same elements in the same order, the padding adds 0), so the output is too. PER = 0: the loop.
// Launched with programmatic dependent launch. The gain (a weight: no kernel writes it) is read before the
// wait, while the kernel before finishes. One row (a decode step): the next kernel is let in at once, so that
// its weights stream while this runs. More rows (a verify, a draft block): only once the rows' loads are back:
// in a verify the next kernel is a quantised GEMM whose blocks ask for their first weights at once, and this
// kernel's loads, queued behind that burst, made a 23-row norm 13 us long (CUPTI, 27B, H100), with the GEMM's
// main loop waiting on it anyway.
template <int PER>
__global__ __launch_bounds__(kNormThreads) void rmsnorm_kernel(const float* x, const float* gain, float* y, int dim,
                                                               float eps) {
    const bool early = gridDim.x == 1;
    if (early) griddep_launch();
    const float* xr = x + size_t(blockIdx.x) * dim;
    float* yr = y + size_t(blockIdx.x) * dim;
    float ss = 0;
    if constexpr (PER > 0) {
        float v[PER], gv[PER];
#pragma unroll
        for (int k = 0; k < PER; ++k) {
            const int i = threadIdx.x + kNormThreads * k;
            gv[k] = i < dim ? gain[i] : 0.f;
        }
        griddep_wait();
#pragma unroll
        for (int k = 0; k < PER; ++k) {
            const int i = threadIdx.x + kNormThreads * k;
            v[k] = i < dim ? xr[i] : 0.f;
        }
#pragma unroll
        for (int k = 0; k < PER; ++k) ss += v[k] * v[k];
        const float inv = rsqrtf(block_sum(ss) / dim + eps);
        if (!early) griddep_launch();
#pragma unroll
        for (int k = 0; k < PER; ++k) {
            const int i = threadIdx.x + kNormThreads * k;
            if (i < dim) yr[i] = v[k] * inv * gv[k];
        }
    } else {
        griddep_wait();
        for (int i = threadIdx.x; i < dim; i += kNormThreads) ss += xr[i] * xr[i];
        const float inv = rsqrtf(block_sum(ss) / dim + eps);
        if (!early) griddep_launch();
        for (int i = threadIdx.x; i < dim; i += kNormThreads) yr[i] = xr[i] * inv * gain[i];
    }
}

__global__ void gated_rmsnorm_kernel(const float* x, const float* z, int ldz, const float* gain, float* y, int heads,
                                     int dim, float eps, int tiled_nk) {
    const int t = blockIdx.x / heads, h = blockIdx.x % heads;
    const float* xr = x + size_t(blockIdx.x) * dim;
    const float* zr = z + size_t(t) * ldz + size_t(h) * dim;
    const int r = tiled_nk > 0 ? heads / tiled_nk : 1;
    const int ho = tiled_nk > 0 ? (h % r) * tiled_nk + h / r : h;  // heads_to_tiled's order
    float* yr = y + (size_t(t) * heads + ho) * dim;
    float ss = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    const float inv = rsqrtf(block_sum(ss) / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = gain[i] * (xr[i] * inv) * silu(zr[i]);
}

}  // namespace

void rmsnorm(const float* x, const float* gain, float* y, int rows, int dim, float eps, gpuStream_t s) {
    const dim3 g(rows), b(kNormThreads);
    const int per = (dim + kNormThreads - 1) / kNormThreads;
    if (per <= 4) launch_k(rmsnorm_kernel<4>, g, b, 0, s, x, gain, y, dim, eps);
    else if (per <= 8) launch_k(rmsnorm_kernel<8>, g, b, 0, s, x, gain, y, dim, eps);
    else if (per <= 16) launch_k(rmsnorm_kernel<16>, g, b, 0, s, x, gain, y, dim, eps);
    else if (per <= 24) launch_k(rmsnorm_kernel<24>, g, b, 0, s, x, gain, y, dim, eps);
    else if (per <= 32) launch_k(rmsnorm_kernel<32>, g, b, 0, s, x, gain, y, dim, eps);
    else launch_k(rmsnorm_kernel<0>, g, b, 0, s, x, gain, y, dim, eps);
}

void gated_rmsnorm(const float* x, const float* z, int ldz, const float* gain, float* y, int n, int heads, int dim,
                   float eps, gpuStream_t s, int tiled_nk) {
    if (tiled_nk < 0 || (tiled_nk > 0 && heads % tiled_nk != 0))
        fail("internal", "gated_rmsnorm: the value heads are not a multiple of the key heads of the tiled order");
    gated_rmsnorm_kernel<<<n * heads, 128, 0, s>>>(x, z, ldz, gain, y, heads, dim, eps, tiled_nk);
}

}  // namespace lb::gpu
