// cluster_probe.cu - what the megakernel's MLP reduction costs, and whether thread block clusters make it cheaper.
//
// The fused MLP ends with every block adding its share of all 1,024 outputs into a 64-bit fixed-point accumulator
// (1,024 REDs a block, 135K a layer on 132 SMs), then a grid barrier, then every block reading the 1,024 sums (the
// next stage's prologue). This probe runs that step alone, many times in one persistent launch, in three forms:
//   none      the barrier and the read only (no REDs): the floor of the link;
//   flat      1,024 REDs a block, as the megakernel does;
//   cluster   clusters of C blocks first sum their C partial vectors through distributed shared memory
//             (barrier.cluster, then each block reads its 1/C of the columns from all C blocks' shared memory) and
//             each block adds only its 1,024/C sums: C times fewer REDs, same integer total (deterministic).
// It also reports whether a cooperative launch accepts a cluster dimension and how many clusters fit at once.
//
// Usage: cluster_probe [iterations]   (table to stdout). Needs sm_90.
#include <cooperative_groups.h>

#include "probe_common.cuh"

namespace cg = cooperative_groups;

constexpr int THREADS = 512, H = 1024;

__device__ __forceinline__ unsigned long long to_fix(float v) { return (unsigned long long)__float2ll_rn(v * 4294967296.f); }

// mode 0 none, 1 flat, 2 cluster. acc: [2][H] fixed-point halves (layer parity), bar: monotonic arrival counter.
__global__ void __launch_bounds__(THREADS, 1) reduce_kernel(int mode, int iters, unsigned long long* acc, unsigned* bar,
                                                            float* sink, long long* cycles) {
  __shared__ float part[H];
  __shared__ float red[THREADS / 32];
  cg::cluster_group cluster = cg::this_cluster();
  const unsigned C = cluster.num_blocks(), rank = cluster.block_rank();
  const int t = threadIdx.x;
  float carry = 0.f;
  const long long t0 = clock64();
  for (int it = 0; it < iters; ++it) {
    unsigned long long* cur = acc + (it & 1) * H;
    unsigned long long* prev = acc + ((it + 1) & 1) * H;
    for (int i = t; i < H; i += THREADS) part[i] = 1e-3f * float((blockIdx.x + i + it) & 63) + carry * 1e-9f;
    if (mode == 2) {
      cluster.sync();  // every block's partial written (release/acquire at cluster scope)
      const int per = H / C, c0 = rank * per;
      for (int i = t; i < per; i += THREADS) {
        float v = 0.f;
        for (unsigned r = 0; r < C; ++r) v += cluster.map_shared_rank(part, r)[c0 + i];  // fixed order
        atomicAdd(cur + c0 + i, to_fix(v));
      }
    } else {
      __syncthreads();
      if (mode == 1)
        for (int i = t; i < H; i += THREADS) atomicAdd(cur + i, to_fix(part[i]));
    }
    // the megakernel's grid barrier (kind 2): csync, release add, acquire poll by thread 0
    __syncthreads();
    if (t == 0) {
      red_release_add(bar, 1u);
      const unsigned target = (unsigned)(it + 1) * gridDim.x;
      while ((int)(ld_acquire(bar) - target) < 0) {}
    }
    __syncthreads();
    // the next stage's prologue: all H sums (one round trip), reduced in the block; this block's rows of the other
    // half cleared for the iteration after next (as the megakernel clears its rows a stage later)
    float s = 0.f;
    for (int i = t; i < H; i += THREADS) s += (float)(long long)__ldcg(cur + i) * 2.3283064e-10f;
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((t & 31) == 0) red[t >> 5] = s;
    __syncthreads();
    if (t < 32) {
      float v = t < THREADS / 32 ? red[t] : 0.f;
      for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (t == 0) red[0] = v;
    }
    __syncthreads();
    carry = red[0];
    const int h0 = H * blockIdx.x / gridDim.x, h1 = H * (blockIdx.x + 1) / gridDim.x;
    for (int i = h0 + t; i < h1; i += THREADS) prev[i] = 0ull;
  }
  if (mode == 2) cluster.sync();  // no block leaves while another may still read its shared memory
  if (t == 0) { sink[blockIdx.x] = carry; if (blockIdx.x == 0) *cycles = clock64() - t0; }
}

