// Block-quantised formats shared by the KV cache and the GGUF loader (ggml's layouts, so a GGUF tensor
// can be read as is). Reference (CPU) encoders and decoders; the CUDA kernels mirror the decoders.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace lb {

// Element types of tensors: weights in files and the KV cache.
enum class DType { F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K };

const char* dtype_name(DType t);
bool dtype_from_name(const std::string& name, DType* out);  // "f16", "bf16", "q8_0", "q4_0", "f32"
size_t dtype_block_elems(DType t);                          // elements per block (1 for plain floats)
size_t dtype_block_bytes(DType t);                          // bytes per block
inline size_t dtype_row_bytes(DType t, size_t n) { return n / dtype_block_elems(t) * dtype_block_bytes(t); }

// q8_0: 32 elements = fp16 scale + 32 x int8. q4_0: 32 elements = fp16 scale + 16 bytes of nibbles
// (low nibbles are elements 0..15, high nibbles 16..31), value = (q - 8) * scale.
constexpr int QK = 32;
struct BlockQ8_0 { uint16_t d; int8_t qs[QK]; };
struct BlockQ4_0 { uint16_t d; uint8_t qs[QK / 2]; };
// k-quants (GGUF weights only): 256-element super-blocks.
constexpr int QK_K = 256;
struct BlockQ4_K { uint16_t d; uint16_t dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; };
struct BlockQ5_K { uint16_t d; uint16_t dmin; uint8_t scales[12]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; };
struct BlockQ6_K { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; };
static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_0) == 18, "ggml block sizes");
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210, "ggml k-quant block sizes");

// Encode n floats (n a multiple of the block size for quantised types) into `dst` of type t.
void encode_row(DType t, const float* src, void* dst, size_t n);
// Decode n elements of type t into floats.
void decode_row(DType t, const void* src, float* dst, size_t n);

}  // namespace lb
