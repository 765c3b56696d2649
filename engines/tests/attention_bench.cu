// lucebench-attention-bench: prefill attention speed, the way a prefill forward runs it: one attention layer
// over L tokens in chunks (rows pos0 .. pos0 + chunk - 1 against cache keys 0 .. pos0 + t), every chunk timed
// together with cudaEvents, warm-up runs first, the median of --reps runs reported. Inputs are random (hashed
// on the device): queries ~U(-1, 1), bf16 keys and values ~U(-1, 1). FLOP count: causal QK^T and PV,
// 4 nh hd sum_t (pos0 + t + 1) over the rows, the same for every kernel (a sparse run does fewer: its
// "effective" rate is this count over its time).
//
//   lucebench-attention-bench [--nh 16] [--nkv 8] [--hd 128] [--gated 0] [--L 8192,32768] [--chunk 8192]
//                             [--reps 5] [--kernels flash,wmma] [--budgets 1,0.25,0.1] [--alpha 0.85]
//                             [--json FILE]
//
// kernels: flash (flash_attention_kernel), wmma (attention_wmma_kernel, the kernel CUDA prefill ran before
// flash_attention_kernel where 64 % G == 0), tiled, rows (attention_kernel, the one the 27B's G = 6 took).
// budgets: block-sparse runs of the flash kernel (the PFlash drafter's selection with that budget; 1: upstream's
// alpha rule alone), the selection included in the time; the rows of the forward's last 256 positions dense,
// as the engine runs them. One JSON line a measurement on stdout
// (and appended to --json).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/cuda/gpu_ops.h"
#include "gpu_check_util.h"

using namespace lb;

namespace {

__global__ void fill_f32(float* x, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        unsigned h = unsigned(i) * 2654435761u ^ seed;
        h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
        x[i] = float(h & 0xffffff) / float(0x800000) - 1.f;
    }
}
__global__ void fill_bf16(unsigned short* x, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
        unsigned h = unsigned(i) * 2654435761u ^ seed;
        h ^= h >> 15; h *= 2246822519u; h ^= h >> 13; h *= 3266489917u; h ^= h >> 16;
        const float f = float(h & 0xffffff) / float(0x800000) - 1.f;
        x[i] = (unsigned short)(__float_as_uint(f) >> 16);
    }
}

std::vector<std::string> split(const std::string& s) {
    std::vector<std::string> out;
    size_t a = 0;
    while (a <= s.size()) {
        const size_t b = s.find(',', a);
        out.push_back(s.substr(a, b == std::string::npos ? std::string::npos : b - a));
        if (b == std::string::npos) break;
        a = b + 1;
    }
    return out;
}

}  // namespace

