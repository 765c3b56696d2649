// RMSNorm and the DeltaNet output's gated RMSNorm. CPU reference: ../cpu/norms.cpp.
#include "common.cuh"

namespace lb::gpu {

namespace {

__global__ void rmsnorm_kernel(const float* x, const float* gain, float* y, int dim, float eps) {
    const float* xr = x + size_t(blockIdx.x) * dim;
    float* yr = y + size_t(blockIdx.x) * dim;
    float ss = 0;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += xr[i] * xr[i];
    const float inv = rsqrtf(block_sum(ss) / dim + eps);
    for (int i = threadIdx.x; i < dim; i += blockDim.x) yr[i] = xr[i] * inv * gain[i];
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

}  // namespace

void rmsnorm(const float* x, const float* gain, float* y, int rows, int dim, float eps, gpuStream_t s) {
    rmsnorm_kernel<<<rows, 256, 0, s>>>(x, gain, y, dim, eps);
}

void gated_rmsnorm(const float* x, const float* z, int ldz, const float* gain, float* y, int n, int heads, int dim,
                   float eps, gpuStream_t s) {
    gated_rmsnorm_kernel<<<n * heads, 128, 0, s>>>(x, z, ldz, gain, y, heads, dim, eps);
}

}  // namespace lb::gpu
