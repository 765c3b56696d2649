// lucebench-gpu-op-check: every GPU op of core/cuda/gpu_ops.h, each kernel variant its launcher can select
// on this device, against the CPU reference (core/cpu/) on random inputs, odd sizes included so that the
// fallbacks run. The fused decode kernels are checked against compositions of the CPU reference ops.
// Prints one table row a check (op, variant, shape, error, tolerance) and exits 1 when any check fails.
// `--time-quant`: only the timing of matmul_quant on Qwen3.5-27B's shapes (time_quant). `--qmma`: only the
// checks of qmma_kernel, the 27B's shapes included (check_qmma_all).
//
// Error: max |gpu - cpu| / max |cpu| over the compared outputs. Tolerances: 1e-5 where the GPU computes in
// fp32 (different summation order, __expf), 1e-4 for the fused MLP's and DeltaNet's fixed-point sums, 5e-4 for
// the delta rule and attention (long chains of fp32 updates, softmax over hundreds of positions; the chunked
// and the recurrent delta rule differ in rounding), 2e-2 where the GPU rounds activations to the weight type
// (tensor-core GEMM and attention; qmma_kernel per element against sum |w| |x| instead, check_qmma: 1e-3 for
// q4_K's fp16 x, 1e-2 for q6_K's bf16, 2e-5 against its own contract), and the cache type's rounding for KV
// rows the GPU writes (bf16 8e-3, f16 1e-3, q8_0 2e-2, q4_0 0.15). A wrong index, mask or position shows as an
// error of 1e-2 and more.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/cpu/ops.h"
#include "core/cuda/fixed_point.cuh"
#include "core/cuda/draft_ops.h"
#include "core/cuda/gpu_ops.h"
#include "core/cuda/verify_ops.h"
#include "core/half.h"
#include "core/quant.h"
#include "gpu_check_util.h"

using namespace lb;

namespace {

gpuStream_t g_s;

struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
    float uni() {  // [-1, 1)
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        return float((s >> 40) & 0xFFFFFF) / float(1 << 23) - 1.f;
    }
    std::vector<float> vec(size_t n, float scale = 1.f) {
        std::vector<float> v(n);
        for (float& x : v) x = uni() * scale;
        return v;
    }
};

// Weights as the GPU holds them (wtype bits) and the same values as floats for the CPU reference.
uint16_t to_w(float f) {
#if defined(LB_GPU_FP16)
    return f32_to_f16(f);
#else
    return f32_to_bf16(f);
#endif
}
float from_w(uint16_t b) {
#if defined(LB_GPU_FP16)
    return f16_to_f32(b);
#else
    return bf16_to_f32(b);
#endif
}

template <class T>
struct Dev {
    T* p = nullptr;
    size_t n = 0;
    explicit Dev(size_t count) : n(count) { GPU_CHECK(gpuMalloc(&p, std::max<size_t>(1, n) * sizeof(T))); GPU_CHECK(gpuMemset(p, 0, std::max<size_t>(1, n) * sizeof(T))); }
    explicit Dev(const std::vector<T>& v) : Dev(v.size()) { up(v); }
    ~Dev() { (void)gpuFree(p); }
    Dev(const Dev&) = delete;
    Dev& operator=(const Dev&) = delete;
    void up(const std::vector<T>& v) { GPU_CHECK(gpuMemcpy(p, v.data(), v.size() * sizeof(T), gpuMemcpyHostToDevice)); }
    std::vector<T> down() const {
        GPU_CHECK(gpuStreamSynchronize(g_s));
        GPU_CHECK(gpuGetLastError());
        std::vector<T> v(n);
        GPU_CHECK(gpuMemcpy(v.data(), p, n * sizeof(T), gpuMemcpyDeviceToHost));
        return v;
    }
};

struct Mat {  // a weight matrix [rows, cols]
    std::vector<uint16_t> bits;
    std::vector<float> f;
    Dev<uint16_t> d;
    Mat(Rng& r, int rows, int cols, float scale)
        : bits(size_t(rows) * cols), f(size_t(rows) * cols), d(size_t(rows) * cols) {
        for (size_t i = 0; i < bits.size(); ++i) { bits[i] = to_w(r.uni() * scale); f[i] = from_w(bits[i]); }
        d.up(bits);
    }
    const gpu::wtype* w() const { return (const gpu::wtype*)d.p; }
};

double rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        num = std::max(num, double(std::fabs(got[i] - ref[i])));
        den = std::max(den, double(std::fabs(ref[i])));
        if (!std::isfinite(got[i])) return INFINITY;
    }
    return den > 0 ? num / den : num;
}

void report(const char* op, const std::string& variant, const std::string& shape, double err, double tol) {
    ++g_checks;
    const bool ok = err <= tol;
    if (!ok) ++g_failed;
    printf("| %-17s | %-38s | %-30s | %9.2e | %7.0e | %s |\n", op, variant.c_str(), shape.c_str(), err, tol,
           ok ? "ok" : "FAIL");
    fflush(stdout);
}

std::string shape(std::initializer_list<std::pair<const char*, long>> kv) {
    std::string s;
    for (auto& [k, v] : kv) s += (s.empty() ? "" : " ") + std::string(k) + "=" + std::to_string(v);
    return s;
}

std::vector<float> from_fix_all(const std::vector<unsigned long long>& a) {
    std::vector<float> r(a.size());
    for (size_t i = 0; i < a.size(); ++i) r[i] = float(double((long long)a[i]) / 4294967296.0);
    return r;
}
std::vector<unsigned long long> to_fix_all(const std::vector<float>& a) {
    std::vector<unsigned long long> r(a.size());
    for (size_t i = 0; i < a.size(); ++i) r[i] = (unsigned long long)(long long)std::llrint(double(a[i]) * 4294967296.0);
    return r;
}

double kv_tol(DType t) {
    switch (t) {
        case DType::F32: return 1e-5;
        case DType::F16: return 1e-3;
        case DType::BF16: return 8e-3;
        case DType::Q8_0: return 2e-2;
        default: return 0.15;
    }
}

// ----------------------------------------------------------------------------------------- prefill ops

void check_embed(Rng& r) {
    const int H = 1000, V = 300, n = 5;
    Mat E(r, V, H, 1.f);
    std::vector<int> tok = {7, 0, 299, 7, 123};
    Dev<int> dt(tok);
    Dev<float> x(size_t(n) * H);
    gpu::embed(dt.p, n, E.w(), H, x.p, g_s);
    std::vector<float> ref(size_t(n) * H);
    for (int t = 0; t < n; ++t) std::copy_n(&E.f[size_t(tok[t]) * H], H, &ref[size_t(t) * H]);
    report("embed", "embed_kernel", shape({{"n", n}, {"H", H}}), rel_err(x.down(), ref), 0);
}

void check_matmul(Rng& r, int n, int in, int out, bool acc, const char* variant, double tol) {
    Mat W(r, out, in, 0.05f);
    auto x = r.vec(size_t(n) * in), y0 = r.vec(size_t(n) * out);
    Dev<float> dx(x), dy(y0);
    gpu::matmul(dx.p, n, in, W.w(), out, dy.p, acc, g_s);
    std::vector<float> ref(size_t(n) * out);
    cpu::matmul(x.data(), n, in, W.f.data(), out, ref.data());
    if (acc)
        for (size_t i = 0; i < ref.size(); ++i) ref[i] += y0[i];
    report("matmul", std::string(variant) + (acc ? " +=" : ""), shape({{"n", n}, {"in", in}, {"out", out}}),
           rel_err(dy.down(), ref), tol);
}

// GGUF block matrices (matmul_quant.cu): random blocks (random bytes, fp16 scale fields set so that the values
// are O(0.05), centred for the k-quants with a min), the CPU reference decode_row (ggml's dequantisation) then
// cpu::matmul. The product goes to columns [col0, col0 + out) of rows of ldy floats, as a run of a matrix's rows.
std::vector<uint8_t> random_blocks(Rng& r, DType t, int rows, int in, std::vector<float>* values) {
    const size_t rb = dtype_row_bytes(t, size_t(in)), bb = dtype_block_bytes(t);
    std::vector<uint8_t> raw(rb * size_t(rows));
    for (auto& b : raw) b = uint8_t(int((r.uni() + 1.f) * 128.f) & 0xFF);
    auto put = [&](size_t at, float v) { const uint16_t h = f32_to_f16(v); std::memcpy(&raw[at], &h, 2); };
    for (size_t blk = 0; blk < raw.size() / bb; ++blk) {
        const size_t b0 = blk * bb;
        const float d = 0.05f * (0.75f + 0.5f * std::fabs(r.uni()));
        switch (t) {
            case DType::Q4_K: put(b0, d / 150.f); put(b0 + 2, d / 150.f * 7.5f); break;
            case DType::Q5_K: put(b0, d / 300.f); put(b0 + 2, d / 300.f * 15.5f); break;
            case DType::Q6_K: put(b0 + 208, d / 1500.f); break;
            case DType::Q8_0: put(b0, d / 64.f); break;
            case DType::Q4_0: put(b0, d / 5.f); break;
            default: {  // wtype: plain values
                for (size_t i = 0; i < bb / 2; ++i) {
                    const uint16_t w = to_w(r.uni() * 0.05f);
                    std::memcpy(&raw[b0 + 2 * i], &w, 2);
                }
            }
        }
    }
    values->resize(size_t(rows) * in);
    for (int i = 0; i < rows; ++i) {
        if (t == gpu::kWtypeDType)
            for (int k = 0; k < in; ++k) { uint16_t w; std::memcpy(&w, &raw[i * rb + 2 * k], 2); (*values)[size_t(i) * in + k] = from_w(w); }
        else
            decode_row(t, &raw[i * rb], &(*values)[size_t(i) * in], size_t(in));
    }
    return raw;
}

// The CPU reference of matmul_quant into a wider y: y0 with x [n, in] times W [out, in]^T written (acc: added)
// at columns col0 .. col0 + out of rows of ldy.
std::vector<float> matmul_into_reference(const std::vector<float>& x, int n, int in, const std::vector<float>& W,
                                         int out, const std::vector<float>& y0, int ldy, int col0, bool acc) {
    std::vector<float> prod(size_t(n) * out), ref = y0;
    cpu::matmul(x.data(), n, in, W.data(), out, prod.data());
    for (int i = 0; i < n; ++i)
        for (int c = 0; c < out; ++c) {
            float& dst = ref[size_t(i) * ldy + col0 + c];
            dst = (acc ? dst : 0.f) + prod[size_t(i) * out + c];
        }
    return ref;
}

// xscale: the activations' magnitude (qmv_kernel scales them by 2^80 and takes q4_K quants as subnormals)
void check_matmul_quant(Rng& r, DType t, int n, int in, int out, bool acc, int col0, int ldy, const char* variant,
                        double tol, int gemv = 8, float xscale = 1.f) {
    std::vector<float> Wf;
    std::vector<uint8_t> raw = random_blocks(r, t, out, in, &Wf);
    auto x = r.vec(size_t(n) * in), y0 = r.vec(size_t(n) * ldy);
    for (float& v : x) v *= xscale;
    for (float& v : y0) v *= xscale;
    Dev<uint8_t> dw(raw);
    Dev<float> dx(x), dy(y0);
    gpu::matmul_quant(dx.p, n, in, dw.p, t, out, dy.p + col0, ldy, acc, g_s, gemv);
    const std::vector<float> ref = matmul_into_reference(x, n, in, Wf, out, y0, ldy, col0, acc);
    report("matmul_quant", std::string(dtype_name(t) == std::string("bf16") || dtype_name(t) == std::string("f16") ? "wtype" : dtype_name(t)) + ", " + variant + (acc ? " +=" : ""),
           shape({{"n", n}, {"in", in}, {"out", out}}) + (ldy != out ? " ldy=" + std::to_string(ldy) : ""),
           rel_err(dy.down(), ref), tol);
}

#if !defined(__HIPCC__) && !defined(LB_USE_HIP) && !defined(LB_GPU_FP16)
// qmma_kernel's activations: r.vec's values, and by token t % 5: 1 times 1e4 (fp16 overflows at 65,504 unscaled),
// 2 times 1e-4 (fp16 subnormal below 6.1e-5 unscaled), 3 all zero, 4 super-blocks alternately times 1e4 and
// 1e-4 with every 7th element a further 1e-4 smaller (values 1e8 below their super-block's largest)
std::vector<float> qmma_activations(Rng& r, int n, int in) {
    std::vector<float> x = r.vec(size_t(n) * in);
    for (int t = 0; t < n; ++t)
        for (int k = 0; k < in; ++k) {
            float& v = x[size_t(t) * in + k];
            switch (t % 5) {
                case 1: v *= 1e4f; break;
                case 2: v *= 1e-4f; break;
                case 3: v = 0.f; break;
                case 4: v *= ((k / 256) % 2 ? 1e-4f : 1e4f) * (k % 7 == 0 ? 1e-4f : 1.f); break;
                default: break;
            }
        }
    return x;
}

// q4_K's activations as qmma_kernel takes them: each (token, super-block) times 2^e (its largest |x| times 2^e
// in [2^9, 2^10); all zero: e = 0; e <= 126), rounded to fp16, times 2^-e
std::vector<float> qmma_q4_staged(const std::vector<float>& x, int n, int in) {
    std::vector<float> r(x.size());
    for (int t = 0; t < n; ++t)
        for (int k0 = 0; k0 < in; k0 += 256) {
            const float* v = &x[size_t(t) * in + k0];
            float m = 0.f;
            for (int k = 0; k < 256; ++k) m = std::fmax(m, std::fabs(v[k]));
            uint32_t bits;
            std::memcpy(&bits, &m, 4);
            const int e = m > 0.f ? std::min(126, 136 - int(bits >> 23)) : 0;
            for (int k = 0; k < 256; ++k)
                r[size_t(t) * in + k0 + k] =
                    float(std::ldexp(double(f16_to_f32(f32_to_f16(std::ldexp(v[k], e)))), -e));
        }
    return r;
}

// max over the elements of |got - ref| / bound, where bound holds sum |w| |x| (+ |y0| where accumulated) of the
// element: an error stated against the magnitudes that the rounding of each operand scales with, so that rows
// of small activations are held to the same relative standard as large ones; an element whose bound is zero (a
// zero activation row not accumulated) must be exact. y outside the written columns keeps y0's |y0| as its bound
// (check_qmma): a write there shows as an error of order 1.
double bound_err(const std::vector<float>& got, const std::vector<float>& ref, const std::vector<float>& bound) {
    double e = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
        if (!std::isfinite(got[i])) return INFINITY;
        const double d = std::fabs(double(got[i]) - double(ref[i]));
        if (d > 0) e = std::max(e, bound[i] > 0 ? d / bound[i] : INFINITY);
    }
    return e;
}

// qmma_kernel (q4_K, q6_K, a verify's 5..72 rows) against the CPU reference twice, on activations of every
// magnitude (qmma_activations), errors per element against sum |w| |x| (bound_err): the plain reference (weights
// dequantised as ggml does, fp32 x) and the kernel's numerical contract, cpu::matmul on the operands it rounds
// (fp32 sums in another order: 2e-5, where a wrong element shows at ~1 / in >= 5.7e-5, a wrong order at ~1e-2):
//   q4_K: x rounded to fp16 after its (token, super-block) power-of-two scale (qmma_q4_staged), the weights
//   exact (sc q and the mins' term in the sums): the plain error is fp16's rounding of x, <= 2^-11 = 4.9e-4
//   of the bound (1e-3);
//   q6_K: weights and x rounded to bf16: 2^-9 each (1e-2).
// A second launch must equal the first bitwise (the split partials summed in a fixed order); one K split (the
// graph-capture path: the activations restaged chunk by chunk) against the contract.
void check_qmma(Rng& r, DType t, std::initializer_list<int> ns, int in, int out, bool acc, int col0, int ldy,
                const char* variant) {
    std::vector<float> Wf;
    std::vector<uint8_t> raw = random_blocks(r, t, out, in, &Wf);
    const bool q4 = t == DType::Q4_K;
    std::vector<float> W16, Wabs = Wf;  // q6_K's contract: the weights rounded to bf16 (q4_K's are exact)
    if (!q4) {
        W16 = Wf;
        for (float& v : W16) v = bf16_to_f32(f32_to_bf16(v));
    }
    const std::vector<float>& Wc = q4 ? Wf : W16;
    for (float& v : Wabs) v = std::fabs(v);
    Dev<uint8_t> dw(raw);
    for (const int n : ns) {
        const std::vector<float> x = qmma_activations(r, n, in);
        std::vector<float> y0 = r.vec(size_t(n) * ldy), xc = x, xabs = x, y0abs = y0;
        if (q4) xc = qmma_q4_staged(x, n, in);
        else
            for (float& v : xc) v = bf16_to_f32(f32_to_bf16(v));
        for (float& v : xabs) v = std::fabs(v);
        for (float& v : y0abs) v = std::fabs(v);
        Dev<float> dx(x), dy(y0), dy2(y0), dy1(y0);
        gpu::matmul_quant(dx.p, n, in, dw.p, t, out, dy.p + col0, ldy, acc, g_s, 2);
        gpu::matmul_quant(dx.p, n, in, dw.p, t, out, dy2.p + col0, ldy, acc, g_s, 2);
        gpu::matmul_quant(dx.p, n, in, dw.p, t, out, dy1.p + col0, ldy, acc, g_s, 5);
        auto reference = [&](const std::vector<float>& xs, const std::vector<float>& ws, const std::vector<float>& y) {
            return matmul_into_reference(xs, n, in, ws, out, y, ldy, col0, acc);
        };
        const std::vector<float> ref = reference(x, Wf, y0), refc = reference(xc, Wc, y0),
                                 bound = reference(xabs, Wabs, y0abs);
        const std::vector<float> got = dy.down(), again = dy2.down(), one = dy1.down();
        const std::string v = std::string(dtype_name(t)) + ", " + variant + (acc ? " +=" : "");
        const std::string sh =
            shape({{"n", n}, {"in", in}, {"out", out}}) + (ldy != out ? " ldy=" + std::to_string(ldy) : "");
        const std::string contract = q4 ? "fp16 x contract" : "bf16 contract";
        size_t differ = 0;
        for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &again[i], sizeof(float)) != 0;
        report("matmul_quant", v, sh, bound_err(got, ref, bound), q4 ? 1e-3 : 1e-2);
        report("matmul_quant", v + ": " + contract, sh, bound_err(got, refc, bound), 2e-5);
        report("matmul_quant", v + ": run to run (values differing)", sh, double(differ), 0);
        report("matmul_quant", v + ": one K split, " + contract, sh, bound_err(one, refc, bound), 2e-5);
    }
}

