// lucebench-gemm-bench: the prefill GEMM (gpu::matmul for bf16 weights, gpu::matmul_quant for GGUF blocks) on
// the matrix shapes of Qwen3.5-27B and Qwen3-0.6B, timed per call: median of 15 CUDA-event timings after 3
// warm-ups, one call each (staging, dequantisation and split-K sums included: what a layer pays). Prints
// one table row a case with TFLOP/s = 2 n out in / time. Random bytes in W and x (the values do not change
// the work; random, not zero, because the tensor cores' power and so the clock depend on the data). Only
// the ops' public launchers are called, so the same source builds against an older engines/ tree
// (scripts/device/check_gemm_gpu.sh times the kernels before and after a change in one run). Block types at
// n <= 256 also with gemv = 8 (matmul_quant without the q4_K / q6_K verify kernels: the path of the other
// block types), to place the hand-over between the small-n kernels and the prefill GEMM.
//   usage: lucebench-gemm-bench [--quick]     (--quick: n = 512 and 8192 only)
//          lucebench-gemm-bench --draft       the DFlash round's small-n matrices instead: the 27B z-lab draft's
//                                             bf16 matrices at its block of 16 rows and at 8 / 9 context rows,
//                                             the target's q6_K LM head at the draft's 15 rows; GB/s of W read
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/cuda/gpu_ops.h"
#include "gpu_check_util.h"
#include "core/quant.h"

using namespace lb;

namespace {

struct Case {
    const char* model;
    const char* matrix;
    DType t;  // kWtypeDType: gpu::matmul (bf16); else gpu::matmul_quant
    int out, in;
};

void fill_random(void* p, size_t bytes) {
    std::vector<uint32_t> h((bytes + 3) / 4);
    uint64_t s = 0x9E3779B97F4A7C15ull;
    for (uint32_t& v : h) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        v = uint32_t(s >> 16) & 0x3F7F3F7Fu;  // finite bf16 / fp16 / fp32 bit patterns of moderate size
    }
    GPU_CHECK(gpuMemcpy(p, h.data(), bytes, gpuMemcpyHostToDevice));
}

