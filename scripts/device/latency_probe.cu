// latency_probe.cu - latency floors that bound batch-1 LLM decode on one GPU (written for H200, sm_90).
//
// A persistent decode megakernel streams weights from DRAM and, between stages, waits on grid barriers
// and reads small vectors that other blocks just wrote (L2 hits). This program measures:
//   A. idle latency of one dependent load: L2 hit, DRAM miss (pointer chase, one thread);
//   B. grid barrier cost (monotonic counter, cooperative launch), alone and with a vector exchange;
//   C. kernel boundary cost inside a CUDA graph, plain vs programmatic dependent launch (PDL);
//   D. latency of a dependent L2-hit load while the other SMs stream DRAM with a chosen amount in flight;
//   E. the same with the stream done by TMA bulk copies into shared memory (a weight-staging design).
// Usage: latency_probe [out.json]   (the table goes to stdout). Needs only the CUDA runtime.
#include <random>

#include "probe_common.cuh"

constexpr int MAX_HOPS = 4096;             // per-hop timestamps kept in shared memory (16 KB)
constexpr int PROBE_HOPS = 2000;           // recorded hops of the probe-D prober
constexpr int THREADS = 512;               // block size of probes B and D
constexpr uint32_t TMA_CHUNK = 16384;      // bytes per cp.async.bulk copy in probe E
constexpr int TMA_MAX_SLOTS = 8;           // ring of up to 8 x 16 KB = 128 KB per SM
// Probe D/E dynamic smem: hop log + TMA ring = 144 KB, more than half an SM's 228 KB, so 1 block per SM.
constexpr size_t PROBE_SMEM = MAX_HOPS * 4 + TMA_MAX_SLOTS * TMA_CHUNK;
constexpr uint64_t DEADLINE_NS = 200000000ull;  // streamers stop after 200 ms even if the done flag never comes

// ---------------------------------------------------------------- PTX helpers
__device__ __forceinline__ uint64_t gtimer() { uint64_t t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ uint32_t clock32() { uint32_t c; asm volatile("mov.u32 %0, %%clock;" : "=r"(c)); return c; }
// L2-only load (skips L1): every hop of a chase is a real L2 (or DRAM) access.
__device__ __forceinline__ uint64_t ld_cg(uint64_t a) { uint64_t v; asm volatile("ld.global.cg.u64 %0, [%1];" : "=l"(v) : "l"(a) : "memory"); return v; }
// Flag polls are asm volatile loads, so the compiler can neither hoist nor merge them.
__device__ __forceinline__ uint32_t ld_relaxed(const unsigned* p) { uint32_t v; asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v; }
__device__ __forceinline__ void st_release(unsigned* p, uint32_t v) { asm volatile("st.release.gpu.global.u32 [%0], %1;" :: "l"(p), "r"(v) : "memory"); }
__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t* m, uint32_t n) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_u32(m)), "r"(n) : "memory"); }
__device__ __forceinline__ void mbar_expect_tx(uint64_t* m, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(smem_u32(m)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* m, uint32_t parity) {
  uint32_t ok = 0;
  while (!ok) asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                           : "=r"(ok) : "r"(smem_u32(m)), "r"(parity) : "memory");
}
__device__ __forceinline__ void tma_load(void* dst, const void* src, uint32_t bytes, uint64_t* m) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(m)) : "memory");
}

// ---------------------------------------------------------------- pointer chase (probes A and D)
// Each node's first 8 bytes hold the address of the next node. Delta i spans exactly one load wait: the
// clock is read right after load i issues, and load i+1 cannot issue before load i returns. dt[0] has no
// wait in it; the host drops it. The delta includes ~10-20 cycles of loop/clock overhead.
__device__ __forceinline__ uint64_t chase(uint64_t p, int hops, uint32_t* dt) {
  uint32_t prev = clock32();
  for (int i = 0; i < hops; ++i) {
    p = ld_cg(p);
    const uint32_t now = clock32();
    dt[i] = now - prev; prev = now;
  }
  return p;
}

struct ChaseOut { unsigned long long end, ns, cycles; uint32_t dt[MAX_HOPS]; };
struct ProbeOut { ChaseOut chase; unsigned long long bytes, t_start, t_end, sink; uint32_t smid; };

// Records the per-hop deltas in smem, then the wall time (globaltimer) and cycles of the whole run, so the
// host converts cycles to ns with the SM clock that was actually running.
__device__ void timed_chase(uint64_t p, int hops, uint32_t* dt, ChaseOut* out) {
  const uint64_t t0 = gtimer(); const long long c0 = clock64();
  p = chase(p, hops, dt);
  const uint64_t t1 = gtimer(); const long long c1 = clock64();
  out->end = p; out->ns = t1 - t0; out->cycles = (unsigned long long)(c1 - c0);
  for (int i = 0; i < hops; ++i) out->dt[i] = dt[i];
}

