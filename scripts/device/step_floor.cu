// step_floor.cu - how fast can ONE persistent kernel move a Qwen3.5-0.8B decode step's bytes on this GPU, for a
// given synchronisation structure? An upper bound for the megakernel (docs/megakernel.md, "What the card allows").
//
// No arithmetic: every block streams its share of every stage of a token with the megakernel's load pattern
// (16-byte ld.global.nc.L1::no_allocate, 8 loads a lane in flight, 132 blocks x 512 threads) and XORs what it
// read into a sink. Only the synchronisation between stages differs by mode:
//   stream   no barriers: the floor of the load pattern itself;
//   sync2    a grid barrier before each layer's MLP and before the next layer (the megakernel's 2 a layer, 49 a
//            token with the LM head's), each stage's loads issued after the barrier;
//   sync2p   sync2 plus the minimal prologue after each barrier: every block reads the 1,024-float vector the
//            others wrote before it (L2 hits) and block-reduces it before requesting the stage's weights;
//   sync3p   a barrier and prologue before each of a layer's three stages (in-projection, mixer + out, MLP),
//            73 a token: a layer synchronised like `ar`'s three kernels;
//   pipe1p, pipe2p   the sync3p chain run by warp 0 alone (barrier, vector read, the block's slice of the next
//            vector written, arrival) while warps 1-15 stream: stage s once the chain has finished stage s-1
//            (pipe1: the loads overlap the barrier and the prologue, as a design that requests weights on
//            arrival) or s-2 (pipe2: a whole stage ahead, as a design that keeps a stage of weights in shared
//            memory; the largest share, the MLP's 167 KB, fits an SM's 228 KB).
// No mode computes anything, so each is a floor for designs of its shape, not a prediction.
//
// Usage: step_floor [out.json] [tokens_per_launch]   (table to stdout). Needs only the CUDA runtime, sm_90.
#include <string>

#include "probe_common.cuh"

constexpr int THREADS = 512, WARPS = THREADS / 32, STREAM_WARPS_PIPE = WARPS - 1;
constexpr int UNROLL = 8;        // loads a lane keeps in flight (the megakernel's 2 rows x 4)
constexpr int VEC = 1024;        // hidden size: the vector every prologue reads
constexpr int MAX_STAGES = 80;   // stages of one token
constexpr int RING = 4;          // per-stage "streamed" counters in pipe modes (lookahead <= 2)

struct Stage { unsigned long long off16, n16; int barrier_before; };
__constant__ Stage c_stages[MAX_STAGES];

// ---------------------------------------------------------------- helpers (the rest: probe_common.cuh)
__device__ __forceinline__ float ld_cg(const float* p) { return __ldcg(p); }

// Streams [lo, hi) of the weights with `nthreads` threads numbered t = 0.., 8 loads a lane in flight.
__device__ __forceinline__ unsigned stream_share(const uint4* w, unsigned long long lo, unsigned long long hi, int t, int nthreads) {
  unsigned acc = 0;
  unsigned long long base = lo;
  for (; base + (unsigned long long)UNROLL * nthreads <= hi; base += (unsigned long long)UNROLL * nthreads) {
    uint4 v[UNROLL];
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) v[k] = ld_stream(w + base + t + (unsigned long long)k * nthreads);
#pragma unroll
    for (int k = 0; k < UNROLL; ++k) acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
  }
  for (unsigned long long i = base + t; i < hi; i += nthreads) { const uint4 v = ld_stream(w + i); acc ^= v.x ^ v.y ^ v.z ^ v.w; }
  return acc;
}

__device__ __forceinline__ void share_of(int s, unsigned long long& lo, unsigned long long& hi) {
  const unsigned long long n = c_stages[s].n16, o = c_stages[s].off16;
  lo = o + n * blockIdx.x / gridDim.x; hi = o + n * (blockIdx.x + 1) / gridDim.x;
}

// Monotonic counter barrier, as the megakernel's GridBarrier kind 2: barrier k is passed at k * gridDim.x arrivals.
__device__ __forceinline__ void arrive(unsigned* counter) { red_release_add(counter, 1); }
__device__ __forceinline__ void wait_count(const unsigned* counter, unsigned target) { while (ld_acquire(counter) < target) {} }

