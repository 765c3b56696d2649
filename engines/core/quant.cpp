#include "quant.h"

#include <cmath>
#include <cstring>

#include "errors.h"
#include "half.h"

namespace lb {

const char* dtype_name(DType t) {
    switch (t) {
        case DType::F32: return "f32";
        case DType::F16: return "f16";
        case DType::BF16: return "bf16";
        case DType::Q8_0: return "q8_0";
        case DType::Q4_0: return "q4_0";
        case DType::Q4_K: return "q4_k";
        case DType::Q5_K: return "q5_k";
        case DType::Q6_K: return "q6_k";
    }
    return "?";
}

bool dtype_from_name(const std::string& name, DType* out) {
    static const std::pair<const char*, DType> table[] = {{"f32", DType::F32}, {"f16", DType::F16}, {"bf16", DType::BF16},
                                                         {"q8_0", DType::Q8_0}, {"q4_0", DType::Q4_0}};
    for (auto& [n, t] : table) if (name == n) { *out = t; return true; }
    return false;
}

size_t dtype_block_elems(DType t) {
    switch (t) {
        case DType::Q8_0: case DType::Q4_0: return QK;
        case DType::Q4_K: case DType::Q5_K: case DType::Q6_K: return QK_K;
        default: return 1;
    }
}

size_t dtype_block_bytes(DType t) {
    switch (t) {
        case DType::F32: return 4;
        case DType::F16: case DType::BF16: return 2;
        case DType::Q8_0: return sizeof(BlockQ8_0);
        case DType::Q4_0: return sizeof(BlockQ4_0);
        case DType::Q4_K: return sizeof(BlockQ4_K);
        case DType::Q5_K: return sizeof(BlockQ5_K);
        case DType::Q6_K: return sizeof(BlockQ6_K);
    }
    return 0;
}

void encode_row(DType t, const float* src, void* dst, size_t n) {
    switch (t) {
        case DType::F32: memcpy(dst, src, n * 4); return;
        case DType::F16: for (size_t i = 0; i < n; ++i) ((uint16_t*)dst)[i] = f32_to_f16(src[i]); return;
        case DType::BF16: for (size_t i = 0; i < n; ++i) ((uint16_t*)dst)[i] = f32_to_bf16(src[i]); return;
        case DType::Q8_0: {
            auto* b = (BlockQ8_0*)dst;
            for (size_t blk = 0; blk < n / QK; ++blk) {
                const float* x = src + blk * QK;
                float amax = 0;
                for (int j = 0; j < QK; ++j) amax = std::fmax(amax, std::fabs(x[j]));
                float d = amax / 127.f;
                float id = d ? 1.f / d : 0.f;
                b[blk].d = f32_to_f16(d);
                for (int j = 0; j < QK; ++j) b[blk].qs[j] = int8_t(std::lround(x[j] * id));
            }
            return;
        }
        case DType::Q4_0: {
            // Scale from the signed value of largest magnitude so that it maps exactly to -8 (ggml's choice).
            auto* b = (BlockQ4_0*)dst;
            for (size_t blk = 0; blk < n / QK; ++blk) {
                const float* x = src + blk * QK;
                float amax = 0, vmax = 0;
                for (int j = 0; j < QK; ++j) if (std::fabs(x[j]) > amax) { amax = std::fabs(x[j]); vmax = x[j]; }
                float d = vmax / -8.f;
                float id = d ? 1.f / d : 0.f;
                b[blk].d = f32_to_f16(d);
                for (int j = 0; j < QK / 2; ++j) {
                    int q0 = std::min(15, int(x[j] * id + 8.5f));
                    int q1 = std::min(15, int(x[j + QK / 2] * id + 8.5f));
                    b[blk].qs[j] = uint8_t(q0 | (q1 << 4));
                }
            }
            return;
        }
        default: fail("unsupported", std::string("cannot encode ") + dtype_name(t));
    }
}

static void q4k_scale_min(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
    if (j < 4) { *d = q[j] & 63; *m = q[j + 4] & 63; }
    else { *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4); *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4); }
}