__global__ void chase_kernel(uint64_t start, int hops, ChaseOut* out) {
  extern __shared__ uint32_t dt_smem[];
  if (threadIdx.x == 0) timed_chase(start, hops, dt_smem, out);
}

// Node order[k] points to node order[k+1] (cyclically): one random cycle through the chosen lines.
__global__ void build_cycle_kernel(char* base, size_t stride, const uint32_t* order, int n) {
  for (int k = blockIdx.x * blockDim.x + threadIdx.x; k < n; k += gridDim.x * blockDim.x)
    *(uint64_t*)(base + order[k] * stride) = (uint64_t)(base + order[(k + 1) % n] * stride);
}

// Reads `n` uint4 (the host passes 512 MB, >8x the L2) so that nothing chased afterwards is still in L2.
__global__ void l2_flush_kernel(const uint4* p, size_t n, unsigned* sink) {
  uint32_t acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const uint4 v = __ldcg(p + i); acc += v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

// ---------------------------------------------------------------- B: grid barrier
// Monotonic counter: barrier k (1-based) is passed once the counter reaches k * gridDim.x. The counter is
// never reset inside a launch, so no generation flag and no second atomic are needed.
__device__ __forceinline__ void grid_barrier(unsigned* counter, unsigned& target) {
  __syncthreads();
  target += gridDim.x;
  if (threadIdx.x == 0) {
    red_release_add(counter, 1);
    while (ld_acquire(counter) < target) {}
  }
  __syncthreads();
}

// exchange=1: before each barrier every block writes 8 floats; after it every block reads 1024 floats
// (written by other blocks, L2 hits, ld.cg) and block-reduces them; the result feeds the next write,
// so each iteration depends on the previous one. Double-buffered by barrier parity, so a fast block
// never overwrites a buffer a slow block is still reading.
__global__ void __launch_bounds__(THREADS) barrier_kernel(unsigned* counter, float* vec, int iters, int exchange,
                                                          unsigned long long* t_out, float* sink) {
  __shared__ float part[THREADS / 32];
  const int nvec = gridDim.x * 8, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  unsigned target = 0;
  float acc = 0.f;
  grid_barrier(counter, target);                 // aligned start
  const uint64_t t0 = gtimer();
  for (int k = 0; k < iters; ++k) {
    float* buf = vec + (k & 1) * nvec;
    if (exchange && threadIdx.x < 8) buf[blockIdx.x * 8 + threadIdx.x] = acc + (float)k;
    grid_barrier(counter, target);
    if (exchange) {
      float s = __ldcg(buf + threadIdx.x % nvec) + __ldcg(buf + (threadIdx.x + THREADS) % nvec);
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (lane == 0) part[warp] = s;
      __syncthreads();
      acc = 0.f;
      for (int w = 0; w < THREADS / 32; ++w) acc += part[w];
    }                                            // next write of part[] is behind grid_barrier's __syncthreads
  }
  const uint64_t t1 = gtimer();
  if (blockIdx.x == 0 && threadIdx.x == 0) *t_out = t1 - t0;
  if (threadIdx.x == 0) sink[blockIdx.x] = acc;
}

// ---------------------------------------------------------------- C: kernel boundary
// Kernel i reads a value another block wrote in kernel i-1 and writes value+1. After N kernels from zeros,
// every element equals N, which checks that the chain was really ordered.
template <bool PDL>
__global__ void chain_kernel(unsigned* data, int n, int i) {
  if (PDL) {
    asm volatile("griddepcontrol.launch_dependents;");   // let kernel i+1 get launched and wait on us early
    asm volatile("griddepcontrol.wait;" ::: "memory");     // kernel i-1 has finished and its writes are visible
  }
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned v = __ldcg(data + (i & 1) * n + (idx + 1) % n);
  data[((i + 1) & 1) * n + idx] = v + 1;
}

// ---------------------------------------------------------------- D/E: dependent L2 hit under a DRAM stream
struct ProbeArgs {
  uint64_t chase_start; int hops; uint64_t warmup_ns;
  const uint4* stream; size_t stream_bytes;
  int warps, probe_sm_streams, refresh, tma_slots;
  const uint64_t* ring; int ring_n;
  unsigned* done; ProbeOut* out;
};

// Warp of streamers: each iteration issues U independent 16-byte loads per lane (U x 512 B per warp) and
// only then consumes them, so U x 512 B per warp are in flight. The done flag is loaded at the top of an
// iteration (in flight with the stream loads) and tested at the bottom, every 16/U iterations.
template <int U>
__device__ void stream_warp(const ProbeArgs& a, size_t wid, size_t nw) {
  constexpr int POLL = U >= 16 ? 1 : 16 / U;
  const size_t chunk = (size_t)U * 32;                         // uint4 per warp-iteration
  const size_t nch = a.stream_bytes / (chunk * 16);
  const int lane = threadIdx.x & 31;
  size_t c = wid % nch;
  uint32_t acc = 0, stop = 0;
  unsigned long long it = 0;
  const uint64_t t0 = gtimer(), deadline = t0 + DEADLINE_NS;
  for (;;) {
    const bool poll = (++it % POLL) == 0;
    if (poll) stop = ld_relaxed(a.done);
    const uint4* p = a.stream + c * chunk + lane;
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = ld_stream(p + u * 32);
#pragma unroll
    for (int u = 0; u < U; ++u) acc += v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    c += nw; if (c >= nch) c -= nch;                           // wrap: 4 GB is ~70x the L2, so re-reads still miss
    if (poll && (stop || gtimer() > deadline)) break;
  }
  const uint64_t t1 = gtimer();
  if (lane == 0) {
    atomicAdd(&a.out->bytes, it * chunk * 16);
    atomicMin(&a.out->t_start, t0); atomicMax(&a.out->t_end, t1);
  }
  if (acc == 0x9e3779b9u) a.out->sink = acc;                   // keeps the loads alive
}

// One thread per SM keeps `tma_slots` 16 KB bulk copies (DRAM -> this SM's smem) in flight: wait for a
// slot's mbarrier, re-arm it with expect_tx, issue the next chunk. Nobody reads the staged data.
__device__ void tma_streamer(const ProbeArgs& a, unsigned char* ring, size_t brank, size_t nblk) {
  __shared__ uint64_t mbar[TMA_MAX_SLOTS];
  const int S = a.tma_slots;
  const size_t nch = a.stream_bytes / TMA_CHUNK;
  size_t c = brank % nch;
  for (int s = 0; s < S; ++s) mbar_init(&mbar[s], 1);
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  auto issue = [&](int s) {
    mbar_expect_tx(&mbar[s], TMA_CHUNK);
    tma_load(ring + (size_t)s * TMA_CHUNK, (const char*)a.stream + c * TMA_CHUNK, TMA_CHUNK, &mbar[s]);
    c += nblk; if (c >= nch) c -= nch;
  };
  const uint64_t t0 = gtimer(), deadline = t0 + DEADLINE_NS;
  for (int s = 0; s < S; ++s) issue(s);
  uint32_t phase = 0;                                          // bit s = parity slot s waits for next
  unsigned long long bytes = 0;
  int s = 0;
  for (uint32_t n = 1;; ++n) {
    mbar_wait(&mbar[s], (phase >> s) & 1); phase ^= 1u << s; bytes += TMA_CHUNK;
    if ((n & 7) == 0 && (ld_relaxed(a.done) || gtimer() > deadline)) break;
    issue(s); s = (s + 1) % S;
  }
  for (int j = 1; j < S; ++j) {                                // drain: never exit with copies in flight
    const int q = (s + j) % S;
    mbar_wait(&mbar[q], (phase >> q) & 1); bytes += TMA_CHUNK;
  }
  const uint64_t t1 = gtimer();
  atomicAdd(&a.out->bytes, bytes);
  atomicMin(&a.out->t_start, t0); atomicMax(&a.out->t_end, t1);
}

// The last block's warp 15 re-reads the prober's 256 ring lines (ld.cg, 8 loads per lane in flight, one sweep
// per ~L2 latency) until the prober is done. A ~4.7 TB/s stream moves the whole 60 MB L2 in ~13 us, while the
// prober revisits a ring line only every 256 hops; the refresher keeps the lines recently used, standing in
// for "another block just wrote this vector", so the hops stay L2 hits. The rows marked "no refresher" are
// controls: the same ring without it, and a full 8192-line cycle (1 MB) touched once just before the launch.
__device__ void refresher(const ProbeArgs& a) {
  const int lane = threadIdx.x & 31;
  uint64_t addr[8], acc = 0;
  for (int k = 0; k < 8; ++k) addr[k] = a.ring[(lane + 32 * k) % a.ring_n];
  const uint64_t deadline = gtimer() + DEADLINE_NS;
  for (;;) {
    const uint32_t stop = ld_relaxed(a.done);
    uint64_t v[8];
    for (int k = 0; k < 8; ++k) v[k] = ld_cg(addr[k]);
    for (int k = 0; k < 8; ++k) acc += v[k];
    if (stop || gtimer() > deadline) break;
  }
  if (acc == 1) a.out->sink = acc;
}

// Grid = #SMs, 1 block/SM (forced by PROBE_SMEM), cooperative launch so every block is co-resident.
// Block 0 warp 0 lane 0 is the prober; block 0 warps 1..W stream only when probe_sm_streams; blocks 1..
// run W streaming warps (TMA: one issuing thread). The prober chases for warmup_ns first (stream ramps
// up), records `hops` hops, then raises the done flag; streamers stop at the flag or at the deadline.
template <int U, bool TMA>
__global__ void __launch_bounds__(THREADS, 1) stream_probe_kernel(ProbeArgs a) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const bool b0 = blockIdx.x == 0;
  if (b0 && warp == 0) {
    if (lane != 0) return;
    uint32_t* dt = (uint32_t*)smem;
    uint64_t p = a.chase_start;
    const uint64_t tw = gtimer();
    while (gtimer() - tw < a.warmup_ns) p = chase(p, 64, dt);
    timed_chase(p, a.hops, dt, &a.out->chase);
    asm volatile("mov.u32 %0, %%smid;" : "=r"(a.out->smid));    // which SM probed (placement can matter)
    st_release(a.done, 1);
    return;
  }
  if (a.refresh && blockIdx.x == gridDim.x - 1 && warp == THREADS / 32 - 1) { refresher(a); return; }
  if ((U == 0 && !TMA) || (b0 && !a.probe_sm_streams)) return;
  const int first = b0 ? 1 : 0, wl = warp - first;
  const size_t nblk = a.probe_sm_streams ? gridDim.x : gridDim.x - 1;
  const size_t brank = a.probe_sm_streams ? blockIdx.x : blockIdx.x - 1;
  if constexpr (TMA) {
    if (wl == 0 && lane == 0) tma_streamer(a, smem + MAX_HOPS * 4, brank, nblk);
  } else if constexpr (U > 0) {
    if (wl < a.warps) stream_warp<U>(a, brank * a.warps + wl, nblk * a.warps);
  }
}

