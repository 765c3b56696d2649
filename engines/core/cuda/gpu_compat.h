// Thin portability layer: the kernels are written once against these names and compile with nvcc
// (CUDA) or hipcc (HIP). Weight element type: bf16 on GPUs with bf16 tensor cores (sm_80+, CDNA),
// fp16 on older NVIDIA GPUs (sm_75: LB_GPU_FP16, set by CMake).
#pragma once
#include <cstdio>
#include <string>

#include "../errors.h"

#if defined(__HIPCC__) || defined(LB_USE_HIP)
#include <hip/hip_fp16.h>
#include <hip/hip_runtime.h>
#if __has_include(<hip/hip_bf16.h>)
#include <hip/hip_bf16.h>
#define LB_HIP_BF16 __hip_bfloat16
#else  // older HIP (Debian 12's 5.2): only the hip_bfloat16 class (explicit from float, operator float)
#include <hip/hip_bfloat16.h>
#define LB_HIP_BF16 hip_bfloat16
#define LB_HIP_OLD_BF16 1
#endif
#define gpuError_t hipError_t
#define gpuSuccess hipSuccess
#define gpuGetErrorString hipGetErrorString
#define gpuGetLastError hipGetLastError
#define gpuMalloc hipMalloc
#define gpuFree hipFree
#define gpuMemcpy hipMemcpy
#define gpuMemcpyAsync hipMemcpyAsync
#define gpuMemset hipMemset
#define gpuMemsetAsync hipMemsetAsync
#define gpuMemcpyHostToDevice hipMemcpyHostToDevice
#define gpuMemcpyDeviceToHost hipMemcpyDeviceToHost
#define gpuMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define gpuStream_t hipStream_t
#define gpuStreamCreate hipStreamCreate
#define gpuStreamDestroy hipStreamDestroy
#define gpuStreamSynchronize hipStreamSynchronize
#define gpuEvent_t hipEvent_t
#define gpuEventCreate hipEventCreate
#define gpuEventRecord hipEventRecord
#define gpuEventSynchronize hipEventSynchronize
#define gpuEventElapsedTime hipEventElapsedTime
#define gpuEventDestroy hipEventDestroy
#define gpuMallocHost(p, n) hipHostMalloc(p, n, 0)
#define gpuFreeHost hipHostFree
#define gpuSetDevice hipSetDevice
#define gpuGetDeviceProperties hipGetDeviceProperties
#define gpuDeviceProp hipDeviceProp_t
#define gpuMemGetInfo hipMemGetInfo
#define gpuGraph_t hipGraph_t
#define gpuGraphExec_t hipGraphExec_t
#define gpuStreamBeginCapture hipStreamBeginCapture
#define gpuStreamEndCapture hipStreamEndCapture
#define gpuStreamCaptureModeThreadLocal hipStreamCaptureModeThreadLocal
#define gpuGraphInstantiate(exec, graph) hipGraphInstantiate(exec, graph, nullptr, nullptr, 0)
#define gpuGraphLaunch hipGraphLaunch
#define gpuGraphDestroy hipGraphDestroy
#define gpuGraphExecDestroy hipGraphExecDestroy
#define LB_GPU_NAME "hip"
// Wavefront size: 64 on GCN/CDNA (gfx9), 32 on RDNA (gfx10 and newer, the compiler's default there). Host
// and device code must agree, so CMake passes LB_HIP_WARP for the target list; the device pass checks it.
#if !defined(LB_HIP_WARP)
#define LB_HIP_WARP 64
#endif
#define LB_WARP LB_HIP_WARP
#if defined(__HIP_DEVICE_COMPILE__) && defined(__AMDGCN_WAVEFRONT_SIZE) && __AMDGCN_WAVEFRONT_SIZE != LB_HIP_WARP
#error "LB_HIP_WARP differs from the target's wavefront size (gfx9: 64, gfx10+: 32)"
#endif
// HIP before 6.2 has no *_sync warp functions (later ones want a 64-bit mask); every use in the kernels has
// the whole warp taking part, so the mask is dropped.
#define __shfl_sync(mask, ...) __shfl(__VA_ARGS__)
#define __shfl_xor_sync(mask, ...) __shfl_xor(__VA_ARGS__)
#define __shfl_down_sync(mask, ...) __shfl_down(__VA_ARGS__)
#define __shfl_up_sync(mask, ...) __shfl_up(__VA_ARGS__)
#define __syncwarp(...) ::lb::gpu::hip_syncwarp()
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#define gpuError_t cudaError_t
#define gpuSuccess cudaSuccess
#define gpuGetErrorString cudaGetErrorString
#define gpuGetLastError cudaGetLastError
#define gpuMalloc cudaMalloc
#define gpuFree cudaFree
#define gpuMemcpy cudaMemcpy
#define gpuMemcpyAsync cudaMemcpyAsync
#define gpuMemset cudaMemset
#define gpuMemsetAsync cudaMemsetAsync
#define gpuMemcpyHostToDevice cudaMemcpyHostToDevice
#define gpuMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define gpuMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define gpuStream_t cudaStream_t
#define gpuStreamCreate cudaStreamCreate
#define gpuStreamDestroy cudaStreamDestroy
#define gpuStreamSynchronize cudaStreamSynchronize
#define gpuEvent_t cudaEvent_t
#define gpuEventCreate cudaEventCreate
#define gpuEventRecord cudaEventRecord
#define gpuEventSynchronize cudaEventSynchronize
#define gpuEventElapsedTime cudaEventElapsedTime
#define gpuEventDestroy cudaEventDestroy
#define gpuMallocHost cudaMallocHost
#define gpuFreeHost cudaFreeHost
#define gpuSetDevice cudaSetDevice
#define gpuGetDeviceProperties cudaGetDeviceProperties
#define gpuDeviceProp cudaDeviceProp
#define gpuMemGetInfo cudaMemGetInfo
#define gpuGraph_t cudaGraph_t
#define gpuGraphExec_t cudaGraphExec_t
#define gpuStreamBeginCapture cudaStreamBeginCapture
#define gpuStreamEndCapture cudaStreamEndCapture
#define gpuStreamCaptureModeThreadLocal cudaStreamCaptureModeThreadLocal
#define gpuGraphInstantiate(exec, graph) cudaGraphInstantiate(exec, graph, 0)
#define gpuGraphLaunch cudaGraphLaunch
#define gpuGraphDestroy cudaGraphDestroy
#define gpuGraphExecDestroy cudaGraphExecDestroy
#define LB_GPU_NAME "cuda"
#define LB_WARP 32
#endif

