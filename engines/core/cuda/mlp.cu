// The SwiGLU MLP's GPU pieces: silu_mul (prefill), the fused one-token MLP and the down_proj transpose it
// reads. CPU reference: ../cpu/matmul.cpp and lb::cpu::silu (../cpu/norms.cpp) composed.
#include "common.cuh"

namespace lb::gpu {

namespace {

__global__ void silu_mul_kernel(const float* gu, int n, int I, float* out) {
    const size_t e = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (e >= size_t(n) * I) return;
    const size_t t = e / I, i = e % I;
    out[e] = silu(gu[t * 2 * I + i]) * gu[t * 2 * I + I + i];
}

// Fused MLP for one token (FusedMlp in gpu_ops.h). Block b owns the intermediate rows [r0, r1), n = r1 - r0
// <= rb (the grid splits I evenly). Dynamic shared memory (mlp_smem_bytes): xs [H] floats | gain [H] floats |
// act [rb] floats (padded to 16 bytes) | gate rows [rb][H] | up rows [rb][H] | down_t rows [rb][H].
// 512 threads and x read before the down_t copies are requested: 1,094.5 tok/s against 1,030.1 with 256
// threads and every copy before the wait (one H200, synthetic-weight 0.8B, same card; 256 threads with x
// first 1,066.7, 512 threads without 1,056.8; docs/archive/engines-tuning-record.md).
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
    griddep_wait();  // from here on: x (complete: the out-projection before this kernel folded the previous
                     // MLP's accumulator into it) and acc (zero: that same fold, or embed_decode for layer 0)
    float4 xv[MF_XPER];
#pragma unroll
    for (int k = 0; k < MF_XPER; ++k) {
        const int i = (tid + k * MF_THREADS) * 4;
        xv[k] = i < H ? *(const float4*)(a.x + i) : make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < H) add_fix4(xv[k], a.x_acc, i);  // a fused DeltaNet layer's mixer output (delta_out)
    }
    copy_to_smem<MF_THREADS>((uint4*)wd, (const uint4*)(a.down_t + size_t(r0) * H), nch);
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

}  // namespace

void silu_mul(const float* gu, int n, int I, float* out, gpuStream_t s) {
    const size_t total = size_t(n) * I;
    silu_mul_kernel<<<unsigned((total + 255) / 256), 256, 0, s>>>(gu, n, I, out);
}

namespace {
// mlp_fused_kernel's dynamic shared memory for rb intermediate rows a block
size_t mlp_smem_bytes(int H, int rb) {
    return size_t(H) * 8 + size_t((rb + 3) / 4) * 16 + 3 * size_t(rb) * H * sizeof(wtype);
}
}  // namespace

void mlp_fused_setup(const gpuDeviceProp& p) {
#if defined(LB_CUDA)
    cudaFuncAttributes fa;
    GPU_CHECK(cudaFuncGetAttributes(&fa, mlp_fused_kernel));
    dec().mlp_static = fa.sharedSizeBytes;
    dec().mlp_smem_block = size_t(p.sharedMemPerBlockOptin) - fa.sharedSizeBytes;
    GPU_CHECK(cudaFuncSetAttribute(mlp_fused_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   int(dec().mlp_smem_block)));
#else
    dec().mlp_static = 1024;  // room for the kernel's static arrays (block_sum)
    dec().mlp_smem_block = p.sharedMemPerBlock > dec().mlp_static ? p.sharedMemPerBlock - dec().mlp_static : 0;
#endif
}

bool mlp_fused_ok(int H, int I) {
    return dec().ready && H > 0 && I > 0 && H % 8 == 0 && H <= 4 * MF_THREADS * MF_XPER &&
           mlp_smem_bytes(H, 1) <= dec().mlp_smem_block;
}

void mlp_fused(const FusedMlp& a, gpuStream_t s) {
    if (!mlp_fused_ok(a.H, a.I) || !a.acc) lb::fail("internal", "mlp_fused: unsupported shape");
    // Tuning::mlp_blocks_per_sm: blocks a multiprocessor to aim for (default 1: 978 tok/s against 944 with 2 on an
    // H200, half the atomics; docs/archive/engines-tuning-record.md). The I rows are split over sms * per_sm blocks, as
    // long as per_sm blocks' rows fit in a multiprocessor's shared memory (the runtime keeps 1 KB a block);
    // where they do not (smaller GPUs, larger models), fewer rows a block and more blocks, which then run in
    // waves. H200, 0.8B: 28 rows, 128 blocks of 176 KB, one wave.
    const int want = tuning().mlp_blocks_per_sm;
    int rb = 0;
    for (int per = want; per >= 1 && rb == 0; --per) {
        const size_t share = dec().smem_sm / size_t(per);
        if (share <= 1024 + dec().mlp_static) continue;
        const size_t cap = std::min(dec().mlp_smem_block, share - 1024 - dec().mlp_static);
        int r = (a.I + dec().sms * per - 1) / (dec().sms * per);
        while (r > 0 && mlp_smem_bytes(a.H, r) > cap) --r;
        rb = r;
    }
    rb = std::max(rb, 1);  // one row a block fits (mlp_fused_ok)
    const int grid = (a.I + rb - 1) / rb;  // then every block's share, I * (b + 1) / grid - I * b / grid, <= rb
    launch_k(mlp_fused_kernel, dim3(grid), dim3(MF_THREADS), mlp_smem_bytes(a.H, rb), s, a, rb);
}

void transpose(const wtype* in, int rows, int cols, wtype* out, gpuStream_t s) {
    static_assert(sizeof(wtype) == 2, "transpose16_kernel moves 2-byte elements");
    transpose16_kernel<<<dim3(unsigned((cols + 31) / 32), unsigned((rows + 31) / 32)), dim3(32, 8), 0, s>>>(
        (const unsigned short*)in, rows, cols, (unsigned short*)out);
    GPU_CHECK(gpuGetLastError());
}

}  // namespace lb::gpu