// ================================================================ host
static void json_stats(FILE* f, const char* pre, const Stats& s) {
  fprintf(f, "\"%s_median\": %.4f, \"%s_p10\": %.4f, \"%s_p90\": %.4f, \"%s_mean\": %.4f",
          pre, s.med, pre, s.p10, pre, s.p90, pre, s.mean);
}
// ns per hop of one chase; dt[0] (no load wait in it) is dropped.
static void hop_ns(const ChaseOut& c, int hops, std::vector<double>& v) {
  const double ns_per_cycle = (double)c.ns / (double)c.cycles;
  for (int i = 1; i < hops; ++i) v.push_back(c.dt[i] * ns_per_cycle);
}

struct Ctx { cudaDeviceProp prop; int sms; uint4* stream; size_t stream_bytes; unsigned* sink; };  // stream: 4 GB

// Builds one random cycle through `n_used` of the `n_total` lines (`stride` apart) at `base`.
// Returns the node addresses in cycle order.
static std::vector<uint64_t> make_cycle(char* base, size_t stride, size_t n_total, size_t n_used, uint32_t seed) {
  std::vector<uint32_t> order(n_total);
  std::iota(order.begin(), order.end(), 0u);
  std::shuffle(order.begin(), order.end(), std::mt19937(seed));
  order.resize(n_used);
  uint32_t* d_order;
  CK(cudaMalloc(&d_order, n_used * 4));
  CK(cudaMemcpy(d_order, order.data(), n_used * 4, cudaMemcpyHostToDevice));
  build_cycle_kernel<<<256, 256>>>(base, stride, d_order, (int)n_used);
  CK_LAUNCH();
  CK(cudaFree(d_order));
  std::vector<uint64_t> addr(n_used);
  for (size_t k = 0; k < n_used; ++k) addr[k] = (uint64_t)(base + order[k] * stride);
  return addr;
}