// A token's sums do not depend on the other token tiles (q4_K: its activations are scaled per token and
// super-block): the first `na` rows of an `nb`-row product (nb > 32) equal the `na`-row product (na <= 32)
// bitwise, both in one K split (the split count is part of the numerics, the tile count is not). The shapes
// keep the last round of row groups at 15-16 warps a block, so that no group is split over warps (qmma_kernel's
// tail at up to 3 tiles, whose sums follow the grid).
void check_qmma_tiles(Rng& r, DType t, int na, int nb, int in, int out, const char* variant) {
    std::vector<float> Wf;
    std::vector<uint8_t> raw = random_blocks(r, t, out, in, &Wf);
    Dev<uint8_t> dw(raw);
    Dev<float> dx(qmma_activations(r, nb, in)), dya(std::vector<float>(size_t(na) * out)),
        dyb(std::vector<float>(size_t(nb) * out));
    gpu::matmul_quant(dx.p, na, in, dw.p, t, out, dya.p, out, false, g_s, 5);
    gpu::matmul_quant(dx.p, nb, in, dw.p, t, out, dyb.p, out, false, g_s, 5);
    const std::vector<float> a = dya.down(), b = dyb.down();
    size_t differ = 0;
    for (size_t i = 0; i < a.size(); ++i) differ += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
    report("matmul_quant",
           std::string(dtype_name(t)) + ", " + variant + ": " + std::to_string(na) + " rows = the first of " +
               std::to_string(nb) + " (values differing)",
           shape({{"in", in}, {"out", out}}), double(differ), 0);
}

// `--qmma`: qmma_kernel alone, on the 27B's shapes (the LM head's rows cut to 20,000) at a verify's row counts
// and on odd shapes (rows not a multiple of 16, one super-block, a column offset of a wider y, accumulate).
void check_qmma_all(Rng& r) {
    struct Case { const char* name; DType t; int out, in; };
    const Case big[] = {{"27B gate_up", DType::Q4_K, 34816, 5120}, {"27B in-proj", DType::Q4_K, 16480, 5120},
                        {"27B qkv", DType::Q4_K, 14336, 5120},     {"27B ffn_down", DType::Q4_K, 5120, 17408},
                        {"27B ffn_down", DType::Q6_K, 5120, 17408}, {"27B o / ssm_out", DType::Q4_K, 5120, 6144},
                        {"27B lm_head (20000 rows)", DType::Q6_K, 20000, 5120}};
    for (const Case& c : big) check_qmma(r, c.t, {9, 23, 41}, c.in, c.out, false, 0, c.out, c.name);
    for (DType t : {DType::Q4_K, DType::Q6_K}) {
        check_qmma(r, t, {5, 9, 16, 23, 33, 41, 72}, 1280, 1000, false, 0, 1000, "1000 rows, 5 super-blocks");
        check_qmma(r, t, {5, 9, 16, 23, 33, 41, 72}, 256, 77, true, 3, 90, "77 rows, 1 super-block, at column 3");
        check_qmma(r, t, {5, 9, 16, 23, 33, 41, 72}, 17408, 309, true, 0, 309, "309 rows, 68 super-blocks");
    }
    for (DType t : {DType::Q4_K, DType::Q6_K}) {
        check_qmma_tiles(r, t, 23, 33, 5120, 2000, "qmma_kernel, tile count");
        check_qmma_tiles(r, t, 5, 72, 1280, 1000, "qmma_kernel, tile count");
    }
    // the decode row counts (1..4) through the hook, the kernel's first tile partly empty
    for (DType t : {DType::Q4_K, DType::Q6_K})
        check_qmma(r, t, {1, 2, 4}, 5120, 1000, false, 0, 1000, "1000 rows at decode's row counts");
    // the last round's groups split over several warps each (qmma_kernel's tail): one round (5 groups of 3
    // warps), and two rounds (2 super-blocks: 2 warps a group)
    for (DType t : {DType::Q4_K, DType::Q6_K}) {
        check_qmma(r, t, {9, 33}, 1024, 77, true, 2, 80, "77 rows, the last round's groups over 3 warps");
        check_qmma(r, t, {9, 41}, 512, 40000, false, 0, 40000, "40000 rows, the last round's groups over 2 warps");
    }
}
#endif

// The decode step's RMSNorm folded into the GEMV after it (matmul_quant_rmsnorm, n = 1): against the CPU
// rmsnorm then matmul, and against the GPU's rmsnorm_kernel then matmul_quant, which it must equal bitwise
// (the fold computes the same normalised x and the same sums; greedy decoding then cannot change). swiglu:
// the MLP's gate_up with silu_mul folded in too (out / 2 outputs; the unfused path ends with silu_mul_kernel).
void check_matmul_quant_rmsnorm(Rng& r, DType t, int in, int out, bool acc, const char* variant, bool swiglu = false) {
    std::vector<float> Wf;
    std::vector<uint8_t> raw = random_blocks(r, t, out, in, &Wf);
    const int ny = swiglu ? out / 2 : out;
    auto x = r.vec(size_t(in), 3.f), g = r.vec(size_t(in)), y0 = r.vec(size_t(ny));
    Dev<uint8_t> dw(raw);
    Dev<float> dx(x), dg(g), dy(y0), dy2(y0), dh{size_t(in)}, dgu{size_t(out)};
    const std::string v = std::string(dtype_name(t)) + ", " + variant + (acc ? " +=" : "");
    const std::string sh = shape({{"in", in}, {"out", out}});
    if (!gpu::matmul_quant_rmsnorm(dx.p, dg.p, 1e-6f, in, dw.p, t, out, dy.p, out, acc, g_s, swiglu)) {
        report("matmul_quant_rmsnorm", v + ": refused", sh, 1, 0);
        return;
    }
    gpu::rmsnorm(dx.p, dg.p, dh.p, 1, in, 1e-6f, g_s);
    if (swiglu) {
        gpu::matmul_quant(dh.p, 1, in, dw.p, t, out, dgu.p, out, false, g_s);
        gpu::silu_mul(dgu.p, 1, ny, dy2.p, g_s);
    } else {
        gpu::matmul_quant(dh.p, 1, in, dw.p, t, out, dy2.p, out, acc, g_s);
    }
    std::vector<float> h(static_cast<size_t>(in)), prod(static_cast<size_t>(out)), ref = y0;
    cpu::rmsnorm(x.data(), g.data(), h.data(), 1, in, 1e-6f);
    cpu::matmul(h.data(), 1, in, Wf.data(), out, prod.data());
    for (int c = 0; c < ny; ++c) {
        const float p = swiglu ? cpu::silu(prod[size_t(c)]) * prod[size_t(ny + c)] : prod[size_t(c)];
        ref[size_t(c)] = (acc ? ref[size_t(c)] : 0.f) + p;
    }
    const std::vector<float> got = dy.down(), unfused = dy2.down();
    double diff = 0;
    for (int c = 0; c < ny; ++c) diff = std::max(diff, double(std::fabs(got[size_t(c)] - unfused[size_t(c)])));
    report("matmul_quant_rmsnorm", v, sh, rel_err(got, ref), 1e-5);
    report("matmul_quant_rmsnorm", v + ": = unfused (max |diff|)", sh, diff, 0);
}

void check_embed_quant(Rng& r, DType t) {
    const int H = 768, V = 300, n = 5;
    std::vector<float> Ef;
    std::vector<uint8_t> raw = random_blocks(r, t, V, H, &Ef);
    std::vector<int> tok = {7, 0, 299, 7, 123};
    Dev<uint8_t> de(raw);
    Dev<int> dt(tok);
    Dev<float> x(size_t(n) * H);
    gpu::embed_quant(dt.p, n, de.p, t, H, x.p, g_s);
    std::vector<float> ref(size_t(n) * H);
    for (int i = 0; i < n; ++i) std::copy_n(&Ef[size_t(tok[i]) * H], H, &ref[size_t(i) * H]);
    report("embed_quant", std::string("embed_quant_kernel<") + dtype_name(t) + ">", shape({{"n", n}, {"H", H}}),
           rel_err(x.down(), ref), 1e-6);
}

void check_heads_to_tiled(Rng& r, int n, int nk, int nv, int ph) {
    const int w = nv * ph;
    auto x = r.vec(size_t(n) * w);
    Dev<float> dx(x), dy(size_t(n) * w);
    gpu::heads_to_tiled(dx.p, n, nk, nv, ph, dy.p, g_s);
    std::vector<float> ref(x.size());
    const int rr = nv / nk;
    for (int t = 0; t < n; ++t)
        for (int kh = 0; kh < nk; ++kh)
            for (int j = 0; j < rr; ++j)
                for (int e = 0; e < ph; ++e)
                    ref[size_t(t) * w + (j * nk + kh) * ph + e] = x[size_t(t) * w + (kh * rr + j) * ph + e];
    report("heads_to_tiled", "heads_to_tiled_kernel", shape({{"n", n}, {"nk", nk}, {"nv", nv}, {"per_head", ph}}),
           rel_err(dy.down(), ref), 0);
}

void check_rmsnorm(Rng& r, int rows, int dim) {
    auto x = r.vec(size_t(rows) * dim, 3.f), g = r.vec(dim);
    Dev<float> dx(x), dg(g), dy(x.size());
    gpu::rmsnorm(dx.p, dg.p, dy.p, rows, dim, 1e-6f, g_s);
    std::vector<float> ref(x.size());
    cpu::rmsnorm(x.data(), g.data(), ref.data(), rows, dim, 1e-6f);
    report("rmsnorm", "rmsnorm_kernel", shape({{"rows", rows}, {"dim", dim}}), rel_err(dy.down(), ref), 1e-5);
}

// tiled_nk > 0: the heads written in heads_to_tiled's order (the verify's tiled out_proj input), against the
// CPU norm's rows with their heads so permuted.
void check_gated_rmsnorm(Rng& r, int n, int heads, int dim, int tiled_nk = 0) {
    const int ldz = heads * dim + 16;
    auto x = r.vec(size_t(n) * heads * dim, 2.f), z = r.vec(size_t(n) * ldz, 3.f), g = r.vec(dim);
    Dev<float> dx(x), dz(z), dg(g), dy(x.size());
    gpu::gated_rmsnorm(dx.p, dz.p, ldz, dg.p, dy.p, n, heads, dim, 1e-6f, g_s, tiled_nk);
    std::vector<float> zc(x.size()), ref(x.size());
    for (int t = 0; t < n; ++t) std::copy_n(&z[size_t(t) * ldz], heads * dim, &zc[size_t(t) * heads * dim]);
    cpu::gated_rmsnorm(x.data(), zc.data(), g.data(), ref.data(), n * heads, dim, 1e-6f);
    if (tiled_nk > 0) {
        const int rr = heads / tiled_nk;
        std::vector<float> perm(ref.size());
        for (int t = 0; t < n; ++t)
            for (int h = 0; h < heads; ++h)
                std::copy_n(&ref[(size_t(t) * heads + h) * dim], dim,
                            &perm[(size_t(t) * heads + (h % rr) * tiled_nk + h / rr) * dim]);
        ref = perm;
    }
    report("gated_rmsnorm", tiled_nk > 0 ? "gated_rmsnorm_kernel (tiled heads)" : "gated_rmsnorm_kernel",
           shape({{"n", n}, {"heads", heads}, {"dim", dim}, {"ldz", ldz}, {"nk", tiled_nk}}), rel_err(dy.down(), ref), 1e-5);
}

void check_conv1d(Rng& r, int n, int C, int K) {
    const int ldx = C + 5;
    auto x = r.vec(size_t(n) * ldx, 2.f), w = r.vec(size_t(C) * K), st = r.vec(size_t(C) * (K - 1));
    Dev<float> dx(x), dw(w), dst(st), dy(size_t(n) * C);
    gpu::conv1d_silu(dx.p, ldx, n, C, K, dw.p, dst.p, dy.p, g_s);
    std::vector<float> xc(size_t(n) * C), ref(size_t(n) * C), st_ref = st;
    for (int t = 0; t < n; ++t) std::copy_n(&x[size_t(t) * ldx], C, &xc[size_t(t) * C]);
    cpu::causal_conv1d_silu(xc.data(), n, C, K, w.data(), st_ref.data(), ref.data());
    std::vector<float> got = dy.down(), gst = dst.down();
    got.insert(got.end(), gst.begin(), gst.end());
    ref.insert(ref.end(), st_ref.begin(), st_ref.end());
    report("conv1d_silu", "conv1d_silu_par_kernel<" + std::to_string(K) + ">",
           shape({{"n", n}, {"C", C}, {"K", K}, {"ldx", ldx}}), rel_err(got, ref), 1e-5);
}

// The DeltaNet prologue on the CPU: q, k L2-normalised (q scaled), beta and g from the projection row.
void cpu_deltanet_prep(std::vector<float>& y, int ldy, const std::vector<float>& proj, int ldp, int b_off,
                       const std::vector<float>& negA, const std::vector<float>& dt, int n, int hk, int dk, int hv,
                       std::vector<float>* g, std::vector<float>* beta) {
    for (int t = 0; t < n; ++t) {
        float* row = &y[size_t(t) * ldy];
        cpu::l2norm(row, 2 * hk, dk, 1e-6f);
        for (int i = 0; i < hk * dk; ++i) row[i] *= 1.f / std::sqrt(float(dk));
        for (int h = 0; h < hv; ++h) {
            (*beta)[size_t(t) * hv + h] = cpu::sigmoid(proj[size_t(t) * ldp + b_off + h]);
            (*g)[size_t(t) * hv + h] = negA[h] * cpu::softplus(proj[size_t(t) * ldp + b_off + hv + h] + dt[h]);
        }
    }
}

void check_deltanet_prep(Rng& r) {
    const int n = 5, hk = 2, dk = 128, hv = 4, dv = 64, ldy = 2 * hk * dk + hv * dv, ldp = ldy + 40, b_off = 17;
    auto y = r.vec(size_t(n) * ldy, 2.f), proj = r.vec(size_t(n) * ldp, 3.f), negA = r.vec(hv), dt = r.vec(hv);
    for (float& a : negA) a = -std::fabs(a) - 0.1f;
    Dev<float> dy(y), dp(proj), dn(negA), ddt(dt), dg(size_t(n) * hv), db(size_t(n) * hv);
    gpu::deltanet_prep(dy.p, ldy, dp.p, ldp, b_off, dn.p, ddt.p, n, hk, dk, hv, dg.p, db.p, g_s);
    std::vector<float> g(size_t(n) * hv), beta(size_t(n) * hv), yr = y;
    cpu_deltanet_prep(yr, ldy, proj, ldp, b_off, negA, dt, n, hk, dk, hv, &g, &beta);
    std::vector<float> got = dy.down(), gg = dg.down(), gb = db.down();
    report("deltanet_prep", "deltanet_prep_kernel (q, k)", shape({{"n", n}, {"hk", hk}, {"dk", dk}}), rel_err(got, yr), 1e-5);
    got = gg; got.insert(got.end(), gb.begin(), gb.end());
    g.insert(g.end(), beta.begin(), beta.end());
    report("deltanet_prep", "deltanet_prep_kernel (g, beta)", shape({{"n", n}, {"hv", hv}}), rel_err(got, g), 1e-5);
}

