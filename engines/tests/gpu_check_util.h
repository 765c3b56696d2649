// What the GPU check binaries (dflash_gpu_check.cu, verify_kernels_check.cu, gpu_op_check.cu, and the
// benchmarks gemm_bench.cu / attention_bench.cu) share: the count of checks run and failed, random inputs,
// host <-> device copies, the relative error of a GPU result against its CPU reference with the line that
// reports it, and the median time of a timed call. Each binary is one translation unit, so the
// definitions here are inline.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/cuda/gpu_compat.h"

// Checks run and failed; main() exits 1 when any failed.
inline int g_checks = 0, g_failed = 0;

// The random inputs (a binary reseeds it for inputs of its own).
inline std::mt19937 rng(1234);

inline std::vector<float> randn(size_t n, float sd = 1.f) {
    std::normal_distribution<float> nd(0.f, sd);
    std::vector<float> v(n);
    for (auto& e : v) e = nd(rng);
    return v;
}

// A device copy of v (the caller frees it with gpuFree).
template <class T> T* up(const std::vector<T>& v) {
    T* d = nullptr;
    GPU_CHECK(gpuMalloc((void**)&d, std::max<size_t>(1, v.size()) * sizeof(T)));
    if (!v.empty()) GPU_CHECK(gpuMemcpy(d, v.data(), v.size() * sizeof(T), gpuMemcpyHostToDevice));
    return d;
}
// n elements of d after the default stream's work, which must have raised no error.
template <class T> std::vector<T> down(const T* d, size_t n) {
    GPU_CHECK(gpuStreamSynchronize(0));
    GPU_CHECK(gpuGetLastError());
    std::vector<T> v(n);
    GPU_CHECK(gpuMemcpy(v.data(), d, n * sizeof(T), gpuMemcpyDeviceToHost));
    return v;
}

// max |got - want| / max |want|; infinite where got holds a NaN or an infinity that want does not (fmax would
// drop a NaN: an unwritten element stays caught), or where the sizes differ.
inline double rel_diff(const std::vector<float>& got, const std::vector<float>& want) {
    double d = 0, s = 0;
    for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
        if (!std::isfinite(got[i]) && std::isfinite(want[i])) return INFINITY;
        d = std::fmax(d, std::fabs(double(got[i]) - want[i]));
        s = std::fmax(s, std::fabs(double(want[i])));
    }
    return got.size() != want.size() ? INFINITY : (s > 0 ? d / s : d);
}

// Counts one check and prints its line; true when it passed.
inline bool report(const std::string& what, double rel, double tol) {
    ++g_checks;
    const bool ok = rel <= tol;
    if (!ok) ++g_failed;
    printf("  %-64s max rel diff %.2e %s\n", what.c_str(), rel, ok ? "ok" : "FAIL");
    return ok;
}
inline bool compare(const std::string& what, const std::vector<float>& got, const std::vector<float>& want,
                    double tol) {
    return report(what, rel_diff(got, want), tol);
}

// The times of `reps` timed calls fn(r), r = warmups .. warmups + reps - 1, after `warmups` calls fn(0 ..
// warmups - 1) whose times are dropped: milliseconds between events recorded on stream s around each call,
// sorted (the median is the middle one).
template <class F> std::vector<float> sorted_event_ms(gpuStream_t s, int warmups, int reps, F&& fn) {
    gpuEvent_t e0, e1;
    GPU_CHECK(gpuEventCreate(&e0));
    GPU_CHECK(gpuEventCreate(&e1));
    std::vector<float> ts;
    for (int r = 0; r < warmups + reps; ++r) {
        GPU_CHECK(gpuEventRecord(e0, s));
        fn(r);
        GPU_CHECK(gpuEventRecord(e1, s));
        GPU_CHECK(gpuEventSynchronize(e1));
        float ms = 0;
        GPU_CHECK(gpuEventElapsedTime(&ms, e0, e1));
        if (r >= warmups) ts.push_back(ms);
    }
    GPU_CHECK(gpuEventDestroy(e0));
    GPU_CHECK(gpuEventDestroy(e1));
    std::sort(ts.begin(), ts.end());
    return ts;
}