int main(int argc, char** argv) {
    int nh = 16, nkv = 8, hd = 128, gated = 0, chunk = 8192, reps = 5;
    float alpha = 0.85f;
    std::string Ls = "8192,32768,65536,131072", kernels = "flash,wmma", budgets = "", json;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string a = argv[i], v = argv[i + 1];
        if (a == "--nh") nh = std::atoi(v.c_str());
        else if (a == "--nkv") nkv = std::atoi(v.c_str());
        else if (a == "--hd") hd = std::atoi(v.c_str());
        else if (a == "--gated") gated = std::atoi(v.c_str());
        else if (a == "--L") Ls = v;
        else if (a == "--chunk") chunk = std::atoi(v.c_str());
        else if (a == "--reps") reps = std::atoi(v.c_str());
        else if (a == "--kernels") kernels = v;
        else if (a == "--budgets") budgets = v;
        else if (a == "--alpha") alpha = float(std::atof(v.c_str()));
        else if (a == "--json") json = v;
        else { fprintf(stderr, "unknown option %s\n", a.c_str()); return 2; }
    }
    if (nh < 1 || nkv < 1 || nh % nkv || chunk < 16 || reps < 1) { fprintf(stderr, "bad shape\n"); return 2; }
    GPU_CHECK(gpuSetDevice(0));
    gpuDeviceProp prop;
    GPU_CHECK(gpuGetDeviceProperties(&prop, 0));
    gpuStream_t s;
    GPU_CHECK(gpuStreamCreate(&s));
    gpu::DeviceContext ctx(0);
    gpu::ContextScope bind(ctx);
    FILE* jf = json.empty() ? nullptr : fopen(json.c_str(), "a");

    int Lmax = 0;
    for (const auto& l : split(Ls)) Lmax = std::max(Lmax, std::atoi(l.c_str()));
    const int qs = gated ? 2 : 1, ld = (qs * nh + 2 * nkv) * hd, cmax = std::min(chunk, Lmax);
    float* qkv = nullptr;
    unsigned short *kc = nullptr, *vc = nullptr;
    float* out = nullptr;
    int* d_pos = nullptr;
    const size_t cache = size_t(Lmax) * nkv * hd;
    GPU_CHECK(gpuMalloc((void**)&qkv, sizeof(float) * size_t(cmax) * ld));
    GPU_CHECK(gpuMalloc((void**)&kc, 2 * cache));
    GPU_CHECK(gpuMalloc((void**)&vc, 2 * cache));
    GPU_CHECK(gpuMalloc((void**)&out, sizeof(float) * size_t(cmax) * nh * hd));
    fill_f32<<<1024, 256, 0, s>>>(qkv, size_t(cmax) * ld, 1u);
    fill_bf16<<<1024, 256, 0, s>>>(kc, cache, 2u);
    fill_bf16<<<1024, 256, 0, s>>>(vc, cache, 3u);
    // one d_pos a chunk start, so that a run launches back to back
    const int n_chunks_max = (Lmax + cmax - 1) / cmax;
    std::vector<int> starts(static_cast<size_t>(n_chunks_max));
    for (int c = 0; c < n_chunks_max; ++c) starts[size_t(c)] = c * cmax;
    GPU_CHECK(gpuMalloc((void**)&d_pos, sizeof(int) * starts.size()));
    GPU_CHECK(gpuMemcpy(d_pos, starts.data(), sizeof(int) * starts.size(), gpuMemcpyHostToDevice));

    gpu::BlockSparse bs;
    unsigned long long* stats = nullptr;
    GPU_CHECK(gpuMalloc((void**)&stats, 2 * sizeof(unsigned long long)));
    if (!budgets.empty()) {
        bs.size_for(cmax, nh, nkv, hd, Lmax);
        GPU_CHECK(gpuMalloc((void**)&bs.tiles, sizeof(int) * bs.tiles_ints));
        GPU_CHECK(gpuMalloc((void**)&bs.counts, sizeof(int) * bs.counts_ints));
        GPU_CHECK(gpuMalloc((void**)&bs.kmean, sizeof(float) * bs.kmean_floats));
        bs.alpha = alpha;
        bs.stats = stats;
    }
    printf("# lucebench-attention-bench on %s (%d SMs): nh %d, nkv %d, hd %d, %s, chunk %d, median of %d\n", prop.name,
           prop.multiProcessorCount, nh, nkv, hd, gated ? "gated" : "no gate", chunk, reps);

    struct Run { std::string kernel; float budget; };
    std::vector<Run> runs;
    for (const auto& k : split(kernels)) runs.push_back({k, -1.f});
    if (!budgets.empty())
        for (const auto& b : split(budgets)) runs.push_back({"flash", float(std::atof(b.c_str()))});

    for (const auto& ls : split(Ls)) {
        const int L = std::atoi(ls.c_str());
        if (L < 16) continue;
        double flop = 0;
        for (int t = 0; t < L; ++t) flop += 4.0 * nh * hd * double(t + 1);
        for (const Run& run : runs) {
            gpu::AttentionKernel k = run.kernel == "flash" ? gpu::AttentionKernel::Flash
                                     : run.kernel == "wmma" ? gpu::AttentionKernel::Wmma
                                     : run.kernel == "tiled" ? gpu::AttentionKernel::Tiled
                                     : run.kernel == "rows"  ? gpu::AttentionKernel::Rows
                                                             : gpu::AttentionKernel::Auto;
            const bool sparse = run.budget > 0.f;
            if (sparse) {
                bs.budget = run.budget;
                bs.dense_from = L - 256;
            }
            auto one = [&]() {
                for (int c = 0, a = 0; a < L; ++c, a += cmax) {
                    const int m = std::min(cmax, L - a);
                    const bool took = sparse && gpu::block_sparse_select(qkv, ld, m, nh, nkv, hd, gated != 0, a, kc,
                                                                         DType::BF16, bs, s);
                    gpu::attention_with(k, qkv, ld, m, nh, nkv, hd, d_pos + c, kc, DType::BF16, vc, DType::BF16, out, s,
                                        gated != 0, took ? &bs : nullptr);
                }
            };
            one();  // warm-up (and the launch limits raised)
            GPU_CHECK(gpuMemsetAsync(stats, 0, 2 * sizeof(unsigned long long), s));
            one();
            unsigned long long st[2] = {0, 0};
            GPU_CHECK(gpuMemcpyAsync(st, stats, sizeof st, gpuMemcpyDeviceToHost, s));
            GPU_CHECK(gpuStreamSynchronize(s));
            GPU_CHECK(gpuGetLastError());
            const std::vector<float> ms = sorted_event_ms(s, 0, reps, [&](int) { one(); });
            GPU_CHECK(gpuGetLastError());
            const float med = ms[ms.size() / 2];
            const double kept = sparse && st[1] ? double(st[0]) / double(st[1]) : 1.0;
            char line[512];
            snprintf(line, sizeof line,
                     "{\"kernel\": \"%s\", \"budget\": %.3f, \"alpha\": %.2f, \"L\": %d, \"nh\": %d, \"nkv\": %d, "
                     "\"hd\": %d, \"gated\": %d, \"chunk\": %d, \"ms\": %.3f, \"ms_min\": %.3f, \"ms_max\": %.3f, "
                     "\"tflops\": %.1f, \"kept_tiles\": %.4f, \"device\": \"%s\"}",
                     run.kernel.c_str(), sparse ? run.budget : 0.f, sparse ? alpha : 0.f, L, nh, nkv, hd, gated, cmax,
                     med, ms.front(), ms.back(), flop / (med * 1e-3) / 1e12, kept, prop.name);
            printf("%s\n", line);
            fflush(stdout);
            if (jf) { fprintf(jf, "%s\n", line); fflush(jf); }
        }
    }
    if (jf) fclose(jf);
    return 0;
}