// delta_rule on normalised q, k rows; `capture`: launched inside a stream capture, where the two-pass
// form's chunk buffer cannot grow, so the launcher takes the one-pass column kernel.
void check_delta_rule(Rng& r, int n, int hk, int hv, int dk, int dv, const char* variant, bool capture = false) {
    const int ld = 2 * hk * dk + hv * dv + 8;
    auto qkv = r.vec(size_t(n) * ld);
    for (int t = 0; t < n; ++t) cpu::l2norm(&qkv[size_t(t) * ld], 2 * hk, dk, 1e-6f);
    auto g = r.vec(size_t(n) * hv), beta = r.vec(size_t(n) * hv), st = r.vec(size_t(hv) * dk * dv, 0.5f);
    for (float& x : g) x = -0.3f * std::fabs(x);
    for (float& x : beta) x = 0.5f + 0.5f * x;
    Dev<float> dq(qkv), dg(g), db(beta), dst(st), dout(size_t(n) * hv * dv);
    if (capture) {
        gpuGraph_t graph;
        gpuGraphExec_t exec;
#if defined(__HIPCC__) || defined(LB_USE_HIP)
        GPU_CHECK(hipStreamBeginCapture(g_s, hipStreamCaptureModeRelaxed));
#else
        GPU_CHECK(cudaStreamBeginCapture(g_s, cudaStreamCaptureModeRelaxed));  // the launcher may set kernel attributes
#endif
        gpu::delta_rule(dq.p, ld, n, hk, hv, dk, dv, dg.p, db.p, dst.p, dout.p, g_s);
        GPU_CHECK(gpuStreamEndCapture(g_s, &graph));
        GPU_CHECK(gpuGraphInstantiate(&exec, graph));
        GPU_CHECK(gpuGraphLaunch(exec, g_s));
        GPU_CHECK(gpuStreamSynchronize(g_s));
        GPU_CHECK(gpuGraphExecDestroy(exec));
        GPU_CHECK(gpuGraphDestroy(graph));
    } else {
        gpu::delta_rule(dq.p, ld, n, hk, hv, dk, dv, dg.p, db.p, dst.p, dout.p, g_s);
    }
    std::vector<float> q(size_t(n) * hk * dk), k(q.size()), v(size_t(n) * hv * dv), ref(v.size()), st_ref = st;
    for (int t = 0; t < n; ++t) {
        const float* row = &qkv[size_t(t) * ld];
        std::copy_n(row, hk * dk, &q[size_t(t) * hk * dk]);
        std::copy_n(row + hk * dk, hk * dk, &k[size_t(t) * hk * dk]);
        std::copy_n(row + 2 * hk * dk, hv * dv, &v[size_t(t) * hv * dv]);
    }
    cpu::delta_rule_recurrent(q.data(), k.data(), v.data(), g.data(), beta.data(), n, hk, hv, dk, dv, st_ref.data(),
                              ref.data());
    std::vector<float> got = dout.down(), gst = dst.down();
    report("delta_rule", std::string(variant) + " (out)", shape({{"n", n}, {"hk", hk}, {"hv", hv}, {"dk", dk}, {"dv", dv}}),
           rel_err(got, ref), 5e-4);
    report("delta_rule", std::string(variant) + " (state)", shape({{"n", n}, {"dk", dk}, {"dv", dv}}), rel_err(gst, st_ref), 5e-4);
}

// ----------------------------------------------------------------------------------------- attention

struct Cache {  // K and V caches [ctx, nkv, hd] of type t, random rows at positions [0, filled)
    DType t;
    size_t row;
    std::vector<uint8_t> k, v;
    Cache(Rng& r, DType type, int ctx, int nkv, int hd, int filled) : t(type), row(dtype_row_bytes(type, hd)) {
        k.assign(size_t(ctx) * nkv * row, 0);
        v.assign(k.size(), 0);
        for (int p = 0; p < filled; ++p)
            for (int j = 0; j < nkv; ++j) {
                auto a = r.vec(hd, 2.f), b = r.vec(hd);
                encode_row(t, a.data(), &k[(size_t(p) * nkv + j) * row], size_t(hd));
                encode_row(t, b.data(), &v[(size_t(p) * nkv + j) * row], size_t(hd));
            }
    }
};

// The CPU attention over q heads taken from qkv rows [q (hd), gate (hd)] per head, times sigmoid(gate)
// (gated), or from rows [q (hd)] per head (not gated: Qwen3).
std::vector<float> cpu_attention(const std::vector<float>& qkv, int ld, int n, int nh, int nkv, int hd, int pos0,
                                 const std::vector<uint8_t>& kc, const std::vector<uint8_t>& vc, DType t,
                                 bool gated = true) {
    const int qs = gated ? 2 : 1;
    std::vector<float> q(size_t(n) * nh * hd), out(q.size());
    for (int i = 0; i < n; ++i)
        for (int h = 0; h < nh; ++h) std::copy_n(&qkv[size_t(i) * ld + size_t(h) * qs * hd], hd, &q[(size_t(i) * nh + h) * hd]);
    cpu::attention(q.data(), n, nh, nkv, hd, pos0, kc.data(), t, vc.data(), t, out.data());
    if (!gated) return out;
    for (int i = 0; i < n; ++i)
        for (int h = 0; h < nh; ++h)
            for (int e = 0; e < hd; ++e)
                out[(size_t(i) * nh + h) * hd + e] *= cpu::sigmoid(qkv[size_t(i) * ld + size_t(h) * 2 * hd + hd + e]);
    return out;
}

// attn_prep on the CPU: per-head RMSNorm and partial RoPE of q and k at positions pos0.., the K and V rows
// encoded into the caches.
void cpu_attn_prep(std::vector<float>& qkv, int ld, int n, int nh, int nkv, int hd, int rot, float theta,
                   const std::vector<float>& qg, const std::vector<float>& kg, int pos0, Cache& c, bool gated = true) {
    const int qs = gated ? 2 : 1;
    for (int i = 0; i < n; ++i) {
        float* row = &qkv[size_t(i) * ld];
        for (int h = 0; h < nh; ++h) {
            float* q = row + size_t(h) * qs * hd;
            cpu::rmsnorm(q, qg.data(), q, 1, hd, 1e-6f);
            cpu::rope(q, 1, 1, hd, rot, theta, pos0 + i);
        }
        for (int j = 0; j < nkv; ++j) {
            float* k = row + size_t(qs * nh) * hd + size_t(j) * hd;
            const float* v = row + size_t(qs * nh + nkv) * hd + size_t(j) * hd;
            cpu::rmsnorm(k, kg.data(), k, 1, hd, 1e-6f);
            cpu::rope(k, 1, 1, hd, rot, theta, pos0 + i);
            const size_t r = size_t(pos0 + i) * nkv + j;
            encode_row(c.t, k, &c.k[r * c.row], size_t(hd));
            encode_row(c.t, v, &c.v[r * c.row], size_t(hd));
        }
    }
}

std::vector<float> decode_rows(const std::vector<uint8_t>& c, DType t, size_t row, size_t r0, size_t r1, int hd) {
    std::vector<float> f((r1 - r0) * hd);
    for (size_t r = r0; r < r1; ++r) decode_row(t, &c[r * row], &f[(r - r0) * hd], size_t(hd));
    return f;
}

// The verify's tree delta rule (verify_ops.h delta_tree) on normalised q, k rows against cpu::delta_rule_tree:
// a random tree (parents first) or a chain, outputs starting as NaN (an element not written fails); `kernel`
// as delta_tree's (Auto: the launcher's choice; or one named). Run twice: bit-identical.
void check_delta_tree(Rng& r, int n, int hk, int hv, int dk, int dv, bool chain, gpu::DeltaTreeKernel kernel,
                      const char* variant) {
    const int kd = hk * dk, vd = hv * dv, ld = 2 * kd + vd + 3;
    std::vector<int> parent(static_cast<size_t>(n));
    std::vector<unsigned char> vis(size_t(n) * n, 0);
    for (int i = 0; i < n; ++i) {
        parent[size_t(i)] = chain ? i - 1 : i == 0 ? -1 : std::min(i - 1, int((r.uni() + 1.f) * 0.5f * float(i)));
        for (int a = i; a >= 0; a = parent[size_t(a)]) vis[size_t(i) * n + a] = 1;
    }
    auto qkv = r.vec(size_t(n) * ld);
    std::vector<float> g(size_t(n) * hv), beta(size_t(n) * hv), q(size_t(n) * kd), k(size_t(n) * kd), v(size_t(n) * vd);
    for (auto& e : g) e = -1.5f * (r.uni() + 1.f);
    for (auto& e : beta) e = 0.5f * (r.uni() + 1.f);
    for (int t = 0; t < n; ++t) {
        float* row = &qkv[size_t(t) * ld];
        cpu::l2norm(row, 2 * hk, dk, 1e-6f);
        for (int i = 0; i < kd; ++i) row[i] *= 1.f / std::sqrt(float(dk));
        std::copy(row, row + kd, &q[size_t(t) * kd]);
        std::copy(row + kd, row + 2 * kd, &k[size_t(t) * kd]);
        std::copy(row + 2 * kd, row + 2 * kd + vd, &v[size_t(t) * vd]);
    }
    const auto state = r.vec(size_t(hv) * dk * dv, 0.3f);
    std::vector<float> out(size_t(n) * vd), u(size_t(n) * vd), gamma(size_t(n) * hv);
    cpu::delta_rule_tree(q.data(), k.data(), v.data(), g.data(), beta.data(), n, hk, hv, dk, dv, parent.data(),
                         state.data(), out.data(), u.data(), gamma.data());
    const std::vector<float> nan_out(out.size(), NAN), nan_gamma(gamma.size(), NAN), nan_k(k.size(), NAN);
    Dev<float> dq(qkv), dg(g), db(beta), ds(state), dout(nan_out), du(nan_out), dgam(nan_gamma), dkk(nan_k),
        dscr(gpu::delta_tree_scratch(n, hv));
    Dev<int> dp(parent);
    Dev<unsigned char> dvis(vis);
    auto run = [&] {
        gpu::delta_tree(dq.p, ld, n, hk, hv, dk, dv, dg.p, db.p, dp.p, dvis.p, ds.p, dout.p, du.p, dgam.p, dkk.p, dscr.p,
                        g_s, kernel);
        return std::vector<std::vector<float>>{dout.down(), du.down(), dgam.down(), dkk.down()};
    };
    const auto first = run(), again = run();
    bool same = true;
    for (size_t i = 0; i < first.size(); ++i)
        same = same && memcmp(first[i].data(), again[i].data(), first[i].size() * sizeof(float)) == 0;
    const std::string name = std::string(variant) + (chain ? ", chain" : ", tree") + (same ? "" : " NOT REPEATABLE");
    const std::string sh = shape({{"n", n}, {"hk", hk}, {"hv", hv}, {"dk", dk}, {"dv", dv}});
    report("delta_tree", name + " (out)", sh, same ? rel_err(first[0], out) : INFINITY, 5e-4);
    report("delta_tree", name + " (u)", sh, rel_err(first[1], u), 5e-4);
    report("delta_tree", name + " (gamma)", sh, rel_err(first[2], gamma), 1e-6);
    report("delta_tree", name + " (k kept)", sh, rel_err(first[3], k), 0);
}

// The verify's conv + DeltaNet prologue in one launch (verify_ops.h conv_tree_prep) against the CPU's
// causal_conv1d_silu_tree then cpu_deltanet_prep on a random tree, and against the GPU's two kernels
// (conv_tree, deltanet_prep): the same operations, so bit-identical. `variant`: the path conv_tree_prep takes.
void check_conv_tree_prep(Rng& r, int n, int hk, int dk, int hv, int dv, int K, const char* variant) {
    const int C = 2 * hk * dk + hv * dv, ldx = C + 2 * hv + 7, b_off = C + 5;
    std::vector<int> parent(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) parent[size_t(i)] = i == 0 ? -1 : std::min(i - 1, int((r.uni() + 1.f) * 0.5f * float(i)));
    auto x = r.vec(size_t(n) * ldx, 2.f), w = r.vec(size_t(C) * K, 0.5f), state = r.vec(size_t(C) * (K - 1));
    auto negA = r.vec(hv), dt = r.vec(hv);
    for (float& a : negA) a = -std::fabs(a) - 0.1f;
    std::vector<float> xc(size_t(n) * C), y(size_t(n) * C), g(size_t(n) * hv), beta(size_t(n) * hv);
    for (int t = 0; t < n; ++t) std::copy(&x[size_t(t) * ldx], &x[size_t(t) * ldx] + C, &xc[size_t(t) * C]);
    cpu::causal_conv1d_silu_tree(xc.data(), n, C, K, w.data(), state.data(), parent.data(), y.data());
    cpu_deltanet_prep(y, C, x, ldx, b_off, negA, dt, n, hk, dk, hv, &g, &beta);
    Dev<float> dx(x), dw(w), ds(state), dn(negA), ddt(dt);
    Dev<int> dp(parent);
    auto gpu_run = [&](bool fused) {
        Dev<float> dy(std::vector<float>(y.size(), NAN)), dkeep(std::vector<float>(xc.size(), NAN)),
            dg(std::vector<float>(g.size(), NAN)), db(std::vector<float>(beta.size(), NAN));
        if (fused) {
            gpu::conv_tree_prep(dx.p, ldx, n, K, dw.p, ds.p, dp.p, dy.p, dkeep.p, hk, dk, hv, dv, b_off, dn.p, ddt.p, dg.p,
                                db.p, g_s);
        } else {
            gpu::conv_tree(dx.p, ldx, n, C, K, dw.p, ds.p, dp.p, dy.p, dkeep.p, g_s);
            gpu::deltanet_prep(dy.p, C, dx.p, ldx, b_off, dn.p, ddt.p, n, hk, dk, hv, dg.p, db.p, g_s);
        }
        return std::vector<std::vector<float>>{dy.down(), dkeep.down(), dg.down(), db.down()};
    };
    const auto got = gpu_run(true), two = gpu_run(false);
    bool same = true;
    for (size_t i = 0; i < got.size(); ++i)
        same = same && memcmp(got[i].data(), two[i].data(), got[i].size() * sizeof(float)) == 0;
    const std::string sh = shape({{"n", n}, {"hk", hk}, {"dk", dk}, {"hv", hv}, {"dv", dv}, {"K", K}});
    const std::string name = std::string(variant) + (same ? "" : " NOT EQUAL TO conv_tree + prep");
    report("conv_tree_prep", name + " (y)", sh, same ? rel_err(got[0], y) : INFINITY, 1e-5);
    report("conv_tree_prep", name + " (kept x)", sh, rel_err(got[1], xc), 0);
    std::vector<float> gb = got[2], want = g;
    gb.insert(gb.end(), got[3].begin(), got[3].end());
    want.insert(want.end(), beta.begin(), beta.end());
    report("conv_tree_prep", name + " (g, beta)", sh, rel_err(gb, want), 1e-5);
}

void check_attn_prep(Rng& r, int n, int nh, int nkv, int hd, int rot, DType t, const char* variant, bool gated = true) {
    const int qs = gated ? 2 : 1;
    const int ld = (qs * nh + 2 * nkv) * hd, pos0 = 3, ctx = pos0 + n + 2;
    const float theta = 1e7f;
    auto qkv = r.vec(size_t(n) * ld, 2.f), qg = r.vec(hd), kg = r.vec(hd);
    Cache c(r, t, ctx, nkv, hd, pos0);
    Dev<float> dq(qkv), dqg(qg), dkg(kg);
    Dev<uint8_t> dkc(c.k), dvc(c.v);
    Dev<int> dpos(std::vector<int>{pos0});
    gpu::attn_prep(dq.p, ld, n, nh, nkv, hd, rot, theta, dqg.p, dkg.p, 1e-6f, dpos.p, dkc.p, t, dvc.p, t, g_s, gated);
    std::vector<float> ref = qkv;
    cpu_attn_prep(ref, ld, n, nh, nkv, hd, rot, theta, qg, kg, pos0, c, gated);
    std::vector<float> got = dq.down(), gq, rq;
    for (int i = 0; i < n; ++i) {  // the q heads (the k rows are checked in the cache)
        gq.insert(gq.end(), &got[size_t(i) * ld], &got[size_t(i) * ld + qs * nh * hd]);
        rq.insert(rq.end(), &ref[size_t(i) * ld], &ref[size_t(i) * ld + qs * nh * hd]);
    }
    const std::string sh = shape({{"n", n}, {"nh", nh}, {"nkv", nkv}, {"hd", hd}, {"rot", rot}});
    report("attn_prep", std::string(variant) + " (q)", sh, rel_err(gq, rq), 1e-5);
    const size_t r0 = size_t(pos0) * nkv, r1 = size_t(pos0 + n) * nkv;
    auto gk = decode_rows(dkc.down(), t, c.row, r0, r1, hd), rk = decode_rows(c.k, t, c.row, r0, r1, hd);
    auto gv = decode_rows(dvc.down(), t, c.row, r0, r1, hd), rv = decode_rows(c.v, t, c.row, r0, r1, hd);
    gk.insert(gk.end(), gv.begin(), gv.end());
    rk.insert(rk.end(), rv.begin(), rv.end());
    report("attn_prep", std::string(variant) + " (K, V " + dtype_name(t) + ")", sh, rel_err(gk, rk), kv_tol(t));
}