// All-thread modes: stream, sync2, sync2p, sync3p (the stage table says where the barriers are).
__global__ void __launch_bounds__(THREADS, 1) sync_kernel(const uint4* w, int nst, int tokens, int prologue,
                                                          unsigned* counter, float* vec, unsigned* sink) {
  __shared__ float part[WARPS];
  __shared__ float s_r;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  unsigned acc = 0, target = 0, passed = 0;
  float r = 0.f;
  for (int tok = 0; tok < tokens; ++tok) {
    for (int s = 0; s < nst; ++s) {
      if (c_stages[s].barrier_before) {
        // The block's slice of the next vector, then the arrival (release orders the writes before it).
        if (prologue && t < 8 && blockIdx.x * 8 + t < VEC) vec[((passed + 1) & 1) * VEC + blockIdx.x * 8 + t] = r + (float)(acc & 1);
        __syncthreads();
        target += gridDim.x;
        if (t == 0) { arrive(counter); wait_count(counter, target); }
        __syncthreads();
        ++passed;
        if (prologue) {  // one dependent round trip: the whole vector other blocks wrote, reduced in the block
          const float* v = vec + (passed & 1) * VEC;
          float x = ld_cg(v + t) + ld_cg(v + t + THREADS);
#pragma unroll
          for (int o = 16; o; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
          if (lane == 0) part[warp] = x;
          __syncthreads();
          if (t == 0) { float y = 0.f; for (int i = 0; i < WARPS; ++i) y += part[i]; s_r = y * 1e-6f; }
          __syncthreads();
          r = s_r;
        }
      }
      unsigned long long lo, hi; share_of(s, lo, hi);
      acc ^= stream_share(w, lo, hi, t, THREADS);
    }
  }
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc + (unsigned)r;
}

// Pipe modes: warp 0 runs the sync3p chain, warps 1-15 stream up to `lookahead` stages ahead of it.
__global__ void __launch_bounds__(THREADS, 1) pipe_kernel(const uint4* w, int nst, int tokens, int lookahead,
                                                          unsigned* counter, float* vec, unsigned* sink) {
  __shared__ int s_done[RING];            // streamer warps finished with stage g % RING
  __shared__ volatile int s_chain;        // stages the chain has finished (global index over tokens)
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  if (t < RING) s_done[t] = 0;
  if (t == 0) s_chain = 0;
  __syncthreads();
  const int total = nst * tokens;
  unsigned acc = 0;
  if (warp == 0) {
    unsigned target = 0, passed = 0;
    float r = 0.f;
    for (int g = 0; g < total; ++g) {
      const int s = g % nst;
      if (c_stages[s].barrier_before) {
        if (lane == 0) wait_count(counter, target);
        __syncwarp();
        ++passed;
        const float* v = vec + (passed & 1) * VEC;
        float x = 0.f;
        for (int i = lane; i < VEC; i += 32) x += ld_cg(v + i);
#pragma unroll
        for (int o = 16; o; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
        r = x * 1e-6f;
      }
      if (lane == 0) { while (((volatile int*)s_done)[g % RING] < STREAM_WARPS_PIPE) {} s_done[g % RING] = 0; }
      __syncwarp();
      const int next = (g + 1) % nst;
      if (g + 1 < total && c_stages[next].barrier_before) {
        if (lane < 8 && blockIdx.x * 8 + lane < VEC) vec[((passed + 1) & 1) * VEC + blockIdx.x * 8 + lane] = r + (float)g;
        __syncwarp();
        target += gridDim.x;
        if (lane == 0) arrive(counter);
      }
      __syncwarp();
      if (lane == 0) { __threadfence_block(); s_chain = g + 1; }
    }
    acc = (unsigned)r;
  } else {
    const int st = t - 32, n = THREADS - 32;
    for (int g = 0; g < total; ++g) {
      if (lane == 0) while (s_chain < g - lookahead + 1) {}
      __syncwarp();
      unsigned long long lo, hi; share_of(g % nst, lo, hi);
      acc ^= stream_share(w, lo, hi, st, n);
      __syncwarp();
      if (lane == 0) atomicAdd(&s_done[g % RING], 1);
    }
  }
  if (acc == 0x9e3779b9u) sink[blockIdx.x * THREADS + t] = acc;
}

// ---------------------------------------------------------------- host
struct Model { const char* name; int layers, hidden, inter, vocab, q_rows, kv_rows, lin_in_rows, lin_out_cols, state_bytes; };

// Stage bytes of one decode token of Qwen3.5-0.8B (lucebench/models/shapes.py): per layer the in-projection,
// the mixer (DeltaNet: fp32 state read + written, counted as 2 MB of reads, and out_proj; attention: o_proj),
// the MLP (gate, up, down); then the tied LM head. Layers 3, 7, ..., 23 are attention (interval 4).
static std::vector<std::pair<std::string, unsigned long long>> token_stages(const Model& m) {
  std::vector<std::pair<std::string, unsigned long long>> st;
  const unsigned long long H = m.hidden, bf = 2;
  for (int l = 0; l < m.layers; ++l) {
    const bool attn = l % 4 == 3;
    st.push_back({"in", (attn ? (unsigned long long)m.q_rows + 2ull * m.kv_rows : (unsigned long long)m.lin_in_rows) * H * bf});
    st.push_back({"mix", (unsigned long long)m.lin_out_cols * H * bf + (attn ? 0ull : 2ull * m.state_bytes)});
    st.push_back({"mlp", 3ull * m.inter * H * bf});
  }
  st.push_back({"lm_head", (unsigned long long)m.vocab * H * bf});
  return st;
}

int main(int argc, char** argv) {
  const char* path = argc > 1 ? argv[1] : "step_floor.json";
  const int tokens = argc > 2 ? std::atoi(argv[2]) : 64;
  if (tokens < 1) { fprintf(stderr, "tokens_per_launch must be a whole number >= 1, got '%s'\n", argv[2]); return 2; }
  const int warm = 2, reps = 9;
  cudaDeviceProp prop; CK(cudaGetDeviceProperties(&prop, 0));
  int sms = prop.multiProcessorCount;
  // Qwen3.5-0.8B: hidden 1024, intermediate 3584, vocab 248320; attention 8 q heads x 256 x 2 (output gate) and
  // 2 kv heads x 256 for k and v; DeltaNet q, k, v, z of 2048 rows each + b, a of 16; state 16 x 128 x 128 fp32.
  const Model m{"qwen3.5-0.8b", 24, 1024, 3584, 248320, 4096, 512, 4 * 2048 + 2 * 16, 2048, 16 * 128 * 128 * 4};
  const auto st = token_stages(m);
  unsigned long long total = 0;
  for (auto& s : st) total += s.second;
  printf("device: %s  SMs %d  L2 %d MB  model %s: %zu stages a token, %.4f GB a token\n", prop.name, sms,
         prop.l2CacheSize >> 20, m.name, st.size(), total / 1e9);

  // Copy bandwidth as the project defines it (docs/metrics.md): a 2 GiB device-to-device copy, read + written.
  const size_t cbytes = 2ull << 30;
  void *ca, *cb; CK(cudaMalloc(&ca, cbytes)); CK(cudaMalloc(&cb, cbytes)); CK(cudaMemset(ca, 1, cbytes));
  cudaEvent_t e0, e1; CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
  std::vector<double> bws;
  for (int r = 0; r < 13; ++r) {
    CK(cudaEventRecord(e0)); CK(cudaMemcpy(cb, ca, cbytes, cudaMemcpyDeviceToDevice)); CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1)); float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
    if (r >= 3) bws.push_back(2.0 * cbytes / (ms * 1e-3) / 1e12);
  }
  CK(cudaFree(ca)); CK(cudaFree(cb));
  const double bw = stats(bws).med;
  const double floor_us = total / (bw * 1e12) * 1e6;
  printf("copy bandwidth %.3f TB/s (2 GiB D2D, read + written, median of 10): roofline %.1f us a token = %.0f tok/s\n",
         bw, floor_us, 1e6 / floor_us);

  uint4* w; CK(cudaMalloc(&w, total)); CK(cudaMemset(w, 0x5a, total));
  unsigned* counter; float* vec; unsigned* sink;
  CK(cudaMalloc(&counter, 4)); CK(cudaMalloc(&vec, 2 * VEC * sizeof(float))); CK(cudaMemset(vec, 0, 2 * VEC * sizeof(float)));
  CK(cudaMalloc(&sink, (size_t)sms * THREADS * 4));

  struct Mode { const char* name; int barriers; int prologue; int pipe; };  // barriers: 0, 2 or 3 a layer
  const Mode modes[] = {{"stream", 0, 0, 0}, {"sync2", 2, 0, 0}, {"sync2p", 2, 1, 0}, {"sync3p", 3, 1, 0},
                        {"pipe1p", 3, 1, 1}, {"pipe2p", 3, 1, 2}};
  FILE* js = fopen(path, "w");
  if (!js) { fprintf(stderr, "cannot write %s\n", path); return 1; }
  fprintf(js, "{\n  \"device\": \"%s\", \"sm_count\": %d, \"model\": \"%s\", \"bytes_per_token\": %llu, \"copy_bandwidth_tbs\": %.4f,\n"
              "  \"tokens_per_launch\": %d, \"launches\": %d, \"blocks\": %d, \"threads\": %d,\n  \"modes\": [",
          prop.name, sms, m.name, total, bw, tokens, reps, sms, THREADS);
  printf("\n%-8s %9s %10s %10s %10s %9s %9s\n", "mode", "barriers", "us/token", "p10", "p90", "tok/s", "% roof");
  for (size_t mi = 0; mi < sizeof(modes) / sizeof(modes[0]); ++mi) {
    const Mode& md = modes[mi];
    std::vector<Stage> tab;
    unsigned long long off = 0;
    int nbar = 0;
    for (size_t i = 0; i < st.size(); ++i) {
      const std::string& kind = st[i].first;
      int b = 0;
      if (md.barriers == 3) b = 1;                                       // before every stage
      else if (md.barriers == 2) b = kind == "in" || kind == "mlp" || kind == "lm_head";
      if (i == 0 && md.barriers) b = 1;                                  // the token boundary (the previous argmax)
      nbar += b;
      tab.push_back({off / 16, st[i].second / 16, b});
      off += st[i].second;
    }
    CK(cudaMemcpyToSymbol(c_stages, tab.data(), tab.size() * sizeof(Stage)));
    int nst = (int)tab.size(), tk = tokens, pro = md.prologue, la = md.pipe;
    const void* fn = md.pipe ? (const void*)pipe_kernel : (const void*)sync_kernel;
    int occ = 0; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, fn, THREADS, 0));
    if (occ < 1) { fprintf(stderr, "%s: does not fit one block per SM\n", md.name); return 1; }
    void* args_sync[] = {&w, &nst, &tk, &pro, &counter, &vec, &sink};
    void* args_pipe[] = {&w, &nst, &tk, &la, &counter, &vec, &sink};
    std::vector<double> us;
    for (int r = 0; r < warm + reps; ++r) {
      CK(cudaMemset(counter, 0, 4));
      CK(cudaEventRecord(e0));
      CK(cudaLaunchCooperativeKernel(fn, sms, THREADS, md.pipe ? args_pipe : args_sync, 0, 0));
      CK(cudaEventRecord(e1)); CK(cudaGetLastError()); CK(cudaEventSynchronize(e1));
      float ms; CK(cudaEventElapsedTime(&ms, e0, e1));
      if (r >= warm) us.push_back(ms * 1e3 / tokens);
    }
    const Stats s = stats(us);
    printf("%-8s %9d %10.1f %10.1f %10.1f %9.0f %8.1f%%\n", md.name, nbar, s.med, s.p10, s.p90, 1e6 / s.med, 100.0 * floor_us / s.med);
    fprintf(js, "%s\n    {\"mode\": \"%s\", \"barriers_per_token\": %d, \"prologue\": %s, \"lookahead\": %d, \"us_per_token_median\": %.2f, "
                "\"us_p10\": %.2f, \"us_p90\": %.2f, \"tok_s\": %.1f, \"pct_of_roofline\": %.2f, \"us_per_token\": [",
            mi ? "," : "", md.name, nbar, md.prologue ? "true" : "false", md.pipe, s.med, s.p10, s.p90, 1e6 / s.med, 100.0 * floor_us / s.med);
    for (size_t i = 0; i < us.size(); ++i) fprintf(js, "%s%.2f", i ? ", " : "", us[i]);
    fprintf(js, "]}");
  }
  fprintf(js, "\n  ]\n}\n");
  fclose(js);
  printf("\nwrote %s\n", path);
  return 0;
}