// The DFlash round's matrices at its row counts (--draft): gpu::matmul / matmul_quant as the draft calls them,
// ms a call and the weights' bytes over it (these calls stream W once: at 8..16 rows they are bandwidth work).
int draft_cases(gpuStream_t s) {
    const DType BF = gpu::kWtypeDType;
    struct DraftCase {
        const char* matrix;
        DType t;
        int out, in;
        std::vector<int> ns;
    };
    const DraftCase cases[] = {
        {"draft fc (context rows)", BF, 5120, 5 * 5120, {8, 9}},  {"draft k/v (context rows)", BF, 2048, 5120, {8, 9}},
        {"draft qkv", BF, 6144, 5120, {16}},                      {"draft o_proj", BF, 5120, 4096, {16}},
        {"draft gate_up", BF, 2 * 17408, 5120, {16}},             {"draft down", BF, 5120, 17408, {16}},
        {"target LM head", DType::Q6_K, 248320, 5120, {1, 9, 15}},
    };
    size_t wmax = 0;
    for (const DraftCase& c : cases) wmax = std::max(wmax, dtype_row_bytes(c.t, size_t(c.in)) * size_t(c.out));
    void* W;
    float *x, *y;
    GPU_CHECK(gpuMalloc(&W, wmax));
    GPU_CHECK(gpuMalloc(&x, sizeof(float) * 16 * 5 * 5120));
    GPU_CHECK(gpuMalloc(&y, sizeof(float) * 16 * size_t(248320)));
    fill_random(W, wmax);
    fill_random(x, sizeof(float) * 16 * 5 * 5120);
    printf("| matrix | W | out x in | n | ms | W GB/s |\n|---|---|---|---|---|---|\n");
    for (const DraftCase& c : cases)
        for (int n : c.ns) {
            const std::vector<float> ts = sorted_event_ms(s, 3, 15, [&](int) {
                if (c.t == BF) gpu::matmul(x, n, c.in, (const gpu::wtype*)W, c.out, y, false, s);
                else gpu::matmul_quant(x, n, c.in, W, c.t, c.out, y, c.out, false, s);
            });
            const double ms = ts[ts.size() / 2], bytes = double(dtype_row_bytes(c.t, size_t(c.in))) * c.out;
            printf("| %s | %s | %d x %d | %d | %.4f | %.0f |\n", c.matrix, dtype_name(c.t), c.out, c.in, n, ms,
                   bytes / (ms * 1e6));
            fflush(stdout);
        }
    GPU_CHECK(gpuGetLastError());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
    const bool draft = argc > 1 && std::string(argv[1]) == "--draft";
    gpuDeviceProp prop;
    GPU_CHECK(gpuSetDevice(0));
    GPU_CHECK(gpuGetDeviceProperties(&prop, 0));
    gpuStream_t s;
    GPU_CHECK(gpuStreamCreate(&s));
    gpu::DeviceContext ctx(0);
    gpu::ContextScope bind(ctx);
    gpu::decode_setup(0);
    if (draft) {
        printf("lucebench-gemm-bench --draft on %s (%d SMs)\n\n", prop.name, prop.multiProcessorCount);
        return draft_cases(s);
    }
    const DType BF = gpu::kWtypeDType;
    const Case cases[] = {
        {"27B", "ffn gate_up", DType::Q4_K, 2 * 17408, 5120}, {"27B", "ffn down", DType::Q4_K, 5120, 17408},
        {"27B", "ffn down", DType::Q6_K, 5120, 17408},        {"27B", "lin_in", DType::Q4_K, 16480, 5120},
        {"27B", "attn qkv", DType::Q4_K, 14336, 5120},        {"27B", "o/out proj", DType::Q4_K, 5120, 6144},
        {"27B", "ffn gate_up", BF, 2 * 17408, 5120},          {"27B", "ffn down", BF, 5120, 17408},
        {"27B", "lin_in", BF, 16480, 5120},                   {"27B", "attn qkv", BF, 14336, 5120},
        {"27B", "o/out proj", BF, 5120, 6144},                {"0.6B", "attn qkv", BF, 4096, 1024},
        {"0.6B", "o_proj", BF, 1024, 2048},                   {"0.6B", "ffn gate_up", BF, 6144, 1024},
        {"0.6B", "ffn down", BF, 1024, 3072},
    };
    size_t wmax = 0;
    int inmax = 0, outmax = 0;
    for (const Case& c : cases) {
        wmax = std::max(wmax, dtype_row_bytes(c.t, size_t(c.in)) * size_t(c.out));
        inmax = std::max(inmax, c.in);
        outmax = std::max(outmax, c.out);
    }
    const int nmax = 8192;
    void* W;
    float *x, *y;
    GPU_CHECK(gpuMalloc(&W, wmax));
    GPU_CHECK(gpuMalloc(&x, sizeof(float) * size_t(nmax) * inmax));
    GPU_CHECK(gpuMalloc(&y, sizeof(float) * size_t(nmax) * outmax));
    fill_random(W, wmax);
    fill_random(x, sizeof(float) * size_t(nmax) * inmax);
    GPU_CHECK(gpuMemset(y, 0, sizeof(float) * size_t(nmax) * outmax));
    printf("lucebench-gemm-bench on %s (%d SMs)\n\n| model | matrix | W | out x in | n | call | ms | TFLOP/s |\n"
           "|---|---|---|---|---|---|---|---|\n", prop.name, prop.multiProcessorCount);
    for (const Case& c : cases) {
        std::vector<int> ns = {512, 2048, 8192};
        if (!quick && std::string(c.model) == "27B" && (std::string(c.matrix) == "ffn gate_up" || std::string(c.matrix) == "ffn down"))
            ns.insert(ns.begin(), {16, 64, 128, 256});  // where the small-n kernels hand over
        if (!quick && std::string(c.model) == "0.6B") ns.insert(ns.begin(), {16, 64, 128, 256});
        if (quick) ns = {512, 8192};
        for (int n : ns)
            // gemv = 8 (block types at n <= 256): without the q4_K / q6_K verify kernels (qmv, qmma), i.e. the
            // GEMM path matmul_quant takes for the other block types
            for (int gemv : {0, 8}) {
                if (gemv == 8 && (c.t == BF || n > 256)) continue;
                const std::vector<float> ts = sorted_event_ms(s, 3, 15, [&](int) {
                    if (c.t == BF) gpu::matmul(x, n, c.in, (const gpu::wtype*)W, c.out, y, false, s);
                    else gpu::matmul_quant(x, n, c.in, W, c.t, c.out, y, c.out, false, s, gemv);
                });
                const double ms = ts[ts.size() / 2];
                printf("| %s | %s | %s | %d x %d | %d | %s | %.4f | %.1f |\n", c.model, c.matrix, dtype_name(c.t), c.out,
                       c.in, n, gemv ? "gemv=8" : "default", ms, 2.0 * n * c.out * double(c.in) / (ms * 1e9));
                fflush(stdout);
            }
    }
    GPU_CHECK(gpuGetLastError());
    return 0;
}