const char* attention_kernel_name(gpu::AttentionKernel k) {
    switch (k) {
        case gpu::AttentionKernel::Flash: return "flash_attention_kernel";
        case gpu::AttentionKernel::Wmma: return "attention_wmma_kernel";
        case gpu::AttentionKernel::Tiled: return "attention_tiled_kernel";
        case gpu::AttentionKernel::Rows: return "attention_kernel";
        default: return "auto";
    }
}

// Prefill attention through kernel k (Auto: the one attention() picks, named in the row) for n rows at
// positions pos0.. (pos0 > 0: a chunk continuing a cached prefix).
void check_attention(Rng& r, int n, int nh, int nkv, int hd, DType t, gpu::AttentionKernel k, double tol,
                     bool gated = true, int pos0 = 9, const char* note = "") {
    const int ld = ((gated ? 2 : 1) * nh + 2 * nkv) * hd, ctx = pos0 + n;
    auto qkv = r.vec(size_t(n) * ld, 0.5f);
    Cache c(r, t, ctx, nkv, hd, ctx);
    Dev<float> dq(qkv), dout(size_t(n) * nh * hd);
    Dev<uint8_t> dkc(c.k), dvc(c.v);
    Dev<int> dpos(std::vector<int>{pos0});
    const gpu::AttentionKernel ran = k == gpu::AttentionKernel::Auto ? gpu::attention_kernel_for(n, nh, nkv, hd, ld) : k;
    gpu::attention_with(k, dq.p, ld, n, nh, nkv, hd, dpos.p, dkc.p, t, dvc.p, t, dout.p, g_s, gated);
    auto ref = cpu_attention(qkv, ld, n, nh, nkv, hd, pos0, c.k, c.v, t, gated);
    std::string variant = attention_kernel_name(ran);
    if (ran != gpu::AttentionKernel::Rows) variant += "<" + std::to_string(hd) + ">";
    variant += std::string(note) + (gated ? " (" : ", no gate (") + dtype_name(t) + ")";
    report("attention", variant, shape({{"n", n}, {"nh", nh}, {"nkv", nkv}, {"hd", hd}, {"pos0", pos0}}),
           rel_err(dout.down(), ref), tol);
}

// The kernel attention() picks for the engines' prefill shapes (a regression to a slower kernel fails here).
void check_attention_choice(int n, int nh, int nkv, int hd, bool gated, gpu::AttentionKernel want) {
    const int ld = ((gated ? 2 : 1) * nh + 2 * nkv) * hd;
    const gpu::AttentionKernel got = gpu::attention_kernel_for(n, nh, nkv, hd, ld);
    report("attention", std::string("choice: ") + attention_kernel_name(got) + " (want " + attention_kernel_name(want) + ")",
           shape({{"n", n}, {"nh", nh}, {"nkv", nkv}, {"hd", hd}}), got == want ? 0 : 1, 0);
}

// PFlash tail scores: the GPU un-rotates the tail rows' queries (as attn_prep leaves them) and the cached
// keys; the reference un-rotates the same with cpu::rope_at at -pos and runs cpu::tail_attention_probs.
// The keys are random rotated rows stored in the cache type; the queries random rotated rows. Tolerance 1e-3:
// at positions in the thousands the device's powf / sincosf and the host's pow / cos / sin give angles that
// differ by ~1e-4 rad; a wrong mask, index or position shows as 1e-2 and more.
void check_tail_scores(Rng& r, int n, int n_tail, int nh, int nkv, int hd, int rot, int ctx, DType t, bool gated) {
    const int qs = gated ? 2 : 1, ld = (qs * nh + 2 * nkv) * hd;
    const float theta = 1e6f;
    auto qkv = r.vec(size_t(n) * ld, 2.f);
    Cache c(r, t, ctx, nkv, hd, ctx);
    Dev<float> dq(qkv), dprobs(size_t(n_tail) * ctx), scratch(gpu::tail_scores_scratch(n_tail, nh, hd, ctx));
    Dev<uint8_t> dkc(c.k);
    gpu::tail_scores(dq.p + size_t(n - n_tail) * ld, ld, gated, n_tail, nh, nkv, hd, rot, theta, dkc.p, t, ctx,
                     scratch.p, dprobs.p, g_s);
    // reference: pre-RoPE q of the tail rows and keys
    std::vector<float> q(size_t(n_tail) * nh * hd), K = decode_rows(c.k, t, c.row, 0, size_t(ctx) * nkv, hd);
    std::vector<int> qpos(static_cast<size_t>(n_tail)), kback(static_cast<size_t>(ctx)), qback(static_cast<size_t>(n_tail));
    for (int i = 0; i < n_tail; ++i) {
        qpos[size_t(i)] = ctx - n_tail + i;
        qback[size_t(i)] = -qpos[size_t(i)];
        for (int h = 0; h < nh; ++h)
            std::copy_n(&qkv[size_t(n - n_tail + i) * ld + size_t(h) * qs * hd], hd, &q[(size_t(i) * nh + h) * hd]);
    }
    for (int s = 0; s < ctx; ++s) kback[size_t(s)] = -s;
    cpu::rope_at(q.data(), n_tail, nh, hd, rot, theta, qback.data());
    cpu::rope_at(K.data(), ctx, nkv, hd, rot, theta, kback.data());
    std::vector<float> ref(size_t(n_tail) * ctx);
    cpu::tail_attention_probs(q.data(), qpos.data(), n_tail, nh, nkv, hd, K.data(), ctx, ref.data());
    report("tail_scores", std::string(gated ? "gated" : "no gate") + " (K " + dtype_name(t) + ")",
           shape({{"n_tail", n_tail}, {"nh", nh}, {"nkv", nkv}, {"hd", hd}, {"rot", rot}, {"ctx", ctx}}),
           rel_err(dprobs.down(), ref), 1e-3);
}

#if !defined(__HIPCC__) && !defined(LB_USE_HIP)
// Block-sparse attention (PFlash's drafter): the selection against cpu::block_sparse_select (the same kept
// blocks except at near-ties, within 1e-3 of the alpha threshold or of the budget's cut; the sinks, the recent
// blocks and the dense tail rows complete; at most the budget's count; the tile counters), and the attention
// over the kept tiles against cpu::block_sparse_attention over the same tiles. Queries and the keys of every third 128-block
// share a direction, so that the rule keeps some blocks and drops others. The selection passes only if some
// block was dropped: the shape needs query tiles before dense_from that see more than sinks + recent + 1 key
// blocks (free > 0 below), or every block is forced and there is nothing to check.
void check_block_sparse(Rng& r, int n, int pos0, int nh, int nkv, int hd, DType t, float budget = 1.f) {
    const int ld = (nh + 2 * nkv) * hd, ctx = pos0 + n;
    std::vector<float> u = r.vec(hd);
    for (float& x : u) x = x > 0 ? 0.3f : -0.3f;
    auto qkv = r.vec(size_t(n) * ld, 0.5f);
    for (int i = 0; i < n; ++i)
        for (int h = 0; h < nh; ++h)
            for (int d = 0; d < hd; ++d) qkv[size_t(i) * ld + size_t(h) * hd + d] += u[d];
    Cache c(r, t, ctx, nkv, hd, 0);
    for (int p = 0; p < ctx; ++p)
        for (int j = 0; j < nkv; ++j) {
            auto a = r.vec(hd, 0.5f), b = r.vec(hd);
            if ((p / 128) % 3 == 1) for (int d = 0; d < hd; ++d) a[d] += u[d];
            encode_row(t, a.data(), &c.k[(size_t(p) * nkv + j) * c.row], size_t(hd));
            encode_row(t, b.data(), &c.v[(size_t(p) * nkv + j) * c.row], size_t(hd));
        }
    gpu::BlockSparse bs;
    bs.size_for(n, nh, nkv, hd, ctx);
    bs.dense_from = ctx - 40;  // the last 40 rows dense
    bs.budget = budget;
    const int rows = bs.rows, n_tiles = (n + rows - 1) / rows;
    Dev<unsigned long long> dstats(std::vector<unsigned long long>{0ull, 0ull});
    bs.stats = dstats.p;
    Dev<int> dtiles(bs.tiles_ints), dcounts(bs.counts_ints);
    Dev<float> dkmean(bs.kmean_floats), dq(qkv), dout(size_t(n) * nh * hd);
    bs.tiles = dtiles.p; bs.counts = dcounts.p; bs.kmean = dkmean.p;
    Dev<uint8_t> dkc(c.k), dvc(c.v);
    Dev<int> dpos(std::vector<int>{pos0});
    const bool took = gpu::block_sparse_select(dq.p, ld, n, nh, nkv, hd, false, pos0, dkc.p, t, bs, g_s);
    gpu::attention(dq.p, ld, n, nh, nkv, hd, dpos.p, dkc.p, t, dvc.p, t, dout.p, g_s, false, took ? &bs : nullptr);
    const std::string sh = shape({{"n", n}, {"pos0", pos0}, {"nh", nh}, {"nkv", nkv}, {"hd", hd}}) +
                           (budget < 1.f ? ", budget " + std::to_string(int(budget * 100)) + "%" : "");
    if (!took) { report("block_sparse", "select (not taken)", sh, 1, 0); return; }
    auto tiles = dtiles.down(), counts = dcounts.down();
    auto K = decode_rows(c.k, t, c.row, 0, size_t(ctx) * nkv, hd), V = decode_rows(c.v, t, c.row, 0, size_t(ctx) * nkv, hd);
    // the rule on the CPU (cpu::block_sparse_select); a block may differ only at a near-tie (within 1e-3 of the
    // alpha threshold or of the budget's cut, the score of the last candidate kept)
    std::vector<float> q(size_t(n) * nh * hd);
    for (int i = 0; i < n; ++i) std::copy_n(&qkv[size_t(i) * ld], size_t(nh) * hd, &q[size_t(i) * nh * hd]);
    cpu::SparseRule rule;
    rule.alpha = bs.alpha;
    rule.budget = bs.budget;
    rule.sinks = bs.sinks;
    rule.recent = bs.recent;
    rule.dense_from = bs.dense_from;
    std::vector<std::vector<float>> scores;
    const auto want = cpu::block_sparse_select(q.data(), n, nh, nkv, hd, rows, pos0, K.data(), rule, &scores);
    int bad = 0, dropped = 0, free = 0, kept_total = 0, seen_total = 0, capped = 0;
    std::vector<std::vector<int>> got(size_t(n_tiles) * nkv);
    for (int tile = 0; tile < n_tiles; ++tile)
        for (int h = 0; h < nkv; ++h) {
            const size_t th = size_t(tile) * nkv + h;
            const int t1 = std::min(tile * rows + rows, n), last = pos0 + t1 - 1, jl = last / 128, s_tiles = last / 64 + 1;
            std::vector<char> al(size_t(s_tiles), 0), wl(size_t(s_tiles), 0);
            for (int i = 0; i < counts[th]; ++i) {
                const int k = tiles[th * bs.max_tiles + i];
                if (k < 0 || k >= s_tiles || (i > 0 && k <= got[th].back())) { ++bad; break; }
                got[th].push_back(k);
                al[size_t(k)] = 1;
            }
            for (int k : want[th]) wl[size_t(k)] = 1;
            kept_total += int(got[th].size());
            seen_total += s_tiles;
            const bool dense = last >= bs.dense_from;
            if (dense) {
                bad += int(got[th].size()) != s_tiles;
                continue;
            }
            const std::vector<float>& sc = scores[th];
            const float thr = *std::max_element(sc.begin(), sc.end()) + std::log(bs.alpha);
            std::vector<float> cand;
            for (int j = std::max(1, bs.sinks); j <= jl - bs.recent; ++j)
                if (sc[size_t(j)] >= thr) cand.push_back(sc[size_t(j)]);
            std::sort(cand.begin(), cand.end(), std::greater<float>());
            const int cap = budget >= 1.f ? 1 << 30 : int(std::ceil(budget * float(jl + 1)));
            const bool cut = int(cand.size()) > cap;
            const float cut_score = cut && cap > 0 ? cand[size_t(cap - 1)] : 1e30f;
            capped += cut;
            int kept_free = 0;
            for (int j = 0; j <= jl; ++j) {
                const bool forced = j < std::max(1, bs.sinks) || j > jl - bs.recent;
                const bool g = al[size_t(2 * j)] != 0, w = wl[size_t(2 * j)] != 0;
                const float x = sc[size_t(j)];
                const bool near = std::fabs(x - thr) < 1e-3f || (cut && std::fabs(x - cut_score) < 1e-3f);
                if (g != w && (forced || !near)) ++bad;
                if (2 * j + 1 < s_tiles && al[size_t(2 * j + 1)] != al[size_t(2 * j)]) ++bad;
                kept_free += !forced && g;
                dropped += !g;
                free += !forced;
            }
            if (cut && kept_free > cap) ++bad;
        }
    auto st = dstats.down();
    if (st[0] != (unsigned long long)kept_total || st[1] != (unsigned long long)seen_total) ++bad;
    char what[96];
    if (free == 0)
        snprintf(what, sizeof what, "select: shape too short (all blocks forced)");
    else
        snprintf(what, sizeof what, "select (%d of %d key tiles kept%s)", kept_total, seen_total,
                 budget < 1.f ? (capped ? ", budget binding" : ", budget not binding") : "");
    // with a budget, the shape must make it bind somewhere, or the bound is untested
    report("block_sparse", what, sh, bad == 0 && dropped > 0 && (budget >= 1.f || capped > 0) ? 0 : 1, 0);
    // the attention over the tiles the GPU kept, against cpu::block_sparse_attention over the same tiles
    std::vector<float> ref(size_t(n) * nh * hd);
    cpu::block_sparse_attention(q.data(), n, nh, nkv, hd, rows, pos0, K.data(), V.data(), got, ref.data());
    const std::string kname = attention_kernel_name(gpu::attention_kernel_for(n, nh, nkv, hd, ld));
    report("block_sparse", kname + "<" + std::to_string(hd) + ">, kept tiles (" + dtype_name(t) + ")", sh,
           rel_err(dout.down(), ref), 2e-2);
}
#endif

void check_silu_mul(Rng& r, int n, int I) {
    auto gu = r.vec(size_t(n) * 2 * I, 3.f);
    Dev<float> dg(gu), dout(size_t(n) * I);
    gpu::silu_mul(dg.p, n, I, dout.p, g_s);
    std::vector<float> ref(size_t(n) * I);
    for (int t = 0; t < n; ++t)
        for (int i = 0; i < I; ++i) ref[size_t(t) * I + i] = cpu::silu(gu[size_t(t) * 2 * I + i]) * gu[size_t(t) * 2 * I + I + i];
    report("silu_mul", "silu_mul_kernel", shape({{"n", n}, {"I", I}}), rel_err(dout.down(), ref), 1e-5);
}

// The verify's argmax of each row of logits: vocab % 4 == 0 (the float4 path; 248,320 is the 27B's) and not
// (the scalar path), each row with a tie at its maximum (the lowest index wins) and one row all equal.
void check_argmax_rows(Rng& r, int n, int vocab) {
    auto x = r.vec(size_t(n) * vocab);
    for (int t = 0; t + 1 < n; ++t) {
        const int a = int((r.uni() + 1.f) * 0.5f * float(vocab - 1)), b = int((r.uni() + 1.f) * 0.5f * float(vocab - 1));
        x[size_t(t) * vocab + a] = x[size_t(t) * vocab + b] = 7.f;
    }
    std::fill_n(&x[size_t(n - 1) * vocab], vocab, 0.25f);  // every index ties: 0
    Dev<float> dx(x);
    Dev<int> out{size_t(n)};
    gpu::argmax_rows(dx.p, n, vocab, out.p, g_s);
    const std::vector<int> got = out.down();
    int wrong = 0;
    for (int t = 0; t < n; ++t) wrong += got[size_t(t)] != cpu::argmax(&x[size_t(t) * vocab], vocab);
    report("argmax_rows", "argmax_rows_kernel (ties: lowest index)", shape({{"n", n}, {"vocab", vocab}}), wrong, 0);
}

void check_argmax_pos(Rng& r) {
    const int n = 100003;
    auto x = r.vec(n);
    x[77777] = 5.f;
    x[4242] = 5.f;  // a tie: the lowest index wins
    Dev<float> dx(x);
    Dev<int> out(1), pos(std::vector<int>{40});
    gpu::argmax(dx.p, n, out.p, g_s);
    gpu::add_pos(pos.p, 7, g_s);
    const int got = out.down()[0], want = cpu::argmax(x.data(), n);
    report("argmax", "argmax_kernel (tie: lowest index)", shape({{"n", n}}), got == want ? 0 : 1, 0);
    report("add_pos", "add_pos_kernel", shape({{"pos", 40}, {"n", 7}}), pos.down()[0] == 47 ? 0 : 1, 0);
    // with a ring (the unfused decode graph's token out; device memory here): slot (47 + 1 - 1) & 7 = 7
    Dev<int> tok(std::vector<int>{123}), ring(std::vector<int>(8, -1));
    gpu::add_pos(pos.p, 1, g_s, tok.p, ring.p, 7);
    const std::vector<int> rg = ring.down();
    report("add_pos", "add_pos_kernel, token to ring slot (pos - 1) & mask", shape({{"pos", 47}, {"n", 1}}),
           pos.down()[0] == 48 && rg[7] == 123 && rg[6] == -1 ? 0 : 1, 0);
}

