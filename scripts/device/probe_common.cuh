// probe_common.cuh - what the device probes (latency_probe.cu, step_floor.cu) share: CUDA error checks, the
// megakernel's streaming weight load, the release/acquire pair its grid barrier uses, percentile stats.
#pragma once
#include <cuda_runtime.h>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <vector>

#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { fprintf(stderr, "CUDA error %s (%s) at %s:%d: %s\n", \
    cudaGetErrorName(e_), cudaGetErrorString(e_), __FILE__, __LINE__, #x); exit(1); } } while (0)
#define CK_LAUNCH() do { CK(cudaGetLastError()); CK(cudaDeviceSynchronize()); } while (0)

// Streaming 16-byte load: read-only path, no L1 allocation. Not volatile so the compiler may batch the loads.
__device__ __forceinline__ uint4 ld_stream(const uint4* p) {
  uint4 v; asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
// Counter polls and arrivals: asm volatile, so the compiler can neither hoist nor merge them.
__device__ __forceinline__ uint32_t ld_acquire(const unsigned* p) { uint32_t v; asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v; }
__device__ __forceinline__ void red_release_add(unsigned* p, uint32_t v) { asm volatile("red.release.gpu.global.add.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory"); }

struct Stats { double med, p10, p90, mean; };
static Stats stats(std::vector<double> v) {
  if (v.empty()) return {0, 0, 0, 0};
  std::sort(v.begin(), v.end());
  auto q = [&](double f) { return v[(size_t)(f * (v.size() - 1) + 0.5)]; };
  return {q(0.5), q(0.1), q(0.9), std::accumulate(v.begin(), v.end(), 0.0) / v.size()};
}