static void l2_flush(Ctx& x) { l2_flush_kernel<<<x.sms * 4, 512>>>(x.stream, (512ull << 20) / 16, x.sink); CK_LAUNCH(); }

// Runs `reps` chases of `hops` hops (after `warm` unrecorded ones), continuing along the cycle.
static Stats idle_chase(Ctx& x, uint64_t start, int warm, int reps, bool flush, double* mhz) {
  ChaseOut* d_out; CK(cudaMalloc(&d_out, sizeof(ChaseOut)));
  static ChaseOut h;
  std::vector<double> v;
  uint64_t p = start;
  for (int r = 0; r < warm + reps; ++r) {
    if (flush) l2_flush(x);
    chase_kernel<<<1, 32, MAX_HOPS * 4>>>(p, MAX_HOPS, d_out);
    CK_LAUNCH();
    CK(cudaMemcpy(&h, d_out, sizeof(h), cudaMemcpyDeviceToHost));
    p = h.end;
    if (r >= warm) hop_ns(h, MAX_HOPS, v);
    if (mhz) *mhz = 1e3 * (double)h.cycles / (double)h.ns;
  }
  CK(cudaFree(d_out));
  return stats(v);
}

static void probe_idle(Ctx& x, FILE* js) {
  double mhz = 0;
  char* l2buf; CK(cudaMalloc(&l2buf, 2u << 20));                 // 2 MB, 16384 lines of 128 B
  auto l2c = make_cycle(l2buf, 128, (2u << 20) / 128, (2u << 20) / 128, 1);
  const Stats l2 = idle_chase(x, l2c[0], 4, 5, false, &mhz);     // 4 warm passes touch every line
  CK(cudaFree(l2buf));
  char* dbuf; CK(cudaMalloc(&dbuf, 2ull << 30));                  // 2 GB, 4 KB stride: every hop a new line
  auto dc = make_cycle(dbuf, 4096, (2ull << 30) / 4096, (2ull << 30) / 4096, 2);
  const Stats d2g = idle_chase(x, dc[0], 0, 3, true, nullptr);
  dc = make_cycle(dbuf, 4096, (256ull << 20) / 4096, (256ull << 20) / 4096, 3);  // 256 MB span: fewer TLB misses
  const Stats d256 = idle_chase(x, dc[0], 0, 3, true, nullptr);
  CK(cudaFree(dbuf));
  printf("\n== A. idle dependent-load latency (ns per hop, one thread, ld.global.cg)\n");
  printf("  %-34s %8s %8s %8s %8s\n", "", "median", "p10", "p90", "mean");
  const char* names[3] = {"L2 hit (2 MB, 128 B stride)", "DRAM (2 GB, 4 KB stride)", "DRAM (256 MB, 4 KB stride)"};
  const char* keys[3] = {"l2_2mb", "dram_2gb", "dram_256mb"};
  const Stats* s[3] = {&l2, &d2g, &d256};
  fprintf(js, "  \"idle\": {\"sm_clock_mhz_measured\": %.1f, \"hops_per_rep\": %d", mhz, MAX_HOPS - 1);
  for (int i = 0; i < 3; ++i) {
    printf("  %-34s %8.1f %8.1f %8.1f %8.1f\n", names[i], s[i]->med, s[i]->p10, s[i]->p90, s[i]->mean);
    fprintf(js, ",\n    \"%s\": {", keys[i]); json_stats(js, "ns", *s[i]); fprintf(js, "}");
  }
  printf("  SM clock during the L2 chase: %.0f MHz\n", mhz);
  fprintf(js, "},\n");
}