// ----------------------------------------------------------------------------------------- fused decode

gpu::FusedGemv fused(int pro, int epi, const float* x, int in, const Mat& W, int out, float* y) {
    gpu::FusedGemv a;
    a.pro = pro; a.epi = epi; a.x = x; a.in = in; a.W = W.w(); a.out = out; a.y = y; a.eps = 1e-6f;
    return a;
}

// GEMV of the prologue's input vector xs with W on the CPU
std::vector<float> cpu_gemv(const std::vector<float>& xs, const Mat& W, int out) {
    std::vector<float> y(out);
    cpu::matmul(xs.data(), 1, int(xs.size()), W.f.data(), out, y.data());
    return y;
}

void check_gemv_fused(Rng& r) {
    const float eps = 1e-6f;
    {  // PLAIN / STORE and PLAIN / ADD with both folds
        const int in = 2048, out = 1001;
        Mat W(r, out, in, 0.05f);
        auto x = r.vec(in), y0 = r.vec(out), f1 = r.vec(out), f2 = r.vec(out);
        Dev<float> dx(x), dy(y0);
        Dev<unsigned long long> d1(to_fix_all(f1)), d2(to_fix_all(f2));
        gpu::gemv_fused(fused(gpu::GV_PLAIN, gpu::GV_STORE, dx.p, in, W, out, dy.p), g_s);
        auto ref = cpu_gemv(x, W, out);
        report("gemv_fused", "PLAIN, STORE", shape({{"in", in}, {"out", out}}), rel_err(dy.down(), ref), 1e-5);
        dy.up(y0);
        auto a = fused(gpu::GV_PLAIN, gpu::GV_ADD, dx.p, in, W, out, dy.p);
        a.fold = d1.p; a.fold2 = d2.p;
        gpu::gemv_fused(a, g_s);
        auto f1q = from_fix_all(to_fix_all(f1)), f2q = from_fix_all(to_fix_all(f2));
        for (int i = 0; i < out; ++i) ref[i] += (y0[i] + f1q[i]) + f2q[i];
        auto got = dy.down();
        auto z1 = d1.down(), z2 = d2.down();
        const bool cleared = std::all_of(z1.begin(), z1.end(), [](auto v) { return v == 0; }) &&
                             std::all_of(z2.begin(), z2.end(), [](auto v) { return v == 0; });
        report("gemv_fused", "PLAIN, ADD (+ fold, fold2; cleared)", shape({{"in", in}, {"out", out}}),
               cleared ? rel_err(got, ref) : 1.0, 1e-5);
    }
    {  // RMSNORM / STORE with both pending accumulators, then RMSNORM / CONV
        const int in = 1024, out = 1000, K = 4, conv_rows = 600;
        Mat W(r, out, in, 0.05f);
        auto x = r.vec(in, 2.f), gain = r.vec(in), a1 = r.vec(in), a2 = r.vec(in);
        auto a1q = from_fix_all(to_fix_all(a1)), a2q = from_fix_all(to_fix_all(a2));
        Dev<float> dx(x), dg(gain), dy(out);
        Dev<unsigned long long> d1(to_fix_all(a1)), d2(to_fix_all(a2));
        auto a = fused(gpu::GV_RMSNORM, gpu::GV_STORE, dx.p, in, W, out, dy.p);
        a.gain = dg.p; a.acc = d1.p; a.acc2 = d2.p;
        gpu::gemv_fused(a, g_s);
        std::vector<float> xin(in), xs(in);
        for (int i = 0; i < in; ++i) xin[i] = (x[i] + a1q[i]) + a2q[i];
        cpu::rmsnorm(xin.data(), gain.data(), xs.data(), 1, in, eps);
        auto ref = cpu_gemv(xs, W, out);
        report("gemv_fused", "RMSNORM (+ acc, acc2), STORE", shape({{"in", in}, {"out", out}}), rel_err(dy.down(), ref), 1e-5);

        auto cw = r.vec(size_t(conv_rows) * K), cs = r.vec(size_t(conv_rows) * (K - 1));
        Dev<float> dcw(cw), dcs(cs), dco(conv_rows);
        auto c = fused(gpu::GV_RMSNORM, gpu::GV_CONV, dx.p, in, W, out, dy.p);
        c.gain = dg.p; c.conv_rows = conv_rows; c.conv_k = K; c.conv_w = dcw.p; c.conv_state = dcs.p; c.conv_out = dco.p;
        gpu::gemv_fused(c, g_s);
        cpu::rmsnorm(x.data(), gain.data(), xs.data(), 1, in, eps);
        ref = cpu_gemv(xs, W, out);
        std::vector<float> conv_ref(conv_rows), st_ref = cs;
        cpu::causal_conv1d_silu(ref.data(), 1, conv_rows, K, cw.data(), st_ref.data(), conv_ref.data());
        std::vector<float> got = dy.down(), gc = dco.down(), gs = dcs.down();
        got.insert(got.end(), gc.begin(), gc.end());
        got.insert(got.end(), gs.begin(), gs.end());
        ref.insert(ref.end(), conv_ref.begin(), conv_ref.end());
        ref.insert(ref.end(), st_ref.begin(), st_ref.end());
        report("gemv_fused", "RMSNORM, CONV (y, conv out, state)", shape({{"in", in}, {"out", out}, {"conv_rows", conv_rows}, {"K", K}}),
               rel_err(got, ref), 1e-5);
    }
    {  // RMSNORM / ARGMAX (the LM head), then decode_finish; embed_decode clears the key first
        const int in = 1024, out = 5003, V = 50, H = in;
        Mat W(r, out, in, 0.05f), E(r, V, H, 1.f);
        auto gain = r.vec(in);
        Dev<float> dx(in), dg(gain), dy(out);
        Dev<int> tok(std::vector<int>{17}), next(1), pos(std::vector<int>{5});
        Dev<unsigned long long> key(std::vector<unsigned long long>{~0ull}), acc(std::vector<unsigned long long>(2 * H, 12345ull));
        int* ring = nullptr;
        GPU_CHECK(gpuMallocHost((void**)&ring, 8 * sizeof(int)));
        std::fill(ring, ring + 8, -1);
        gpu::embed_decode(tok.p, E.w(), H, dx.p, key.p, acc.p, 2, g_s);
        auto xe = dx.down();
        std::vector<float> erow(&E.f[17 * size_t(H)], &E.f[18 * size_t(H)]);
        auto accz = acc.down();
        const bool zeroed = std::all_of(accz.begin(), accz.end(), [](auto v) { return v == 0; }) && key.down()[0] == 0;
        report("embed_decode", "embed_decode_kernel (+ key, acc cleared)", shape({{"H", H}, {"n_acc", 2}}),
               zeroed ? rel_err(xe, erow) : 1.0, 0);
        auto a = fused(gpu::GV_RMSNORM, gpu::GV_ARGMAX, dx.p, in, W, out, dy.p);
        a.gain = dg.p; a.key = key.p;
        gpu::gemv_fused(a, g_s);
        gpu::decode_finish(key.p, next.p, pos.p, ring, 7, g_s);
        std::vector<float> xs(in);
        cpu::rmsnorm(erow.data(), gain.data(), xs.data(), 1, in, eps);
        auto logits = cpu_gemv(xs, W, out);
        const int got = next.down()[0], want = cpu::argmax(logits.data(), out);
        // a near-tie may go either way under fp32 rounding: the chosen logit must equal the maximum within 1e-5
        const double gap = got >= 0 && got < out ? (logits[want] - logits[got]) / std::fabs(logits[want]) : 1.0;
        const bool finish_ok = pos.down()[0] == 6 && ring[5] == got;
        report("gemv_fused", "RMSNORM, ARGMAX + decode_finish", shape({{"in", in}, {"out", out}}),
               finish_ok ? std::max(gap, 0.0) : 1.0, 1e-5);
        GPU_CHECK(gpuFreeHost(ring));
    }
    {  // GATED / ADD (the DeltaNet out-projection) and SILU / ADD (the unfused MLP's down)
        const int hv = 16, dv = 128, in = hv * dv, out = 1024;
        Mat W(r, out, in, 0.05f);
        auto o = r.vec(in, 2.f), z = r.vec(in, 3.f), gain = r.vec(dv), y0 = r.vec(out);
        Dev<float> dox(o), dz(z), dg(gain), dy(y0);
        auto a = fused(gpu::GV_GATED, gpu::GV_ADD, dox.p, in, W, out, dy.p);
        a.gain = dg.p; a.z = dz.p; a.head_dim = dv;
        gpu::gemv_fused(a, g_s);
        std::vector<float> xs(in);
        cpu::gated_rmsnorm(o.data(), z.data(), gain.data(), xs.data(), hv, dv, eps);
        auto ref = cpu_gemv(xs, W, out);
        for (int i = 0; i < out; ++i) ref[i] += y0[i];
        report("gemv_fused", "GATED, ADD", shape({{"heads", hv}, {"head_dim", dv}, {"out", out}}), rel_err(dy.down(), ref), 1e-5);

        const int I = 3584;
        Mat D(r, out, I, 0.05f);
        auto gu = r.vec(2 * size_t(I), 3.f);
        Dev<float> dgu(gu);
        dy.up(y0);
        gpu::gemv_fused(fused(gpu::GV_SILU, gpu::GV_ADD, dgu.p, I, D, out, dy.p), g_s);
        std::vector<float> act(I);
        for (int i = 0; i < I; ++i) act[i] = cpu::silu(gu[i]) * gu[I + i];
        ref = cpu_gemv(act, D, out);
        for (int i = 0; i < out; ++i) ref[i] += y0[i];
        report("gemv_fused", "SILU, ADD", shape({{"in", I}, {"out", out}}), rel_err(dy.down(), ref), 1e-5);
    }
}

void check_transpose_mlp(Rng& r, int H, int I) {
    const float eps = 1e-6f;
    Mat GU(r, 2 * I, H, 0.05f), Dn(r, H, I, 0.05f);  // gate_up [2I, H], down [H, I]
    Dev<uint16_t> down_t(size_t(I) * H);
    gpu::transpose(Dn.w(), H, I, (gpu::wtype*)down_t.p, g_s);
    auto dt = down_t.down();
    std::vector<float> tr(dt.size()), trr(dt.size());
    for (int i = 0; i < I; ++i)
        for (int h = 0; h < H; ++h) { tr[size_t(i) * H + h] = from_w(dt[size_t(i) * H + h]); trr[size_t(i) * H + h] = Dn.f[size_t(h) * I + i]; }
    report("transpose", "transpose16_kernel", shape({{"rows", H}, {"cols", I}}), rel_err(tr, trr), 0);
    if (!gpu::mlp_fused_ok(H, I)) {
        printf("| %-17s | %-38s | %-30s | not selectable on this device (shared memory) |\n", "mlp_fused", "mlp_fused_kernel",
               shape({{"H", H}, {"I", I}}).c_str());
        return;
    }
    auto x = r.vec(H, 2.f), xa = r.vec(H), gain = r.vec(H), acc0 = r.vec(H, 0.5f);
    auto xaq = from_fix_all(to_fix_all(xa)), acc0q = from_fix_all(to_fix_all(acc0));
    Dev<float> dx(x), dg(gain);
    Dev<unsigned long long> dxa(to_fix_all(xa)), dacc(to_fix_all(acc0));
    gpu::FusedMlp m;
    m.x = dx.p; m.x_acc = dxa.p; m.gain = dg.p; m.eps = eps; m.gate_up = GU.w(); m.down_t = (const gpu::wtype*)down_t.p;
    m.acc = dacc.p; m.H = H; m.I = I;
    gpu::mlp_fused(m, g_s);
    std::vector<float> xin(H), xs(H), gu(2 * size_t(I)), act(I), ref(H);
    for (int i = 0; i < H; ++i) xin[i] = x[i] + xaq[i];
    cpu::rmsnorm(xin.data(), gain.data(), xs.data(), 1, H, eps);
    cpu::matmul(xs.data(), 1, H, GU.f.data(), 2 * I, gu.data());
    for (int i = 0; i < I; ++i) act[i] = cpu::silu(gu[i]) * gu[I + i];
    cpu::matmul(act.data(), 1, I, Dn.f.data(), H, ref.data());
    for (int i = 0; i < H; ++i) ref[i] += acc0q[i];
    report("mlp_fused", "mlp_fused_kernel (+ x_acc, into acc)", shape({{"H", H}, {"I", I}}), rel_err(from_fix_all(dacc.down()), ref), 1e-4);
}

// The DeltaNet decode step on the CPU: conv row [q | k | v] (q, k not normalised), b and a from proj.
void cpu_delta_step(const std::vector<float>& conv, const std::vector<float>& proj, int b_off, const std::vector<float>& negA,
                    const std::vector<float>& dt, int hk, int hv, int dk, int dv, std::vector<float>& state,
                    std::vector<float>& out) {
    std::vector<float> y = conv, g(hv), beta(hv);
    cpu_deltanet_prep(y, int(y.size()), proj, int(proj.size()), b_off, negA, dt, 1, hk, dk, hv, &g, &beta);
    out.assign(size_t(hv) * dv, 0.f);
    cpu::delta_rule_recurrent(y.data(), y.data() + hk * dk, y.data() + 2 * hk * dk, g.data(), beta.data(), 1, hk, hv, dk,
                              dv, state.data(), out.data());
}

void check_delta_decode(Rng& r, int hk, int hv, int dk, int dv) {
    const int cd = 2 * hk * dk + hv * dv, b_off = 5, lp = b_off + 2 * hv + 3;
    auto conv = r.vec(cd, 2.f), proj = r.vec(lp, 2.f), negA = r.vec(hv), dt = r.vec(hv), st = r.vec(size_t(hv) * dk * dv, 0.3f);
    for (float& a : negA) a = -std::fabs(a) - 0.1f;
    Dev<float> dc(conv), dp(proj), dn(negA), ddt(dt), dst(st), dout(size_t(hv) * dv);
    gpu::delta_decode(dc.p, dp.p, b_off, dn.p, ddt.p, hk, hv, dk, dv, dst.p, dout.p, g_s);
    std::vector<float> ref, st_ref = st;
    cpu_delta_step(conv, proj, b_off, negA, dt, hk, hv, dk, dv, st_ref, ref);
    auto got = dout.down(), gst = dst.down();
    got.insert(got.end(), gst.begin(), gst.end());
    ref.insert(ref.end(), st_ref.begin(), st_ref.end());
    report("delta_decode", "delta_decode_kernel<" + std::to_string(dk / 32) + "> (out, state)",
           shape({{"hk", hk}, {"hv", hv}, {"dk", dk}, {"dv", dv}}), rel_err(got, ref), 5e-4);
}

void check_delta_out(Rng& r, int H, int hk, int hv) {
    const int dk = 128, dv = 128, cd = 2 * hk * dk + hv * dv, vd = hv * dv, z_off = cd + 11, b_off = z_off + vd + 3;
    const float eps = 1e-6f;
    Mat W(r, H, vd, 0.05f);
    auto conv = r.vec(cd, 2.f), proj = r.vec(size_t(b_off) + 2 * hv, 2.f), negA = r.vec(hv), dt = r.vec(hv),
         gain = r.vec(dv), st = r.vec(size_t(hv) * dk * dv, 0.3f), x = r.vec(H), fa = r.vec(H), fb = r.vec(H), acc0 = r.vec(H, 0.5f);
    for (float& a : negA) a = -std::fabs(a) - 0.1f;
    Dev<float> dc(conv), dp(proj), dn(negA), ddt(dt), dg(gain), dst(st), dx(x);
    Dev<unsigned long long> dacc(to_fix_all(acc0)), dfa(to_fix_all(fa)), dfb(to_fix_all(fb));
    Dev<unsigned> cnt{size_t(hv)};
    gpu::DeltaOut d;
    d.conv = dc.p; d.proj = dp.p; d.z_off = z_off; d.b_off = b_off; d.negA = dn.p; d.dt_bias = ddt.p; d.gain = dg.p;
    d.eps = eps; d.hk = hk; d.hv = hv; d.H = H; d.state = dst.p; d.W = W.w(); d.acc = dacc.p; d.x = dx.p;
    d.fold_a = dfa.p; d.fold_b = dfb.p; d.counters = cnt.p;
    gpu::delta_out(d, g_s);
    std::vector<float> o, st_ref = st, normed(vd), ref(H), z(&proj[z_off], &proj[z_off + vd]);
    cpu_delta_step(conv, proj, b_off, negA, dt, hk, hv, dk, dv, st_ref, o);
    cpu::gated_rmsnorm(o.data(), z.data(), gain.data(), normed.data(), hv, dv, eps);
    cpu::matmul(normed.data(), 1, vd, W.f.data(), H, ref.data());
    auto acc0q = from_fix_all(to_fix_all(acc0)), faq = from_fix_all(to_fix_all(fa)), fbq = from_fix_all(to_fix_all(fb));
    for (int i = 0; i < H; ++i) ref[i] += acc0q[i];
    std::vector<float> xr(H);
    for (int i = 0; i < H; ++i) xr[i] = (x[i] + faq[i]) + fbq[i];
    const std::string sh = shape({{"H", H}, {"hk", hk}, {"hv", hv}, {"R", H / 128}});
    report("delta_out", "delta_out_kernel (acc)", sh, rel_err(from_fix_all(dacc.down()), ref), 5e-4);
    auto gst = dst.down();
    report("delta_out", "delta_out_kernel (state)", sh, rel_err(gst, st_ref), 5e-4);
    auto za = dfa.down(), zb = dfb.down();
    const bool cleared = std::all_of(za.begin(), za.end(), [](auto v) { return v == 0; }) &&
                         std::all_of(zb.begin(), zb.end(), [](auto v) { return v == 0; });
    report("delta_out", "delta_out_kernel (x += folds; cleared)", sh, cleared ? rel_err(dx.down(), xr) : 1.0, 1e-6);
}