int main(int argc, char** argv) {
  const int iters = argc > 1 ? atoi(argv[1]) : 2000;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  int khz = 0;
  CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  printf("device: %s, %d SMs, clock %.0f MHz\n", prop.name, prop.multiProcessorCount, khz / 1e3);
  CK(cudaFuncSetAttribute(reduce_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  unsigned long long* acc;
  unsigned* bar;
  float* sink;
  long long* cycles;
  CK(cudaMalloc(&acc, 2 * H * sizeof(unsigned long long)));
  CK(cudaMalloc(&bar, sizeof(unsigned)));
  CK(cudaMalloc(&sink, 1024 * sizeof(float)));
  CK(cudaMalloc(&cycles, sizeof(long long)));
  printf("%-10s %8s %10s %12s %12s %14s\n", "mode", "cluster", "blocks", "coop+cluster", "us/step", "REDs/step");
  const struct { int mode, C; } cases[] = {{0, 1}, {1, 1}, {2, 2}, {2, 4}, {2, 8}, {1, 1}};
  for (auto cs : cases) {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cs.C; attr[0].val.clusterDim.y = 1; attr[0].val.clusterDim.z = 1;
    attr[1].id = cudaLaunchAttributeCooperative;
    attr[1].val.cooperative = 1;
    cfg.blockDim = dim3(THREADS);
    cfg.gridDim = dim3(cs.C * (prop.multiProcessorCount / cs.C));
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int nclusters = 0;
    CK(cudaOccupancyMaxActiveClusters(&nclusters, reduce_kernel, &cfg));
    const int blocks = std::min(nclusters * cs.C, prop.multiProcessorCount / cs.C * cs.C);
    cfg.gridDim = dim3(blocks);
    cfg.numAttrs = 2;
    CK(cudaMemset(acc, 0, 2 * H * sizeof(unsigned long long)));
    CK(cudaMemset(bar, 0, sizeof(unsigned)));
    cudaError_t e = cudaLaunchKernelEx(&cfg, reduce_kernel, 0, 10, acc, bar, sink, cycles);  // warm-up
    bool coop = e == cudaSuccess;
    if (!coop) {  // report, then run without the cooperative guarantee (the grid still fits: blocks <= clusters x C)
      (void)cudaGetLastError();
      cfg.numAttrs = 1;
      CK(cudaLaunchKernelEx(&cfg, reduce_kernel, 0, 10, acc, bar, sink, cycles));
    }
    CK_LAUNCH();
    std::vector<double> us;
    for (int rep = 0; rep < 7; ++rep) {
      CK(cudaMemset(acc, 0, 2 * H * sizeof(unsigned long long)));
      CK(cudaMemset(bar, 0, sizeof(unsigned)));
      CK(cudaLaunchKernelEx(&cfg, reduce_kernel, cs.mode, iters, acc, bar, sink, cycles));
      CK_LAUNCH();
      long long cyc;
      CK(cudaMemcpy(&cyc, cycles, sizeof cyc, cudaMemcpyDeviceToHost));
      us.push_back(cyc / (khz * 1e-3) / iters);
    }
    const Stats s = stats(us);
    const char* name = cs.mode == 0 ? "none" : cs.mode == 1 ? "flat" : "cluster";
    printf("%-10s %8d %10d %12s %8.3f [%.3f, %.3f] %10d\n", name, cs.C, blocks, coop ? "yes" : "NO", s.med, s.p10,
           s.p90, cs.mode == 0 ? 0 : blocks * H / (cs.mode == 2 ? cs.C : 1));
  }
  return 0;
}
