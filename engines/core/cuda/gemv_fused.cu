// The one-token GEMV of the decode graph with its prologues (RMSNorm, gated norm, SiLU-mul) and epilogues
// (add, conv + SiLU, argmax). CPU reference: compositions of ../cpu/ (tests: gpu_op_check).
#include "common.cuh"

namespace lb::gpu {

namespace {

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
    // 128-byte aligned: xs then starts at shared offset 0x100, after block_sum's arrays, the layout this
    // kernel was timed with (16 would move it to 0x90 and change the machine code)
    extern __shared__ __align__(128) unsigned char gv_smem[];
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

size_t gv_xs_bytes(int in) { return ((size_t(in) * 4 + 15) / 16) * 16; }

}  // namespace

void gemv_fused_setup(const gpuDeviceProp& p) {
#if defined(LB_CUDA)
    void (*kernels[])(FusedGemv, int, int, int) = {
        gemv_fused_kernel<GV_PLAIN, GV_STORE>,    gemv_fused_kernel<GV_PLAIN, GV_ADD>,
        gemv_fused_kernel<GV_RMSNORM, GV_STORE>,  gemv_fused_kernel<GV_RMSNORM, GV_CONV>,
        gemv_fused_kernel<GV_RMSNORM, GV_ARGMAX>, gemv_fused_kernel<GV_GATED, GV_ADD>,
        gemv_fused_kernel<GV_SILU, GV_ADD>};
    for (auto k : kernels) {
        cudaFuncAttributes fa;
        GPU_CHECK(cudaFuncGetAttributes(&fa, k));
        dec().smem_block = std::min(dec().smem_block, size_t(p.sharedMemPerBlockOptin) - fa.sharedSizeBytes);
    }
    for (auto k : kernels)
        GPU_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(dec().smem_block)));
#else
    (void)p;
#endif
}

bool gemv_fused_ok(int in, int pro, int head_dim) {
    if (in % 8 != 0 || in <= 0) return false;
    // GATED: each thread takes whole 8-element chunks and every pass covers all threads (in % (8 GV_THREADS)
    // == 0; whole warps, in % 256, would be enough for the shuffles), each head's chunks within one warp
    // (head_dim / 8 divides 32)
    if (pro == GV_GATED && (head_dim <= 0 || head_dim % 8 != 0 || 32 % (head_dim / 8) != 0 || in % head_dim != 0 ||
                            in % (8 * GV_THREADS) != 0 || in / head_dim > GV_MAX_HEADS))
        return false;
    // the input vector plus at least GV_STAGES tiles of one row
    return gv_xs_bytes(in) + size_t(GV_STAGES) * in * sizeof(wtype) + 1024 <= dec().smem_block;
}

void gemv_fused(const FusedGemv& a, gpuStream_t s) {
    if (!dec().ready) lb::fail("internal", "decode_setup not called");
    if (!gemv_fused_ok(a.in, a.pro, a.head_dim)) lb::fail("internal", "gemv_fused: unsupported shape");
    const size_t row_bytes = size_t(a.in) * sizeof(wtype), xs = gv_xs_bytes(a.in);
    // Tiles of about 16 KB (3 stages in flight per block), capped by the block's shared memory.
    size_t tile = std::min<size_t>(dec().tile, (dec().smem_block - xs - 1024) / GV_STAGES);
    int rb = int(std::max<size_t>(1, tile / row_bytes));
    rb = std::min(rb, a.out);
    const size_t smem = xs + size_t(GV_STAGES) * rb * row_bytes;
    const int ntiles = (a.out + rb - 1) / rb;
    const int per_sm = int(std::max<size_t>(1, std::min<size_t>(dec().max_per_sm, dec().smem_sm / (smem + 1024))));
    auto go = [&](void (*kernel)(FusedGemv, int, int, int)) {
        int fit = per_sm;  // and as many as registers allow: a grid past one wave would run a second wave
#if defined(LB_CUDA)
        GPU_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fit, kernel, GV_THREADS, smem));
#endif
        const int grid = std::min(ntiles, dec().sms * std::max(1, std::min(per_sm, fit)));
        launch_k(kernel, dim3(grid), dim3(GV_THREADS), smem, s, a, rb, ntiles, dec().prewait);
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

}  // namespace lb::gpu