void check_attention_decode(Rng& r, int nh, int nkv, int hd, DType t, int pos) {
    const int ld = (2 * nh + 2 * nkv) * hd, ctx = pos + 1;
    auto qkv = r.vec(ld, 0.5f);
    Cache c(r, t, ctx, nkv, hd, ctx);
    const int blocks = gpu::attention_decode_blocks(nkv, 4096);
    Dev<float> dq(qkv), dout(size_t(nh) * hd), scratch(gpu::attention_decode_scratch(nh, hd, blocks));
    Dev<int> counters{size_t(nkv)}, dpos(std::vector<int>{pos});
    Dev<uint8_t> dkc(c.k), dvc(c.v);
    gpu::attention_decode(dq.p, nh, nkv, hd, dpos.p, dkc.p, t, dvc.p, t, blocks, scratch.p, counters.p, dout.p, g_s);
    auto first = dout.down();
    gpu::attention_decode(dq.p, nh, nkv, hd, dpos.p, dkc.p, t, dvc.p, t, blocks, scratch.p, counters.p, dout.p, g_s);
    const bool same = dout.down() == first;  // the counters were left zero and the merge order is fixed
    auto ref = cpu_attention(qkv, ld, 1, nh, nkv, hd, pos, c.k, c.v, t);
    const int G = nh / nkv, per = hd / 32;
    const std::string kvf = t == DType::BF16 ? "bf16" : "any";
    report("attention_decode",
           "flash<" + std::to_string(per) + "," + std::to_string(G > 4 ? 8 : 4) + "," + std::to_string(G > 4 ? 2 : 4) +
               "," + kvf + "> (" + dtype_name(t) + ")" + (same ? "" : " NOT REPEATABLE"),
           shape({{"nh", nh}, {"nkv", nkv}, {"hd", hd}, {"pos", pos}, {"blocks", blocks}}), same ? rel_err(first, ref) : 1.0, 5e-4);
}

// Split attention at a long context. The rows' q heads against the CPU attention over the pos0 + n cached keys
// (random rows, all of them in the cache: the rows' own keys too) under the rows' mask: kCausal, kTree (row t
// sees keys < pos0 and the rows on its path to the root of a random verify tree, cpu::tree_attention), or kAll
// (every row sees every row: the DFlash draft's non-causal block). splits > 0: through attention_split with
// that many key ranges (a count auto would not pick); 0, causal: through attention() with a workspace's scratch
// at the host's pos0, as forward_layers calls it, which picks attention_decode for one row and
// attention_splits' count (the single pass where that is 1) for more; 0 otherwise: through attention_split with
// attention_splits' count, as verify_layers and the draft call it. Run twice: the results must be bit-identical
// (the ranges merge in a fixed order, the decode counters end zero).
enum RowMask { kCausal, kTree, kAll };
void check_attention_split(Rng& r, int n, int nh, int nkv, int hd, DType t, int pos0, int splits, bool gated,
                           RowMask mask = kCausal) {
    const bool masked = mask != kCausal;  // a visible mask for attention_split
    const int ld = ((gated ? 2 : 1) * nh + 2 * nkv) * hd, ctx = pos0 + n, qs = gated ? 2 : 1;
    auto qkv = r.vec(size_t(n) * ld, 0.5f);
    Cache c(r, t, ctx, nkv, hd, ctx);
    gpu::AttnScratch sc;
    sc.floats = std::max(gpu::attention_scratch_floats(nh, nkv, hd), gpu::attention_split_scratch(n, nh, hd, splits));
    sc.decode_blocks = gpu::attention_decode_blocks(nkv, ctx);
    Dev<float> dq(qkv), dout(size_t(n) * nh * hd), part(sc.floats);
    Dev<int> counters{size_t(nkv)}, dpos(std::vector<int>{pos0});
    Dev<uint8_t> dkc(c.k), dvc(c.v);
    sc.part = part.p;
    sc.counters = counters.p;
    std::vector<unsigned char> vis;
    if (mask == kAll) vis.assign(size_t(n) * n, 1);
    if (mask == kTree) {  // random parents (earlier rows or the committed sequence), ancestor-or-self mask
        std::vector<int> parent(static_cast<size_t>(n));
        vis.assign(size_t(n) * n, 0);
        for (int i = 0; i < n; ++i) {
            parent[size_t(i)] = i == 0 ? -1 : int((r.uni() + 1.f) * 0.5f * float(i + 1)) - 1;
            parent[size_t(i)] = std::min(parent[size_t(i)], i - 1);
            for (int j = i; j >= 0; j = parent[size_t(j)]) vis[size_t(i) * n + j] = 1;
        }
    }
    Dev<unsigned char> dvis(masked ? vis : std::vector<unsigned char>(1));
    if (masked && splits == 0) splits = gpu::attention_splits(n, nh, nkv, hd, ld, pos0);
    std::string path;
    bool fp32_path = false;
    auto run = [&]() {
        if (splits > 0) {
            gpu::attention_split(dq.p, ld, n, nh, nkv, hd, masked ? nullptr : dpos.p, pos0, dkc.p, t, dvc.p, t,
                                 masked ? dvis.p : nullptr, splits, sc, dout.p, g_s, gated);
            path = "attention_split, " + std::to_string(splits) + " ranges" +
                   (mask == kTree ? ", tree" : mask == kAll ? ", all rows" : "");
        } else {
            gpu::attention(dq.p, ld, n, nh, nkv, hd, dpos.p, dkc.p, t, dvc.p, t, dout.p, g_s, gated, nullptr, &sc, pos0);
            const int auto_splits = gpu::attention_splits(n, nh, nkv, hd, ld, pos0);
            const gpu::AttentionKernel single = gpu::attention_kernel_for(n, nh, nkv, hd, ld);
            const bool decode = n == 1 && gpu::attention_decode_ok(nh, nkv, hd);
            path = decode ? "attention(): attention_decode"
                   : auto_splits > 1 ? "attention(): split, " + std::to_string(auto_splits) + " ranges"
                                     : std::string("attention(): ") + attention_kernel_name(single);
            fp32_path = decode || (auto_splits <= 1 && (single == gpu::AttentionKernel::Rows ||
                                                        single == gpu::AttentionKernel::Tiled));
        }
        return dout.down();
    };
    const auto first = run();
    const bool same = run() == first;
    std::vector<float> ref;
    if (masked) {
        std::vector<float> q(size_t(n) * nh * hd);
        for (int i = 0; i < n; ++i)
            for (int h = 0; h < nh; ++h)
                std::copy_n(&qkv[size_t(i) * ld + size_t(h) * qs * hd], hd, &q[(size_t(i) * nh + h) * hd]);
        ref.assign(q.size(), 0.f);
        cpu::tree_attention(q.data(), n, nh, nkv, hd, pos0, c.k.data(), t, c.v.data(), t, vis.data(), ref.data());
        if (gated)
            for (int i = 0; i < n; ++i)
                for (int h = 0; h < nh; ++h)
                    for (int e = 0; e < hd; ++e)
                        ref[(size_t(i) * nh + h) * hd + e] *= cpu::sigmoid(qkv[size_t(i) * ld + size_t(h) * 2 * hd + hd + e]);
    } else {
        ref = cpu_attention(qkv, ld, n, nh, nkv, hd, pos0, c.k, c.v, t, gated);
    }
    // the fp32 kernels (one row's flash-decoding, attention_kernel, the tiled kernel: 5e-4, as their own
    // checks); the bf16 tensor-core flash kernel, single pass or in ranges (2e-2, as the prefill kernel's)
    report("attention_split", path + (gated ? " (" : ", no gate (") + dtype_name(t) + ")" + (same ? "" : " NOT REPEATABLE"),
           shape({{"n", n}, {"nh", nh}, {"nkv", nkv}, {"hd", hd}, {"pos0", pos0}}), same ? rel_err(first, ref) : 1.0,
           fp32_path ? 5e-4 : 2e-2);
}

void check_attn_decode_short(Rng& r, int nh, int nkv, int pos) {
    const int hd = 256, rot = 64, ld = (2 * nh + 2 * nkv) * hd;
    const float theta = 1e7f;
    const int limit = gpu::attn_decode_short_ctx(nh, nkv, hd, rot, DType::BF16, DType::BF16);
    if (limit == 0) {
        printf("| %-17s | %-38s | %-30s | not selectable in this build (CUDA bf16 builds only) |\n", "attn_decode_short",
               "attn_decode_short_kernel", shape({{"nh", nh}, {"nkv", nkv}}).c_str());
        return;
    }
    auto qkv = r.vec(ld, 2.f), qg = r.vec(hd), kg = r.vec(hd);
    Cache c(r, DType::BF16, pos + 1, nkv, hd, pos);
    Dev<float> dq(qkv), dqg(qg), dkg(kg), dout(size_t(nh) * hd);
    Dev<uint8_t> dkc(c.k), dvc(c.v);
    Dev<int> dpos(std::vector<int>{pos});
    GPU_CHECK(gpuStreamSynchronize(g_s));  // the kernel reads the caches and position before its dependency wait
    gpu::attn_decode_short(dq.p, nh, nkv, rot, theta, dqg.p, dkg.p, 1e-6f, dpos.p, dkc.p, dvc.p, dout.p, g_s);
    std::vector<float> pre = qkv;
    cpu_attn_prep(pre, ld, 1, nh, nkv, hd, rot, theta, qg, kg, pos, c);
    auto ref = cpu_attention(pre, ld, 1, nh, nkv, hd, pos, c.k, c.v, DType::BF16);
    const std::string sh = shape({{"nh", nh}, {"nkv", nkv}, {"hd", hd}, {"pos", pos}, {"limit", limit}});
    report("attn_decode_short", "attn_decode_short_kernel (out)", sh, rel_err(dout.down(), ref), 5e-4);
    const size_t r0 = size_t(pos) * nkv, r1 = r0 + nkv;
    auto gk = decode_rows(dkc.down(), DType::BF16, c.row, r0, r1, hd), rk = decode_rows(c.k, DType::BF16, c.row, r0, r1, hd);
    auto gv = decode_rows(dvc.down(), DType::BF16, c.row, r0, r1, hd), rv = decode_rows(c.v, DType::BF16, c.row, r0, r1, hd);
    gk.insert(gk.end(), gv.begin(), gv.end());
    rk.insert(rk.end(), rv.begin(), rv.end());
    report("attn_decode_short", "attn_decode_short_kernel (K, V bf16)", sh, rel_err(gk, rk), kv_tol(DType::BF16));
}

}  // namespace

// `--time-quant`: matmul_quant alone on Qwen3.5-27B's matrix shapes in the Q4_K_M types, for each n class:
// median time (CUDA events, 20 reps after 3; weights not in L2) and the weight bytes read per second (timing
// only, no check).
void time_quant() {
    struct Case { const char* name; DType t; int out, in; };
    const Case cases[] = {{"ffn gate_up q4_K", DType::Q4_K, 2 * 17408, 5120}, {"ffn down q6_K", DType::Q6_K, 5120, 17408},
                          {"ffn down q4_K", DType::Q4_K, 5120, 17408}, {"lin_in q4_K", DType::Q4_K, 16480, 5120},
                          {"attn qkv q4_K", DType::Q4_K, 14336, 5120},
                          {"ssm_out q4_K", DType::Q4_K, 5120, 6144}, {"lm_head q6_K", DType::Q6_K, 248320, 5120}};
    printf("| matrix | out x in | n | ms | weight GB/s |\n|---|---|---|---|---|\n");
    for (const Case& c : cases) {
        const size_t bytes = dtype_row_bytes(c.t, size_t(c.in)) * size_t(c.out);
        // zero blocks (the time does not depend on the values), in as many copies as make 512 MB, taken in turn:
        // each launch reads its weights from memory, not from a previous launch's L2 lines (50-60 MB), as in
        // a decode step, where every matrix is read once
        const size_t copies = std::max<size_t>(1, ((size_t(512) << 20) + bytes - 1) / bytes);
        Dev<uint8_t> w(bytes * copies);
        Dev<float> x(size_t(72) * c.in), y(size_t(72) * c.out);
        // (n, kernel) through matmul_quant's gemv hook: qmv_kernel (1) and qmma_kernel (2), the engines' q4_K /
        // q6_K kernels, against the generic block kernels that the other types take (and q4_K / q6_K took
        // before them: docs/engines.md's "tried and superseded" figures): qgemv_kernel (8) at n <= 4, the
        // tensor-core qgemm_kernel (-1) above, gemm_tc from kGemmTcMinRows; qmv_kernel at one token also with
        // 2 (3) and 4 (4, q4_K) rows a warp, whatever the matrix's default
        // (qmv_kernel and qmma_kernel at 1..4 rows: where one overtakes the other)
        const std::pair<int, int> runs[] = {{1, 8}, {1, 1}, {1, 3}, {1, 4}, {1, 2}, {2, 1}, {2, 2}, {3, 1}, {3, 2},
                                            {4, 8}, {4, 1}, {4, 2}, {8, 1}, {8, 2},
                                            {9, -1}, {9, 2}, {16, 1}, {17, 2}, {23, -1}, {23, 1}, {23, 2}, {32, 2},
                                            {33, -1}, {33, 2}, {41, 2}, {65, -1}, {65, 2}};
        for (auto [n, gemv] : runs) {
            if (gemv == 4 && c.t != DType::Q4_K) continue;
            const int rows = n, kernel = gemv < 0 ? 8 : gemv;  // a lambda captures no structured bindings (C++17)
            const std::vector<float> ts = sorted_event_ms(g_s, 3, 20, [&](int r) {
                gpu::matmul_quant(x.p, rows, c.in, w.p + bytes * (size_t(r) % copies), c.t, c.out, y.p, c.out, false,
                                  g_s, kernel);
            });
            const double ms = ts[ts.size() / 2];
            printf("| %s | %d x %d | %d %s | %.4f | %.0f |\n", c.name, c.out, c.in, n,
                   gemv == 1 ? "(qmv)" : gemv == 3 ? "(qmv, 2 rows a warp)" : gemv == 4 ? "(qmv, 4 rows a warp)"
                   : gemv == 2 ? "(qmma)" : n <= gpu::kQuantGemvMax ? "(qgemv)" : n < gpu::kGemmTcMinRows ? "(qgemm)"
                   : "(gemm_tc)", ms, bytes / ms / 1e6);
        }
        // one token with the RMSNorm before it folded in (the decode step's qkv / in-proj / gate_up / LM head),
        // and for gate_up the SwiGLU after it too (the decode step's gate_up launch)
        Dev<float> gain{size_t(c.in)};
        const bool gate_up = std::string(c.name).rfind("ffn gate_up", 0) == 0;
        for (const bool sw : {false, true}) {
            if (sw && !gate_up) continue;
            if (!gpu::matmul_quant_rmsnorm(x.p, gain.p, 1e-6f, c.in, w.p, c.t, c.out, y.p, c.out, false, g_s, sw))
                continue;
            const std::vector<float> ts = sorted_event_ms(g_s, 3, 20, [&](int r) {
                gpu::matmul_quant_rmsnorm(x.p, gain.p, 1e-6f, c.in, w.p + bytes * (size_t(r) % copies), c.t, c.out,
                                          y.p, c.out, false, g_s, sw);
            });
            const double ms = ts[ts.size() / 2];
            printf("| %s | %d x %d | 1 (qmv + rmsnorm%s) | %.4f | %.0f |\n", c.name, c.out, c.in,
                   sw ? " + swiglu" : "", ms, bytes / ms / 1e6);
        }
    }
    GPU_CHECK(gpuGetLastError());
}

