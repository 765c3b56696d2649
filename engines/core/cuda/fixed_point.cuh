// 64-bit fixed-point sums for split-K reductions across blocks (the fused MLP, out-projection and attention
// of the megakernel, ar's fused MLP): each block adds its share of an output with an integer atomic.
// Integer addition is associative, so the total does not depend on the order in which blocks arrive and
// greedy decoding stays repeatable. 2^-32 resolution, |v| < 2^31.
#pragma once

#include "gpu_compat.h"

namespace lb::gpu {

constexpr float FIX_SCALE = 4294967296.f, FIX_INV = 1.f / 4294967296.f;
__device__ __forceinline__ unsigned long long to_fix(float v) {
    return (unsigned long long)__float2ll_rn(fminf(fmaxf(v, -2.1e9f), 2.1e9f) * FIX_SCALE);
}
__device__ __forceinline__ float from_fix(unsigned long long v) { return __ll2float_rn((long long)v) * FIX_INV; }

}  // namespace lb::gpu
