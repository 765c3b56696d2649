// lucebench-quant-blocks-check: the GPU's block readers (core/cuda/quant_blocks.cuh, dq8: 8 elements of a row
// of q4_K, q5_K, q6_K, q8_0 or q4_0) against the CPU reference decode_row (core/quant.cpp, ggml's
// dequantisation) on random blocks, every 8-element group of several rows. Host code: runs wherever nvcc
// builds it, no GPU needed. Exit status 1 on any difference (the two must agree exactly: same fp32 operations).
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "core/cuda/quant_blocks.cuh"

using namespace lb;

namespace {

template <DType T>
int check(std::mt19937& rng) {
    const int in = 512, rows = 5;
    const size_t rb = dtype_row_bytes(T, in), bb = dtype_block_bytes(T);
    std::vector<uint8_t> raw(rb * rows);
    std::uniform_int_distribution<int> byte(0, 255);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& b : raw) b = uint8_t(byte(rng));
    const size_t dpos = T == DType::Q6_K ? 208 : 0;
    for (size_t blk = 0; blk < raw.size() / bb; ++blk) {  // finite scales of both signs and several magnitudes
        for (size_t f : {dpos, size_t(2)}) {
            if (f == 2 && T != DType::Q4_K && T != DType::Q5_K) continue;
            const uint16_t h = f32_to_f16(nd(rng) * std::pow(10.f, float(byte(rng) % 5) - 4.f));
            std::memcpy(&raw[blk * bb + f], &h, 2);
        }
    }
    int bad = 0;
    std::vector<float> ref(in);
    for (int r = 0; r < rows; ++r) {
        decode_row(T, &raw[r * rb], ref.data(), in);
        for (int k = 0; k < in; k += 8) {
            float v[8];
            gpu::dq8<T>(&raw[r * rb], k, v);
            for (int i = 0; i < 8; ++i)
                if (v[i] != ref[k + i] && !(std::isnan(v[i]) && std::isnan(ref[k + i]))) {
                    if (bad++ < 5) printf("  %s row %d element %d: %g, reference %g\n", dtype_name(T), r, k + i, v[i], ref[k + i]);
                }
        }
    }
    printf("%-5s %s (%d rows of %d)\n", dtype_name(T), bad ? "FAIL" : "ok", rows, in);
    return bad;
}

}  // namespace

int main() {
    std::mt19937 rng(5);
    int bad = check<DType::Q4_K>(rng) + check<DType::Q5_K>(rng) + check<DType::Q6_K>(rng) + check<DType::Q8_0>(rng) +
              check<DType::Q4_0>(rng);
    return bad ? 1 : 0;
}