// `--time-attention` (CUDA bf16 builds): the long-context attention shapes, the kernel each ran before the split
// forms against the path it takes now, at 256 .. 128K cached keys before the rows: median of 10 launches after 2
// (CUDA events), caches of zero bytes (the times do not depend on the values), timing only. The 27B's unfused
// decode step (attention_kernel -> attention_decode), its verify of 23 rows under a chain mask
// (tree_attention_kernel -> attention_split) with bf16 and q8_0 KV, the z-lab 27B draft's 16-row block over an
// f32 context cache (draft_attention_kernel -> attention_split, all rows visible), a 23-row causal chunk
// (flash_attention_kernel's single pass -> its split form). One layer: the 27B has 16 such layers, the draft 1
// to 5 (its layers without a sliding window).
void time_attention() {
#if !defined(__HIPCC__) && !defined(LB_USE_HIP) && !defined(LB_GPU_FP16)
    enum Kind { kDecode, kVerify, kDraft, kChunk };
    struct Case { const char* name; int n, nh, nkv, hd; bool gated; DType t; Kind kind; };
    const Case cases[] = {{"27B decode step", 1, 24, 4, 256, true, DType::BF16, kDecode},
                          {"27B verify B = 22", 23, 24, 4, 256, true, DType::BF16, kVerify},
                          {"27B verify B = 22", 23, 24, 4, 256, true, DType::Q8_0, kVerify},
                          {"z-lab 27B draft block", 16, 32, 8, 128, false, DType::F32, kDraft},
                          {"27B 23-row chunk", 23, 24, 4, 256, true, DType::BF16, kChunk}};
    const int ctxs[] = {256, 1024, 4096, 16384, 65536, 131072};
    printf("| shape | KV | keys | before: kernel | us | after: path | us | before / after |\n"
           "|---|---|---|---|---|---|---|---|\n");
    for (const Case& c : cases) {
        const int max_ctx = ctxs[5] + c.n, ld = ((c.gated ? 2 : 1) * c.nh + 2 * c.nkv) * c.hd;
        const size_t kv_bytes = size_t(max_ctx) * c.nkv * dtype_row_bytes(c.t, size_t(c.hd));
        Dev<uint8_t> kc(kv_bytes), vc(kv_bytes);
        Rng r(7);
        Dev<float> q(r.vec(size_t(c.n) * ld, 0.5f)), out(size_t(c.n) * c.nh * c.hd);
        gpu::AttnScratch sc;
        sc.floats = gpu::attention_scratch_floats(c.nh, c.nkv, c.hd);
        sc.decode_blocks = gpu::attention_decode_blocks(c.nkv, max_ctx);
        Dev<float> part(sc.floats);
        Dev<int> counters{size_t(c.nkv)};
        sc.part = part.p;
        sc.counters = counters.p;
        std::vector<unsigned char> mask(size_t(c.n) * c.n, 0);  // verify: a chain (row t sees rows 0..t); draft: all
        for (int t = 0; t < c.n; ++t)
            for (int j = 0; j < c.n; ++j) mask[size_t(t) * c.n + j] = c.kind == kDraft || j <= t;
        Dev<unsigned char> vis(mask);
        for (int ctx : ctxs) {
            Dev<int> dpos(std::vector<int>{ctx});
            auto us = [&](auto&& fn) {
                const std::vector<float> ts = sorted_event_ms(g_s, 2, 10, [&](int) { fn(); });
                return 1e3 * ts[ts.size() / 2];
            };
            const int splits = gpu::attention_splits(c.n, c.nh, c.nkv, c.hd, ld, ctx);
            // the verify takes the split form at any count (verify_layers), the draft and a chunk from 2 ranges
            const bool split = c.kind == kVerify ? splits >= 1 : splits > 1;
            std::string bk, ak = split ? "split, " + std::to_string(splits) + " ranges" : "single pass";
            double tb = 0, ta = 0;
            auto split_or = [&](auto&& single) {
                if (split)
                    gpu::attention_split(q.p, ld, c.n, c.nh, c.nkv, c.hd, nullptr, ctx, kc.p, c.t, vc.p, c.t, vis.p,
                                         splits, sc, out.p, g_s, c.gated);
                else
                    single();
            };
            if (c.kind == kDecode) {
                bk = "attention_kernel";
                ak = "attention_decode";
                tb = us([&] { gpu::attention_with(gpu::AttentionKernel::Rows, q.p, ld, 1, c.nh, c.nkv, c.hd, dpos.p, kc.p,
                                                  c.t, vc.p, c.t, out.p, g_s, c.gated); });
                ta = us([&] { gpu::attention(q.p, ld, 1, c.nh, c.nkv, c.hd, dpos.p, kc.p, c.t, vc.p, c.t, out.p, g_s,
                                             c.gated, nullptr, &sc, ctx); });
            } else if (c.kind == kVerify || c.kind == kDraft) {
                auto single = [&] {
                    if (c.kind == kVerify)
                        gpu::tree_attention(q.p, ld, c.n, c.nh, c.nkv, c.hd, c.gated, ctx, kc.p, c.t, vc.p, c.t, vis.p,
                                            out.p, g_s);
                    else
                        gpu::draft_attention(q.p, ld, c.n, c.nh, c.nkv, c.hd, ctx, kc.p, vc.p, c.t, false, 0, out.p, g_s);
                };
                bk = c.kind == kVerify ? "tree_attention_kernel" : "draft_attention_kernel";
                tb = us(single);
                ta = us([&] { split_or(single); });
            } else {
                bk = "flash_attention_kernel";
                tb = us([&] { gpu::attention(q.p, ld, c.n, c.nh, c.nkv, c.hd, dpos.p, kc.p, c.t, vc.p, c.t, out.p, g_s,
                                             c.gated); });
                ta = us([&] { gpu::attention(q.p, ld, c.n, c.nh, c.nkv, c.hd, dpos.p, kc.p, c.t, vc.p, c.t, out.p, g_s,
                                             c.gated, nullptr, &sc, ctx); });
            }
            printf("| %s (%d rows, %d / %d heads of %d) | %s | %d | %s | %.1f | %s | %.1f | %.1fx |\n", c.name, c.n,
                   c.nh, c.nkv, c.hd, dtype_name(c.t), ctx, bk.c_str(), tb, ak.c_str(), ta, tb / ta);
            fflush(stdout);
        }
    }
    GPU_CHECK(gpuGetLastError());
#else
    printf("--time-attention: the split forms are CUDA bf16 builds' only\n");
#endif
}

