// What the kernel files of this folder share: the device helpers (warp and block sums, PDL, cp.async, KV
// cache element access, RoPE, fixed-point reads) and the host side's launch helpers and device state
// (device.cu). Each kernel file mirrors one file of ../cpu/, the CPU reference it is checked against
// (engines/tests/gpu_op_check.cu).
#pragma once
#include <algorithm>
#include <cfloat>
#include <cstdlib>
#include <type_traits>
#include <utility>
#include <vector>

#include "../tuning.h"
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
#pragma unroll 1  // machine code is time in a kernel run once a layer (docs/archive/engines-tuning-record.md)
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
// Element i of the head row x rotated back from position pos (RoPE at -pos, the inverse rotation): dims past
// rot pass through. Reads x[i] and its pair, writes nothing, so each thread can take its own dims.
__device__ __forceinline__ float rope_inverse(const float* x, int i, int rot, float theta, float pos) {
    const int half = rot / 2;
    if (i >= rot) return x[i];
    float sn, cs;
    sincosf(pos * rope_inv_freq(i < half ? i : i - half, rot, theta), &sn, &cs);
    return i < half ? x[i] * cs + x[i + half] * sn : x[i] * cs - x[i - half] * sn;
}

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

}  // namespace

// ----------------------------------------------------------------------------------------- host side

// The bound context's decode limits (gpu_ops.h, DeviceContext).
inline DecodeCfg& dec() { return context().dec; }

// The most dynamic shared memory a block may opt into (the bound context's device).
inline int smem_optin_limit() { return context().smem_optin; }
// Whether the attention kernels built for a bf16 K and V cache alone take these cache types.
bool kv_bf16_kernels(DType kt, DType vt);
// decode_setup's share for the fused GEMV's and the fused MLP's kernels (their shared memory limits).
void gemv_fused_setup(const gpuDeviceProp& p);
void mlp_fused_setup(const gpuDeviceProp& p);

// The prefill GEMM (gemm_tc.cu; CUDA bf16 builds): y[t * ldy + c] (=|+=) x[n, in] @ W[out, in]^T, W of type t
// (a GGUF block type, or kWtypeDType for wtype rows). false, nothing launched: its scratch cannot grow (graph
// capture); the caller falls back.
bool gemm_tc(const float* x, int n, int in, const void* W, DType t, int out, float* y, int ldy, bool accumulate,
             gpuStream_t s);
// Split-K count for a prefill GEMM of `tiles` output tiles and `ksteps` K steps: 1 when the tiles give every
// multiprocessor per_sm blocks (or Tuning::gemm_splitk_per_sm is 0), else enough splits for that, each of
// at least min_ksteps steps, at most 8.
int splitk_count(int tiles, int ksteps, int min_ksteps, int per_sm);

namespace {

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
    cfg.numAttrs = dec().pdl ? 1 : 0;
    GPU_CHECK(cudaLaunchKernelEx(&cfg, kernel, KArgs(args)...));
#else
    kernel<<<grid, block, smem, s>>>(KArgs(args)...);
#endif
}

// Launch with `smem` bytes of dynamic shared memory. CUDA kernels must opt in above 48 KB: each kernel's
// limit is raised on its first launch, and again if a later launch needs more.
template <typename... KArgs, typename... Args>
void launch_smem(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, gpuStream_t s, Args... args) {
#if defined(LB_CUDA)
    // The limit is the driver's, per kernel and device, shared by every context on the device: this list
    // mirrors it (kernels of this signature), so it is process-wide too. A per-context copy could lower a
    // limit that another context relies on.
    static std::vector<std::pair<std::pair<void (*)(KArgs...), int>, size_t>> raised;
    const std::pair<void (*)(KArgs...), int> key{kernel, context().device};
    auto it = std::find_if(raised.begin(), raised.end(), [&](const auto& r) { return r.first == key; });
    if (it == raised.end() || it->second < smem) {
        GPU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
        if (it == raised.end()) raised.emplace_back(key, smem);
        else it->second = smem;
    }
#endif
    kernel<<<grid, block, smem, s>>>(KArgs(args)...);
}


}  // namespace

}  // namespace lb::gpu