void decode_row(DType t, const void* src, float* dst, size_t n) {
    switch (t) {
        case DType::F32: memcpy(dst, src, n * 4); return;
        case DType::F16: for (size_t i = 0; i < n; ++i) dst[i] = f16_to_f32(((const uint16_t*)src)[i]); return;
        case DType::BF16: for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(((const uint16_t*)src)[i]); return;
        case DType::Q8_0: {
            auto* b = (const BlockQ8_0*)src;
            for (size_t blk = 0; blk < n / QK; ++blk) {
                float d = f16_to_f32(b[blk].d);
                for (int j = 0; j < QK; ++j) dst[blk * QK + j] = d * b[blk].qs[j];
            }
            return;
        }
        case DType::Q4_0: {
            auto* b = (const BlockQ4_0*)src;
            for (size_t blk = 0; blk < n / QK; ++blk) {
                float d = f16_to_f32(b[blk].d);
                for (int j = 0; j < QK / 2; ++j) {
                    dst[blk * QK + j] = d * (int(b[blk].qs[j] & 0xF) - 8);
                    dst[blk * QK + j + QK / 2] = d * (int(b[blk].qs[j] >> 4) - 8);
                }
            }
            return;
        }
        case DType::Q4_K: {
            auto* b = (const BlockQ4_K*)src;
            for (size_t blk = 0; blk < n / QK_K; ++blk) {
                float d = f16_to_f32(b[blk].d), dmin = f16_to_f32(b[blk].dmin);
                const uint8_t* q = b[blk].qs;
                float* y = dst + blk * QK_K;
                for (int j = 0, is = 0; j < QK_K; j += 64, is += 2, q += 32) {
                    uint8_t sc, m;
                    q4k_scale_min(is, b[blk].scales, &sc, &m);
                    float d1 = d * sc, m1 = dmin * m;
                    q4k_scale_min(is + 1, b[blk].scales, &sc, &m);
                    float d2 = d * sc, m2 = dmin * m;
                    for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
                    for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
                }
            }
            return;
        }
        case DType::Q5_K: {
            // As q4_K, with a fifth bit per element in qh: bit 2i (low nibbles) and 2i + 1 (high nibbles)
            // of qh[l] for the i-th 64-element group.
            auto* b = (const BlockQ5_K*)src;
            for (size_t blk = 0; blk < n / QK_K; ++blk) {
                float d = f16_to_f32(b[blk].d), dmin = f16_to_f32(b[blk].dmin);
                const uint8_t* ql = b[blk].qs;
                const uint8_t* qh = b[blk].qh;
                float* y = dst + blk * QK_K;
                uint8_t u1 = 1, u2 = 2;
                for (int j = 0, is = 0; j < QK_K; j += 64, is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
                    uint8_t sc, m;
                    q4k_scale_min(is, b[blk].scales, &sc, &m);
                    float d1 = d * sc, m1 = dmin * m;
                    q4k_scale_min(is + 1, b[blk].scales, &sc, &m);
                    float d2 = d * sc, m2 = dmin * m;
                    for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
                    for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
                }
            }
            return;
        }
        case DType::Q6_K: {
            auto* b = (const BlockQ6_K*)src;
            for (size_t blk = 0; blk < n / QK_K; ++blk) {
                float d = f16_to_f32(b[blk].d);
                const uint8_t* ql = b[blk].ql;
                const uint8_t* qh = b[blk].qh;
                const int8_t* sc = b[blk].scales;
                float* y = dst + blk * QK_K;
                for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
                    for (int l = 0; l < 32; ++l) {
                        int is = l / 16;
                        int q1 = int((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                        int q2 = int((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                        int q3 = int((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                        int q4 = int((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                        y[l] = d * sc[is] * q1;
                        y[l + 32] = d * sc[is + 2] * q2;
                        y[l + 64] = d * sc[is + 4] * q3;
                        y[l + 96] = d * sc[is + 6] * q4;
                    }
                }
            }
            return;
        }
    }
}

}  // namespace lb