int main(int argc, char** argv) {
    gpuDeviceProp prop;
    GPU_CHECK(gpuSetDevice(0));
    GPU_CHECK(gpuGetDeviceProperties(&prop, 0));
    GPU_CHECK(gpuStreamCreate(&g_s));
    gpu::DeviceContext ctx(0);  // the ops' limits and scratch, bound for the whole check
    gpu::ContextScope bind(ctx);
    gpu::decode_setup(0);
    printf("lucebench-gpu-op-check on %s (%d SMs), weights %s\n\n", prop.name, prop.multiProcessorCount,
#if defined(LB_GPU_FP16)
           "fp16"
#else
           "bf16"
#endif
    );
    if (argc > 1 && std::string(argv[1]) == "--time-quant") {
        time_quant();
        return 0;
    }
#if !defined(__HIPCC__) && !defined(LB_USE_HIP) && !defined(LB_GPU_FP16)
    if (argc > 1 && std::string(argv[1]) == "--qmma") {
        Rng r(1);
        printf("| %-17s | %-38s | %-30s | %9s | %7s | %s |\n", "op", "variant", "shape", "error", "tol", "result");
        printf("|---|---|---|---|---|---|\n");
        check_qmma_all(r);
        printf("\n%d checks, %d failed\n", g_checks, g_failed);
        return g_failed ? 1 : 0;
    }
#endif
    if (argc > 1 && std::string(argv[1]) == "--time-attention") {
        time_attention();
        return 0;
    }
    printf("| %-17s | %-38s | %-30s | %9s | %7s | %s |\n", "op", "variant", "shape", "error", "tol", "result");
    printf("|---|---|---|---|---|---|\n");
    Rng r(1);
    check_embed(r);
    // GEMV (n <= 8): 128-bit loads (in % 8 == 0) and the scalar path
    check_matmul(r, 1, 1000, 77, false, "gemv_kernel<1>", 1e-5);
    check_matmul(r, 3, 1001, 77, true, "gemv_kernel<3> (scalar loads)", 1e-5);
    check_matmul(r, 8, 1024, 130, false, "gemv_kernel<8>", 1e-5);
#if !defined(__HIPCC__) && !defined(LB_USE_HIP)  // HIP: matmul runs the GEMV over groups of 8 tokens
    // gemm_tc (n > 8): each tile shape (64 x 128 below a wave of the bigger tiles, 128 x 128, 128 x 256 at
    // n = 4096), split-K, K not a multiple of the K step, in % 8 != 0 (W copied to the bf16 panel), odd out
    check_matmul(r, 9, 2048, 300, false, "gemm_tc 64x128, split-K", 2e-2);
    check_matmul(r, 65, 1024, 77, true, "gemm_tc 64x128, split-K", 2e-2);
    check_matmul(r, 128, 1001, 70, false, "gemm_tc (in % 8 != 0: panel)", 2e-2);
    check_matmul(r, 300, 256, 4100, true, "gemm_tc 64x128", 2e-2);
    check_matmul(r, 4096, 328, 520, false, "gemm_tc 128x128, K tail", 2e-2);
    check_matmul(r, 4096, 256, 1100, true, "gemm_tc 128x256", 2e-2);
#endif
    // GGUF block matrices: every type, each n class (GEMV n <= kQuantGemvMax, the tensor-core GEMM above it: a
    // verify's rows, split-K, two token tiles, prefill), odd output sizes, a run of rows written at a column
    // offset of a wider y. Tolerances: 1e-5 for the fp32 GEMV; 2e-2 where the GEMM rounds weights and
    // activations to bf16 (as the bf16 GEMM does).
    for (DType t : {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_0, DType::Q4_0}) {
        const int in = t == DType::Q8_0 || t == DType::Q4_0 ? 320 : 512;
        check_matmul_quant(r, t, 1, in, 77, false, 0, 77, "qgemv_kernel<1>", 1e-5);
        check_matmul_quant(r, t, 3, in + 256, 130, true, 0, 130, "qgemv_kernel<3>", 1e-5);
#if !defined(__HIPCC__) && !defined(LB_USE_HIP)
        check_matmul_quant(r, t, 23, in, 1001, false, 0, 1001, "qgemm_kernel (verify rows)", 2e-2);
#endif
    }
    // qmv_kernel (q4_K, q6_K): each token count of a pass, passes of 8 (n = 23, 32), a run of rows at a column
    // offset, odd row counts (the last warp's second row), super-block counts not a multiple of the warp's 4
    for (DType t : {DType::Q4_K, DType::Q6_K}) {
        check_matmul_quant(r, t, 1, 5120, 77, false, 0, 77, "qmv_kernel<1>", 1e-5, 1);
        check_matmul_quant(r, t, 1, 1280, 130, true, 0, 130, "qmv_kernel<1>, 5 super-blocks", 1e-5, 1);
        check_matmul_quant(r, t, 3, 768, 131, true, 0, 131, "qmv_kernel<3>", 1e-5, 1);
        check_matmul_quant(r, t, 8, 2048, 66, false, 0, 66, "qmv_kernel<8>", 1e-5, 1);
        check_matmul_quant(r, t, 23, 1024, 45, true, 3, 60, "qmv_kernel, 23 rows (8 + 8 + 7), at column 3", 1e-5, 1);
        check_matmul_quant(r, t, 32, 256, 200, false, 0, 200, "qmv_kernel, 32 rows, 1 super-block", 1e-5, 1);
        check_matmul_quant(r, t, 1, 1024, 90, false, 0, 90, "qmv_kernel<1>, x ~ 1e-12", 1e-5, 1, 1e-12f);
        check_matmul_quant(r, t, 1, 1024, 90, false, 0, 90, "qmv_kernel<1>, x ~ 1e8", 1e-5, 1, 1e8f);
#if !defined(__HIPCC__) && !defined(LB_USE_HIP)
        // qmma_kernel: each token tile count, a partial last tile, rows not a multiple of the block's 128,
        // split-K (few row blocks, many super-blocks) and one split, accumulate at a column offset
        check_matmul_quant(r, t, 5, 1024, 77, false, 0, 77, "qmma_kernel<1>, split-K", 2e-2, 2);
        check_matmul_quant(r, t, 23, 2048, 300, true, 3, 310, "qmma_kernel<3>, split-K, at column 3", 2e-2, 2);
        check_matmul_quant(r, t, 32, 512, 4100, false, 0, 4100, "qmma_kernel<4>", 2e-2, 2);
        check_matmul_quant(r, t, 65, 5120, 129, true, 0, 129, "qmma_kernel<9>, split-K", 2e-2, 2);
        check_matmul_quant(r, t, 17, 256, 40000, false, 0, 40000, "qmma_kernel<3>, one super-block", 2e-2, 2);
#endif
    }
#if !defined(__HIPCC__) && !defined(LB_USE_HIP) && !defined(LB_GPU_FP16)
    // qmma_kernel against its contracts, run to run, and in one K split (`--qmma`: the 27B's shapes)
    check_qmma(r, DType::Q4_K, {23}, 5120, 2000, false, 0, 2000, "qmma_kernel, 23 rows");
    check_qmma(r, DType::Q6_K, {41}, 17408, 700, true, 5, 720, "qmma_kernel, 68 super-blocks, at column 5");
    check_qmma_tiles(r, DType::Q4_K, 23, 33, 5120, 2000, "qmma_kernel, tile count");
    check_qmma(r, DType::Q4_K, {9}, 1024, 77, true, 2, 80, "qmma_kernel, the last round's groups over 3 warps");
    check_qmma(r, DType::Q6_K, {9}, 512, 40000, false, 0, 40000, "qmma_kernel, the last round's groups over 2 warps");
#endif
    // qmv_kernel's grid is one round of resident blocks, each warp taking groups of rows in turn: matrices of
    // many groups a warp (the 27B's gate_up and a q6_K LM head's shape, cut to 60,000 rows), the last group part
    // past the end, super-block counts not a multiple of 4 (a warp's last step partly empty), several tokens
    check_matmul_quant(r, DType::Q4_K, 1, 5120, 34816, false, 0, 34816, "qmv_kernel<1, 4 rows>, 27B gate_up", 1e-5, 1);
    check_matmul_quant(r, DType::Q6_K, 1, 5120, 60001, false, 0, 60001, "qmv_kernel<1>, many groups a warp", 1e-5, 1);
    check_matmul_quant(r, DType::Q4_K, 1, 1536, 40003, true, 0, 40003, "qmv_kernel<1, 4 rows>, 6 super-blocks", 1e-5, 1);
    check_matmul_quant(r, DType::Q4_K, 3, 1280, 30001, false, 0, 30001, "qmv_kernel<3>, many groups a warp", 1e-5, 1);
    check_matmul_quant(r, DType::Q6_K, 5, 2304, 20003, true, 0, 20003, "qmv_kernel<5>, many groups a warp", 1e-5, 1);
    check_matmul_quant(r, DType::Q4_K, 1, 17408, 5120, true, 0, 5120, "qmv_kernel<1>, 27B ffn down", 1e-5, 1);
    // the RMSNorm folded into qmv_kernel (the decode step's norms): 27B shapes (gate_up, DeltaNet in-proj, LM
    // head rows cut), small and odd ones, q4_K with 2 and 4 rows a warp
    check_matmul_quant_rmsnorm(r, DType::Q4_K, 5120, 34816, false, "qmv_kernel<1, 4 rows, norm>, 27B gate_up");
    check_matmul_quant_rmsnorm(r, DType::Q4_K, 5120, 16480, false, "qmv_kernel<1, 4 rows, norm>, 27B in-proj");
    check_matmul_quant_rmsnorm(r, DType::Q4_K, 5120, 6144, false, "qmv_kernel<1, norm>");
    check_matmul_quant_rmsnorm(r, DType::Q6_K, 5120, 30001, false, "qmv_kernel<1, norm>, LM head rows");
    check_matmul_quant_rmsnorm(r, DType::Q4_K, 1280, 77, true, "qmv_kernel<1, norm>, 5 super-blocks");
    check_matmul_quant_rmsnorm(r, DType::Q6_K, 256, 131, true, "qmv_kernel<1, norm>, 1 super-block");
    check_matmul_quant_rmsnorm(r, DType::Q4_K, 9216, 20000, false, "qmv_kernel<1, 4 rows, norm>, dim > 8192");
    check_matmul_quant_rmsnorm(r, DType::Q6_K, 11264, 3001, true, "qmv_kernel<1, norm>, the fold's widest row");
    check_matmul_quant_rmsnorm(r, DType::Q4_K, 11264, 777, false, "qmv_kernel<1, norm>, the fold's widest row");
    // and the MLP's SwiGLU (gate rows, then up rows): the 27B's gate_up, 2 and 4 rows a warp, q6_K
    check_matmul_quant_rmsnorm(r, DType::Q4_K, 5120, 34816, false, "qmv_kernel<1, 4 rows, swiglu>, 27B gate_up", true);
    check_matmul_quant_rmsnorm(r, DType::Q4_K, 1280, 1004, false, "qmv_kernel<1, 2 rows, swiglu>", true);
    check_matmul_quant_rmsnorm(r, DType::Q6_K, 2560, 20004, false, "qmv_kernel<1, swiglu>", true);
    // q4_K, 1-2 tokens, >= kQmvWideRows rows: 4 rows a warp (the last warp's rows partly past the end)
    check_matmul_quant(r, DType::Q4_K, 1, 1280, 16387, false, 0, 16387, "qmv_kernel<1, 4 rows a warp>", 1e-5, 1);
    check_matmul_quant(r, DType::Q4_K, 2, 2304, 16390, true, 0, 16390, "qmv_kernel<2, 4 rows a warp>", 1e-5, 1);
    check_matmul_quant(r, DType::Q4_K, 4, 2560, 33, true, 5, 50, "qgemv_kernel<4>, at column 5", 1e-5);
    check_matmul_quant(r, DType::Q6_K, 9, 1024, 4096, false, 0, 4096, "n = 9: qgemm (CUDA), GEMV groups (HIP)", 2e-2);
#if !defined(__HIPCC__) && !defined(LB_USE_HIP)
    check_matmul_quant(r, DType::Q4_K, 5, 2560, 77, false, 0, 77, "qgemm_kernel, split-K", 2e-2);
    check_matmul_quant(r, DType::Q6_K, 63, 4352, 515, true, 3, 530, "qgemm_kernel, split-K, at column 3", 2e-2);
    check_matmul_quant(r, DType::Q5_K, 63, 768, 130, false, 0, 130, "qgemm_kernel (one token tile)", 2e-2);
    check_matmul_quant(r, gpu::kWtypeDType, 23, 512, 77, false, 0, 77, "qgemm_kernel", 2e-2);
    // gemm_tc (n >= kGemmTcMinRows): every type, W dequantised to the bf16 panel (wtype rows read in place);
    // n = 65 (split-K, at a column offset of a wider y), 128, 300, 4096 (each tile shape), out not a multiple
    // of 128, accumulate on and off; and a W over one panel (128 MB of bf16: two panels)
    for (DType t : {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_0, DType::Q4_0, gpu::kWtypeDType}) {
        check_matmul_quant(r, t, 65, 512, 77, true, 3, 90, "gemm_tc, split-K, at column 3", 2e-2);
        check_matmul_quant(r, t, 128, 768, 300, false, 0, 300, "gemm_tc", 2e-2);
        check_matmul_quant(r, t, 300, 512, 1001, true, 0, 1001, "gemm_tc", 2e-2);
        const bool wide = t == DType::Q4_K || t == DType::Q8_0 || t == gpu::kWtypeDType;
        check_matmul_quant(r, t, 4096, 256, wide ? 1100 : 650, t == DType::Q6_K || t == gpu::kWtypeDType, 0,
                           wide ? 1100 : 650, wide ? "gemm_tc 128x256" : "gemm_tc 128x128", 2e-2);
    }
    check_matmul_quant(r, DType::Q4_K, 65, 4096, 16500, false, 0, 16500, "gemm_tc, two W panels", 2e-2);
#endif
    check_matmul_quant(r, gpu::kWtypeDType, 1, 1000, 77, false, 0, 77, "qgemv_kernel<1>", 1e-5);
    for (DType t : {DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_0, DType::Q4_0}) check_embed_quant(r, t);
    check_heads_to_tiled(r, 3, 2, 6, 40);
    check_heads_to_tiled(r, 2, 16, 48, 128);  // the 27B's DeltaNet output, 24 blocks a row
    check_rmsnorm(r, 7, 1000);
    check_rmsnorm(r, 3, 37);
    check_rmsnorm(r, 1, 5120);  // registers (24 a thread, 4 of them padding)
    check_rmsnorm(r, 2, 8192);  // registers, full
    check_rmsnorm(r, 2, 9000);  // the strided loop
    check_gated_rmsnorm(r, 3, 4, 128);
    check_gated_rmsnorm(r, 5, 12, 128, 4);  // the 27B's 48 value heads over 16 key heads, in fewer
    for (int K = 1; K <= 8; ++K) check_conv1d(r, 13, 300, K);
    check_deltanet_prep(r);
    // first, while the two-pass form's chunk buffer is empty: under capture it cannot grow
    check_delta_rule(r, 70, 2, 4, 128, 128, "cols<32,16> (graph capture)", true);
    check_delta_rule(r, 70, 2, 4, 128, 128, "wy<32,16> (two-pass)");
    check_delta_rule(r, 1, 2, 4, 128, 128, "wy<32,16>, one step");
    check_delta_rule(r, 37, 1, 2, 64, 40, "delta_rule_kernel (dv % 16 != 0)");
    check_delta_rule(r, 20, 1, 1, 320, 32, "delta_rule_kernel (dk > 256)");
    printf("| %-17s | %-38s | %-30s | not selectable here: the 32-token column kernel fits (dk <= 256) |\n", "delta_rule",
           "cols<16,16>", "small shared memory only");
    // the verify's tree form: the 27B's 23 rows (fused, with programmatic dependent launch), 9 rows, 41 and 65
    // rows (fused above 48 KB of shared memory), dk 256; the fallbacks named; 129 rows: the launcher's choice,
    // the split kernels (the fused kernel's shared memory does not fit)
    using DTK = gpu::DeltaTreeKernel;
    for (bool chain : {false, true}) {
        check_delta_tree(r, 23, 2, 6, 128, 128, chain, DTK::Auto, "fused");
        check_delta_tree(r, 9, 2, 6, 128, 128, chain, DTK::Auto, "fused");
        check_delta_tree(r, 41, 1, 3, 128, 128, chain, DTK::Auto, "fused, > 48 KB");
        check_delta_tree(r, 65, 1, 2, 128, 64, chain, DTK::Auto, "fused, > 48 KB");
        check_delta_tree(r, 17, 1, 2, 256, 32, chain, DTK::Fused, "fused");
        check_delta_tree(r, 23, 2, 6, 128, 128, chain, DTK::Split, "split");
        check_delta_tree(r, 23, 1, 3, 128, 128, chain, DTK::PerHead, "one block a head");
        check_delta_tree(r, 13, 1, 3, 48, 32, chain, DTK::Auto, "auto (dk % 32 != 0: split)");
    }
    check_delta_tree(r, 129, 1, 2, 128, 128, false, DTK::Auto, "auto (129 rows: split)");
    check_delta_tree(r, 7, 1, 2, 128, 40, false, DTK::Auto, "auto (dv % 16 != 0: one block a head)");
    const char* one = "conv_tree_prep_kernel";
    check_conv_tree_prep(r, 23, 2, 128, 6, 128, 4, one);  // the 27B's heads (16 / 48) in fewer
    check_conv_tree_prep(r, 9, 1, 256, 3, 64, 3, one);
    check_conv_tree_prep(r, 7, 2, 48, 5, 40, 4, one);
    check_conv_tree_prep(r, 5, 1, 320, 2, 64, 4, "conv_tree + deltanet_prep (dk > 256)");
    check_attn_prep(r, 5, 8, 2, 256, 64, DType::BF16, "attn_prep_kernel<bf16>");
    check_attn_prep(r, 3, 4, 2, 128, 32, DType::BF16, "attn_prep_kernel<bf16>");
    for (DType t : {DType::F32, DType::F16, DType::Q8_0, DType::Q4_0})
        check_attn_prep(r, 4, 8, 2, 256, 64, t, "attn_prep_kernel<any>");
#if !defined(__HIPCC__) && !defined(LB_USE_HIP)  // the tiled prefill kernels are CUDA's
    {
        using K = gpu::AttentionKernel;
        // the prefill kernel (bf16 builds): Qwen3.5's gated hd 256 (27B: 24 / 4 heads, G 6; 0.8B: 8 / 2), a
        // first chunk and a chunk continuing at pos0 > 0, n not a multiple of the query tile, the cache types
        check_attention(r, 40, 8, 2, 256, DType::BF16, K::Auto, 2e-2);
        check_attention(r, 300, 24, 4, 256, DType::BF16, K::Auto, 2e-2, true, 0);
        check_attention(r, 150, 24, 4, 256, DType::BF16, K::Auto, 2e-2, true, 1000, ", chunk at 1000");
        check_attention(r, 70, 8, 2, 256, DType::Q8_0, K::Auto, 2e-2, true, 333);
        check_attention(r, 70, 8, 2, 256, DType::Q4_0, K::Auto, 2e-2, true, 65);
        check_attention(r, 20, 8, 2, 256, DType::F16, K::Auto, 2e-2);
        // the older kernels, still selected for the shapes the prefill kernel does not take (fp16 builds;
        // 8 .. 15 rows)
        check_attention(r, 40, 8, 2, 256, DType::BF16, K::Wmma, 2e-2);
        check_attention(r, 33, 8, 2, 128, DType::BF16, K::Wmma, 2e-2);
        check_attention(r, 12, 8, 2, 256, DType::BF16, K::Auto, 5e-4);
        check_attention(r, 9, 8, 2, 128, DType::Q8_0, K::Auto, 5e-4);
    }
#endif
    check_attention(r, 5, 8, 2, 256, DType::BF16, gpu::AttentionKernel::Auto, 5e-4, true, 9, " (n < 8)");
    // Qwen3 (no output gate, q_proj rows queries only)
    check_attn_prep(r, 5, 16, 8, 128, 128, DType::BF16, "attn_prep_kernel<bf16>, no gate", false);
    check_attn_prep(r, 3, 6, 2, 64, 64, DType::Q8_0, "attn_prep_kernel<any>, no gate", false);
#if !defined(__HIPCC__) && !defined(LB_USE_HIP)
    {
        using K = gpu::AttentionKernel;
        // the prefill kernel on the drafter's shape (Qwen3-0.6B: 16 / 8 heads of 128, no gate) and GQA ratios
        // 1 / 2 / 3 / 6 (3 and 6 leave idle vectors in the 128-vector tile), chunks continuing at pos0 > 0
        check_attention(r, 40, 16, 8, 128, DType::BF16, K::Auto, 2e-2, false);
        check_attention(r, 517, 16, 8, 128, DType::BF16, K::Auto, 2e-2, false, 0);
        check_attention(r, 200, 16, 8, 128, DType::BF16, K::Auto, 2e-2, false, 1777, ", chunk at 1777");
        check_attention(r, 130, 4, 4, 128, DType::BF16, K::Auto, 2e-2, false, 100, ", G 1");
        check_attention(r, 130, 6, 2, 128, DType::BF16, K::Auto, 2e-2, false, 100, ", G 3");
        check_attention(r, 130, 12, 2, 128, DType::BF16, K::Auto, 2e-2, false, 100, ", G 6");
        check_attention(r, 130, 12, 2, 128, DType::BF16, K::Auto, 2e-2, true, 100, ", G 6");
        check_attention(r, 90, 16, 8, 128, DType::Q8_0, K::Auto, 2e-2, false, 300);
        check_attention(r, 90, 16, 8, 128, DType::Q4_0, K::Auto, 2e-2, false, 300);
        check_attention(r, 40, 16, 8, 128, DType::BF16, K::Wmma, 2e-2, false);
        check_attention(r, 12, 16, 8, 128, DType::BF16, K::Auto, 5e-4, false);
        check_attention_choice(8192, 16, 8, 128, false, K::Flash);  // the drafter's prefill chunk
        check_attention_choice(2048, 24, 4, 256, true, K::Flash);   // the 27B's full-attention layers
        check_attention_choice(12, 16, 8, 128, false, K::Tiled);
        check_attention_choice(1, 16, 8, 128, false, K::Rows);
        check_attention_choice(4096, 16, 8, 48, false, K::Rows);    // the trained reference drafter (hd 48)
    }
#endif
    check_attention(r, 5, 16, 8, 128, DType::BF16, gpu::AttentionKernel::Auto, 5e-4, false, 9, " (n < 8)");
    check_attention(r, 20, 6, 2, 64, DType::Q4_0, gpu::AttentionKernel::Auto, 5e-4, false, 9, " (hd 64)");
    check_attention(r, 30, 6, 2, 48, DType::BF16, gpu::AttentionKernel::Auto, 5e-4, false, 9, " (hd 48)");
    // PFlash tail scores (Qwen3-0.6B's heads; an odd shape with partial rotary; quantised keys)
    check_tail_scores(r, 12, 8, 16, 8, 128, 128, 3000, DType::BF16, false);
    check_tail_scores(r, 5, 3, 6, 2, 40, 24, 301, DType::F32, false);
    check_tail_scores(r, 9, 8, 8, 2, 256, 64, 777, DType::Q8_0, true);
    check_tail_scores(r, 8, 8, 16, 8, 128, 128, 513, DType::Q4_0, false);
#if !defined(__HIPCC__) && !defined(LB_USE_HIP)
    // block-sparse attention (the PFlash drafter's option): Qwen3-0.6B's heads; a chunk not aligned to blocks
    check_block_sparse(r, 300, 1500, 16, 8, 128, DType::BF16);
    check_block_sparse(r, 200, 1000 + 37, 16, 8, 128, DType::Q8_0);
    check_block_sparse(r, 100, 1500, 8, 2, 256, DType::BF16);  // the qwen3.5 shape (hd 256)
    // the budget (PFlash's bound on the kept blocks): binding at 10% and 15%; G 6, hd 256 with q4_0 keys
    check_block_sparse(r, 300, 3000, 16, 8, 128, DType::BF16, 0.10f);
    check_block_sparse(r, 257, 2000 + 11, 16, 8, 128, DType::Q8_0, 0.15f);
    check_block_sparse(r, 150, 3000, 24, 4, 256, DType::Q4_0, 0.10f);
#endif
    check_attention(r, 20, 6, 2, 64, DType::Q4_0, gpu::AttentionKernel::Auto, 5e-4, true, 9, " (hd 64)");
    check_silu_mul(r, 3, 1001);
    check_argmax_pos(r);
    check_argmax_rows(r, 23, 248320);
    check_argmax_rows(r, 9, 100003);
    check_gemv_fused(r);
    check_transpose_mlp(r, 1024, 3584);
    check_transpose_mlp(r, 1000, 777);
    for (int dk : {64, 128, 256}) check_delta_decode(r, 2, 4, dk, dk == 64 ? 96 : 128);
    check_delta_out(r, 1024, 16, 16);
    check_delta_out(r, 256, 4, 8);
    for (int hd : {256, 128})
        for (int G : {4, 8})
            for (DType t : {DType::BF16, DType::F16}) check_attention_decode(r, 2 * G, 2, hd, t, 37);
    check_attention_decode(r, 8, 2, 256, DType::BF16, 3000);
    check_attention_decode(r, 16, 2, 128, DType::Q8_0, 1500);
    check_attn_decode_short(r, 8, 2, 100);
    check_attn_decode_short(r, 8, 2, 250);
    // one row through attention() with a workspace's scratch (the unfused GGUF decode): flash-decoding; the
    // 27B's heads (24 / 4, hd 256, gated, G 6) and G 2 (hd 128, gated and not), every KV type, 3K and 40K keys
    check_attention_split(r, 1, 24, 4, 256, DType::BF16, 40013, 0, true);
    check_attention_split(r, 1, 24, 4, 256, DType::Q8_0, 3000, 0, true);
    check_attention_split(r, 1, 24, 4, 256, DType::Q4_0, 40013, 0, true);
    check_attention_split(r, 1, 8, 4, 128, DType::BF16, 3000, 0, true);
    check_attention_split(r, 1, 16, 8, 128, DType::Q8_0, 40013, 0, false);
#if !defined(__HIPCC__) && !defined(LB_USE_HIP)
    // a few rows (a DFlash verify's 23, a short chunk's 2): attention() picks key ranges at 3K and 40K (the
    // single pass in fp16 builds); explicit range counts at 3K; a verify tree at 40K, and at 300 keys in one
    // range (verify_layers takes the split form at any context); no cached keys at all (every range empty)
    check_attention_split(r, 23, 24, 4, 256, DType::BF16, 3000, 0, true);
    check_attention_split(r, 23, 24, 4, 256, DType::BF16, 40013, 0, true);
    check_attention_split(r, 23, 24, 4, 256, DType::Q8_0, 40013, 0, true);
    check_attention_split(r, 2, 24, 4, 256, DType::BF16, 40013, 0, true);
    check_attention_split(r, 23, 16, 8, 128, DType::BF16, 40013, 0, false);
#if !defined(LB_GPU_FP16)  // the split form runs the bf16 flash kernel
    check_attention_split(r, 23, 24, 4, 256, DType::BF16, 3000, 5, true);
    check_attention_split(r, 23, 24, 4, 256, DType::Q4_0, 3000, 7, true);
    check_attention_split(r, 23, 8, 4, 128, DType::Q8_0, 3000, 3, true);
    check_attention_split(r, 23, 24, 4, 256, DType::BF16, 40013, 0, true, kTree);
    check_attention_split(r, 23, 24, 4, 256, DType::BF16, 300, 0, true, kTree);
    check_attention_split(r, 41, 24, 4, 256, DType::Q8_0, 40013, 8, true, kTree);
    check_attention_split(r, 9, 8, 2, 256, DType::BF16, 0, 3, true);
    // the DFlash draft's block (z-lab 27B draft: 32 / 8 heads of 128, 16 rows, non-causal, f32 or bf16 cache)
    check_attention_split(r, 16, 32, 8, 128, DType::F32, 40013, 0, false, kAll);
    check_attention_split(r, 16, 32, 8, 128, DType::BF16, 40013, 0, false, kAll);
#else
    printf("| %-17s | %-38s | %-30s | not selectable in this build (CUDA bf16 builds only) |\n", "attention_split",
           "flash_attention_kernel, split", "");
#endif
#endif
    printf("\n%d checks, %d failed\n", g_checks, g_failed);
    return g_failed ? 1 : 0;
}