static void probe_barrier(Ctx& x, FILE* js) {
  int occ = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, barrier_kernel, THREADS, 0));
  const int iters = 2000, reps = 7;
  unsigned* counter; float *vec, *sink; unsigned long long* d_t;
  CK(cudaMalloc(&counter, 4)); CK(cudaMalloc(&d_t, 8));
  CK(cudaMalloc(&vec, 2 * occ * x.sms * 8 * sizeof(float))); CK(cudaMalloc(&sink, occ * x.sms * sizeof(float)));
  CK(cudaMemset(vec, 0, 2 * occ * x.sms * 8 * sizeof(float)));
  printf("\n== B. grid barrier (cooperative launch, %d threads/block, %d barriers per launch), us per barrier\n", THREADS, iters);
  printf("  %-8s %-10s %-9s %8s %8s %8s\n", "blocks", "blocks/SM", "exchange", "median", "p10", "p90");
  fprintf(js, "  \"grid_barrier\": {\"threads\": %d, \"barriers_per_launch\": %d, \"resident_blocks_per_sm\": %d", THREADS, iters, occ);
  for (int bps : {occ, 1}) {
    for (int ex = 0; ex < 2; ++ex) {
      int blocks = bps * x.sms, it = iters, exv = ex;
      void* args[] = {&counter, &vec, &it, &exv, &d_t, &sink};
      std::vector<double> us;
      for (int r = 0; r < reps + 1; ++r) {
        CK(cudaMemset(counter, 0, 4));
        CK(cudaLaunchCooperativeKernel((const void*)barrier_kernel, blocks, THREADS, args, 0, 0));
        CK_LAUNCH();
        unsigned long long t; CK(cudaMemcpy(&t, d_t, 8, cudaMemcpyDeviceToHost));
        if (r > 0) us.push_back(t / 1e3 / iters);
      }
      const Stats s = stats(us);
      printf("  %-8d %-10d %-9s %8.3f %8.3f %8.3f\n", blocks, bps, ex ? "yes" : "no", s.med, s.p10, s.p90);
      fprintf(js, ",\n    \"%s%s\": {\"blocks\": %d, ", bps == 1 ? "one_per_sm" : "ceiling", ex ? "_exchange" : "", blocks);
      json_stats(js, "us", s); fprintf(js, "}");
    }
  }
  fprintf(js, "},\n");
  CK(cudaFree(counter)); CK(cudaFree(d_t)); CK(cudaFree(vec)); CK(cudaFree(sink));
}

