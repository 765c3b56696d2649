// Reading GGUF's block formats 8 elements at a time, as ggml's dequantize_row_* gives them (the CPU reference:
// decode_row in ../quant.cpp). Host and device code, so that a host check can compare them with decode_row.
#pragma once
#include <cstdint>
#include <cstring>

#include "../half.h"
#include "../quant.h"
#include "gpu_compat.h"

namespace lb::gpu {

__host__ __device__ __forceinline__ float h2f(uint16_t h) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    return __half2float(__ushort_as_half(h));
#else
    return f16_to_f32(h);
#endif
}
__host__ __device__ __forceinline__ uint16_t ld16(const uint8_t* p) { return *(const uint16_t*)p; }
// Blocks of 210, 34 and 18 bytes are only 2-byte aligned: 32-bit words from two 16-bit loads.
__host__ __device__ __forceinline__ uint32_t ld32_a2(const uint8_t* p) {
    return uint32_t(ld16(p)) | (uint32_t(ld16(p + 2)) << 16);
}
// A small non-negative integer as float without the (quarter-rate) int-to-float conversion: 2^23 + q has q
// in its mantissa; the subtraction is exact.
__host__ __device__ __forceinline__ float small_f(uint32_t q) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
    return __int_as_float(0x4B000000u | q) - 8388608.f;
#else
    float f;
    const uint32_t u = 0x4B000000u | q;
    std::memcpy(&f, &u, 4);
    return f - 8388608.f;
#endif
}

__host__ __device__ __forceinline__ void q4k_sm(int j, const uint8_t* q, int* d, int* m) {
    if (j < 4) { *d = q[j] & 63; *m = q[j + 4] & 63; }
    else { *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4); *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4); }
}

// Elements [k, k + 8) (k % 8 == 0) of a row of type T, as ggml's dequantize_row_* gives them.
template <DType T>
__host__ __device__ __forceinline__ void dq8(const uint8_t* row, int k, float v[8]) {
    if constexpr (T == DType::Q4_K || T == DType::Q5_K) {
        constexpr int BB = T == DType::Q4_K ? 144 : 176;
        const uint8_t* b = row + size_t(k >> 8) * BB;
        const int j = k & 255, g = j >> 6, hi = (j >> 5) & 1, l = j & 31;
        int sc, mn;
        q4k_sm(2 * g + hi, b + 4, &sc, &mn);
        const float d1 = h2f(ld16(b)) * float(sc), m1 = h2f(ld16(b + 2)) * float(mn);
        const uint8_t* qs = b + (T == DType::Q4_K ? 16 : 48) + 32 * g + l;
        const uint2 q = *(const uint2*)qs;  // 8-byte aligned: blocks are 16-byte multiples
        uint2 h = make_uint2(0u, 0u);
        if constexpr (T == DType::Q5_K) h = *(const uint2*)(b + 16 + l);
        const int bit = 2 * g + hi;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const uint32_t w = i < 4 ? q.x : q.y, sh = 8 * (i & 3);
            uint32_t nib = ((w >> sh) >> (4 * hi)) & 0xF;
            if constexpr (T == DType::Q5_K) nib |= (((i < 4 ? h.x : h.y) >> sh >> bit) & 1u) << 4;
            v[i] = d1 * small_f(nib) - m1;
        }
    } else if constexpr (T == DType::Q6_K) {
        const uint8_t* b = row + size_t(k >> 8) * 210;
        const int j = k & 255, half = j >> 7, r = j & 127, quad = r >> 5, l = r & 31;
        const float d = h2f(ld16(b + 208));
        const float ds = d * float(int8_t(b[192 + 8 * half + (l >> 4) + 2 * quad]));
        const uint8_t* ql = b + 64 * half + l + 32 * (quad & 1);
        const uint8_t* qh = b + 128 + 32 * half + l;
        const uint32_t l0 = ld32_a2(ql), l1 = ld32_a2(ql + 4), h0 = ld32_a2(qh), h1 = ld32_a2(qh + 4);
        const int lsh = quad >= 2 ? 4 : 0, hsh = 2 * quad;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const uint32_t sh = 8 * (i & 3);
            const uint32_t lo = (((i < 4 ? l0 : l1) >> sh) >> lsh) & 0xF, hb = (((i < 4 ? h0 : h1) >> sh) >> hsh) & 3;
            v[i] = ds * (small_f(lo | (hb << 4)) - 32.f);
        }
    } else if constexpr (T == DType::Q8_0) {
        const uint8_t* b = row + size_t(k >> 5) * 34;
        const float d = h2f(ld16(b));
        const uint8_t* qs = b + 2 + (k & 31);
        const uint32_t w0 = ld32_a2(qs), w1 = ld32_a2(qs + 4);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const uint32_t byte = ((i < 4 ? w0 : w1) >> (8 * (i & 3))) & 0xFF;
            v[i] = d * (small_f(byte ^ 0x80u) - 128.f);  // int8 q = (q ^ 0x80) - 128
        }
    } else if constexpr (T == DType::Q4_0) {
        const uint8_t* b = row + size_t(k >> 5) * 18;
        const float d = h2f(ld16(b));
        const int j = k & 31, hi = j >> 4;
        const uint8_t* qs = b + 2 + (j & 15);
        const uint32_t w0 = ld32_a2(qs), w1 = ld32_a2(qs + 4);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const uint32_t nib = (((i < 4 ? w0 : w1) >> (8 * (i & 3))) >> (4 * hi)) & 0xF;
            v[i] = d * (small_f(nib) - 8.f);
        }
    } else {  // the backend's wtype (device code only)
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
        const uint4 p = *(const uint4*)(row + size_t(k) * sizeof(wtype));
        const wtype* w = (const wtype*)&p;
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = w2f(w[i]);
#endif
    }
}

// f[i] = 2^23 + byte i of w (the byte in the mantissa; one byte permute a value on the device).
__host__ __device__ __forceinline__ void bytes_f(uint32_t w, float f[4]) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
        f[i] = __int_as_float(__byte_perm(w, 0x4B000000u, 0x7440u + i));
#else
        const uint32_t u = 0x4B000000u | ((w >> (8 * i)) & 0xFF);
        std::memcpy(&f[i], &u, 4);
#endif
    }
}

}  // namespace lb::gpu