namespace lb::gpu {

#if defined(__HIPCC__) || defined(LB_USE_HIP)
// __syncwarp: order the wavefront's memory accesses (lanes of a wavefront run in lock step).
__device__ __forceinline__ void hip_syncwarp() {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
    __builtin_amdgcn_wave_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
}
#endif

// A 32-bit load with acquire semantics at device scope: what another block released (red.release, or a
// fence then an atomic) before the value it reads is visible after it. For counters polled across blocks.
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
#if defined(__HIPCC__) || defined(LB_USE_HIP)
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#else
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
#endif
}

#if defined(LB_GPU_FP16)
using wtype = __half;
inline __host__ __device__ float w2f(wtype v) { return __half2float(v); }
#define LB_WTYPE_NAME "f16"
#else
#if defined(__HIPCC__) || defined(LB_USE_HIP)
using wtype = LB_HIP_BF16;
#else
using wtype = __nv_bfloat16;
#endif
#if defined(LB_HIP_OLD_BF16)
inline __device__ float w2f(wtype v) { return float(v); }
#else
inline __device__ float w2f(wtype v) { return __bfloat162float(v); }
#endif
#define LB_WTYPE_NAME "bf16"
#endif

inline void check(gpuError_t err, const char* what) {
    if (err == gpuSuccess) return;
    std::string msg = std::string(what) + ": " + gpuGetErrorString(err);
    if (err == (gpuError_t)2 /* out of memory in both runtimes */) lb::fail("oom", msg);
    lb::fail("internal", msg);
}

}  // namespace lb::gpu

#define GPU_CHECK(call) ::lb::gpu::check((call), #call)