static void probe_boundary(Ctx& x, FILE* js) {
  const int K = 128, n = x.sms * 256, warm = 3, reps = 20;
  unsigned* data; CK(cudaMalloc(&data, 2 * n * sizeof(unsigned)));
  cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  printf("\n== C. kernel boundary: graph of %d dependent kernels (%d x 256 threads), us per kernel\n", K, x.sms);
  printf("  %-8s %8s %8s %8s %s\n", "launch", "median", "p10", "p90", "  chain check");
  fprintf(js, "  \"kernel_boundary\": {\"kernels_per_graph\": %d, \"replays\": %d", K, reps);
  for (int pdl = 0; pdl < 2; ++pdl) {
    CK(cudaMemset(data, 0, 2 * n * sizeof(unsigned)));
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < K; ++i) {
      if (!pdl) { chain_kernel<false><<<x.sms, 256, 0, st>>>(data, n, i); CK(cudaGetLastError()); continue; }
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(x.sms); cfg.blockDim = dim3(256); cfg.stream = st;
      cudaLaunchAttribute attr = {};
      attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr.val.programmaticStreamSerializationAllowed = 1;
      cfg.attrs = &attr; cfg.numAttrs = 1;
      CK(cudaLaunchKernelEx(&cfg, chain_kernel<true>, data, n, i));
    }
    cudaGraph_t g; cudaGraphExec_t ge;
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    std::vector<double> us;
    for (int r = 0; r < warm + reps; ++r) {
      CK(cudaEventRecord(e0, st)); CK(cudaGraphLaunch(ge, st)); CK(cudaEventRecord(e1, st));
      CK(cudaEventSynchronize(e1));
      float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
      if (r >= warm) us.push_back(ms * 1e3 / K);
    }
    std::vector<unsigned> h(n);
    CK(cudaMemcpy(h.data(), data, n * sizeof(unsigned), cudaMemcpyDeviceToHost));   // K even: result in buffer 0
    const bool ok = std::all_of(h.begin(), h.end(), [&](unsigned v) { return v == (unsigned)(K * (warm + reps)); });
    const Stats s = stats(us);
    printf("  %-8s %8.3f %8.3f %8.3f   %s\n", pdl ? "PDL" : "plain", s.med, s.p10, s.p90, ok ? "ok" : "FAILED (race)");
    fprintf(js, ",\n    \"%s\": {\"chain_ok\": %s, ", pdl ? "pdl" : "plain", ok ? "true" : "false");
    json_stats(js, "us_per_kernel", s); fprintf(js, "}");
    CK(cudaGraphExecDestroy(ge)); CK(cudaGraphDestroy(g));
  }
  fprintf(js, "},\n");
  CK(cudaEventDestroy(e0)); CK(cudaEventDestroy(e1)); CK(cudaStreamDestroy(st)); CK(cudaFree(data));
}

struct Cfg { int unroll, tma_kb, warps, probe_sm_streams, ring_n, refresh; };

static const void* probe_fn(const Cfg& c) {       // unroll in {0,1,2,4,8,16}; TMA rows use <0, true>
  static const void* ld[] = {(const void*)stream_probe_kernel<0, false>, (const void*)stream_probe_kernel<1, false>,
      (const void*)stream_probe_kernel<2, false>, (const void*)stream_probe_kernel<4, false>,
      (const void*)stream_probe_kernel<8, false>, (const void*)stream_probe_kernel<16, false>};
  return c.tma_kb ? (const void*)stream_probe_kernel<0, true> : ld[c.unroll ? 1 + __builtin_ctz(c.unroll) : 0];
}

static void probe_stream(Ctx& x, FILE* js) {
  const int reps = 3;
  std::vector<Cfg> cfgs = {{0, 0, 0, 0, 256, 1}};                           // baseline: no stream
  for (int w : {4, 8, 15}) for (int u : {1, 2, 4, 8, 16}) for (int ps = 0; ps < 2; ++ps) cfgs.push_back({u, 0, w, ps, 256, 1});
  for (int kb : {16, 32, 64, 128}) for (int ps = 0; ps < 2; ++ps) cfgs.push_back({0, kb, 1, ps, 256, 1});
  for (int rn : {256, 8192}) { cfgs.push_back({0, 0, 0, 0, rn, 0}); cfgs.push_back({8, 0, 15, 0, rn, 0}); }  // controls
  // Two 1 MB chase buffers: a 256-line ring (refreshed) and a full 8192-line cycle.
  char *ring_buf, *full_buf; CK(cudaMalloc(&ring_buf, 1u << 20)); CK(cudaMalloc(&full_buf, 1u << 20));
  const auto ring = make_cycle(ring_buf, 128, 8192, 256, 4);
  const auto full = make_cycle(full_buf, 128, 8192, 8192, 5);
  uint64_t* d_ring; CK(cudaMalloc(&d_ring, 256 * 8));
  CK(cudaMemcpy(d_ring, ring.data(), 256 * 8, cudaMemcpyHostToDevice));
  unsigned* done; ProbeOut* d_out; CK(cudaMalloc(&done, 4)); CK(cudaMalloc(&d_out, sizeof(ProbeOut)));
  static ProbeOut h;
  printf("\n== D/E. dependent L2-hit chase (block 0, 1 thread) while the other SMs stream a %zu GB buffer\n", x.stream_bytes >> 30);
  printf("  %-4s %3s %4s %3s %5s %3s %10s %7s %8s %8s %8s %8s\n", "mode", "U", "KB", "W", "ring", "psm",
         "inflightMB", "TB/s", "med ns", "p10", "p90", "mean");
  fprintf(js, "  \"stream_probe\": [");
  for (size_t i = 0; i < cfgs.size(); ++i) {
    const Cfg& c = cfgs[i];
    const void* fn = probe_fn(c);
    int occ = 0;
    CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)PROBE_SMEM));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, fn, THREADS, PROBE_SMEM));
    if (occ != 1) { fprintf(stderr, "stream probe: expected 1 block/SM, got %d\n", occ); exit(1); }
    ProbeArgs a = {c.ring_n == 256 ? ring[0] : full[0], PROBE_HOPS, 30000, x.stream, x.stream_bytes, c.warps,
                   c.probe_sm_streams, c.refresh, (int)(c.tma_kb * 1024 / TMA_CHUNK), d_ring, 256, done, d_out};
    void* args[] = {&a};
    std::vector<double> ns, tbps, rep_med;
    for (int r = 0; r < reps + 1; ++r) {                                     // rep 0 is warm-up
      if (c.ring_n > 256)                                                    // full cycle: touch all 8192 lines first
        for (int k = 0; k < 2; ++k) { chase_kernel<<<1, 32, MAX_HOPS * 4>>>(a.chase_start, MAX_HOPS, &d_out->chase); CK_LAUNCH(); }
      CK(cudaMemset(done, 0, 4)); CK(cudaMemset(d_out, 0, sizeof(ProbeOut)));
      CK(cudaMemset(&d_out->t_start, 0xFF, 8));
      CK(cudaLaunchCooperativeKernel(fn, x.sms, THREADS, args, PROBE_SMEM, 0));
      CK_LAUNCH();
      CK(cudaMemcpy(&h, d_out, sizeof(h), cudaMemcpyDeviceToHost));
      if (r == 0) continue;
      std::vector<double> one;
      hop_ns(h.chase, PROBE_HOPS, one);
      rep_med.push_back(stats(one).med);
      ns.insert(ns.end(), one.begin(), one.end());
      tbps.push_back(h.bytes ? h.bytes / (double)(h.t_end - h.t_start) / 1e3 : 0.0);
      a.chase_start = h.chase.end;
    }
    const int nblk = c.probe_sm_streams ? x.sms : x.sms - 1;
    const double inflight = c.tma_kb ? nblk * c.tma_kb * 1024.0 : nblk * (double)c.warps * 32 * c.unroll * 16;
    const Stats s = stats(ns), bw = stats(tbps);
    printf("  %-4s %3d %4d %3d %5d %3d %10.2f %7.2f %8.1f %8.1f %8.1f %8.1f%s\n", c.tma_kb ? "tma" : "ld", c.unroll,
           c.tma_kb, c.warps, c.ring_n, c.probe_sm_streams, inflight / 1e6, bw.med, s.med, s.p10, s.p90, s.mean,
           c.refresh ? "" : "  (no refresher)");
    fprintf(js, "%s\n    {\"mode\": \"%s\", \"unroll\": %d, \"tma_kb_per_sm\": %d, \"warps\": %d, \"probe_sm_streams\": %d, "
            "\"ring_lines\": %d, \"refresh\": %d, \"streaming_blocks\": %d, \"inflight_bytes\": %.0f, \"stream_tbps\": %.4f, "
            "\"sm_clock_mhz\": %.1f, ", i ? "," : "", c.tma_kb ? "tma" : "ld", c.unroll, c.tma_kb, c.warps,
            c.probe_sm_streams, c.ring_n, c.refresh, (c.unroll || c.tma_kb) ? nblk : 0, (c.unroll || c.tma_kb) ? inflight : 0.0,
            bw.med, 1e3 * (double)h.chase.cycles / (double)h.chase.ns);
    json_stats(js, "probe_ns", s);
    fprintf(js, ", \"prober_smid\": %u, \"probe_ns_rep_medians\": [", h.smid);
    for (size_t r = 0; r < rep_med.size(); ++r) fprintf(js, "%s%.1f", r ? ", " : "", rep_med[r]);
    fprintf(js, "]}");
  }
  fprintf(js, "\n  ]\n");
  CK(cudaFree(ring_buf)); CK(cudaFree(full_buf)); CK(cudaFree(d_ring)); CK(cudaFree(done)); CK(cudaFree(d_out));
}

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : "latency_probe.json";
  Ctx x = {};
  int dev = 0, coop = 0, clk = 0, mclk = 0, bus = 0, drv = 0, rt = 0;
  CK(cudaSetDevice(dev));
  CK(cudaGetDeviceProperties(&x.prop, dev));
  CK(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev));
  CK(cudaDeviceGetAttribute(&clk, cudaDevAttrClockRate, dev));
  CK(cudaDeviceGetAttribute(&mclk, cudaDevAttrMemoryClockRate, dev));
  CK(cudaDeviceGetAttribute(&bus, cudaDevAttrGlobalMemoryBusWidth, dev));
  CK(cudaDriverGetVersion(&drv)); CK(cudaRuntimeGetVersion(&rt));
  x.sms = x.prop.multiProcessorCount;
  printf("device: %s  cc %d.%d  SMs %d  SM clock %d MHz (peak)  mem clock %d MHz  bus %d bit  L2 %d MB  smem/SM %zu KB\n",
         x.prop.name, x.prop.major, x.prop.minor, x.sms, clk / 1000, mclk / 1000, bus, x.prop.l2CacheSize >> 20,
         x.prop.sharedMemPerMultiprocessor >> 10);
  if (!coop || x.prop.major < 9) { fprintf(stderr, "need cooperative launch and sm_90+ (TMA, PDL)\n"); return 1; }
  if (x.prop.sharedMemPerBlockOptin < PROBE_SMEM || x.prop.sharedMemPerMultiprocessor >= 2 * PROBE_SMEM) {
    fprintf(stderr, "probe D needs %zu B smem and must force 1 block/SM\n", PROBE_SMEM); return 1;
  }
  FILE* js = fopen(path, "w");
  if (!js) { fprintf(stderr, "cannot write %s\n", path); return 1; }
  fprintf(js, "{\n  \"device\": {\"name\": \"%s\", \"cc\": \"%d.%d\", \"sm_count\": %d, \"sm_clock_khz_peak\": %d, "
          "\"mem_clock_khz\": %d, \"mem_bus_bits\": %d, \"l2_bytes\": %d, \"smem_per_sm\": %zu, \"total_mem_bytes\": %zu, "
          "\"driver\": %d, \"runtime\": %d},\n", x.prop.name, x.prop.major, x.prop.minor, x.sms, clk, mclk, bus,
          x.prop.l2CacheSize, x.prop.sharedMemPerMultiprocessor, x.prop.totalGlobalMem, drv, rt);
  x.stream_bytes = 4ull << 30;
  CK(cudaMalloc(&x.stream, x.stream_bytes));
  CK(cudaMemset(x.stream, 0x5a, x.stream_bytes));
  CK(cudaMalloc(&x.sink, 4));
  probe_idle(x, js);
  probe_barrier(x, js);
  probe_boundary(x, js);
  probe_stream(x, js);
  fprintf(js, "}\n");
  fclose(js);
  CK(cudaFree(x.stream)); CK(cudaFree(x.sink));
  printf("\nwrote %s\n", path);
  return 0;
}
