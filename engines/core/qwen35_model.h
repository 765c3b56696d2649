// The names the GPU code (cuda/, megakernel/) was written against. The model itself is described in
// model.h. load_qwen35_weights accepts only the Qwen3.5 architecture: the megakernel, its caller, computes
// gated attention + DeltaNet layers and nothing else (the GPU backend loads Qwen3 too, through load_weights).
#pragma once
#include "errors.h"
#include "model.h"

namespace lb {

using Qwen35Config = ModelConfig;
using Qwen35Weights = ModelWeights;
using Qwen35Layer = LayerWeights;

inline Qwen35Weights load_qwen35_weights(const TensorSource& src, const Qwen35Config& cfg, const Uploader& upload,
                                         LoadStats* stats, const QuantUploader* quant = nullptr) {
    if (cfg.arch != Arch::Qwen35)
        fail("unsupported", std::string("this backend computes qwen3_5 models only, not ") + arch_name(cfg.arch) +
                                " (the cpu backend runs it)");
    return load_weights(src, cfg, upload, stats, quant);
}
inline uint64_t qwen35_streamed_weight_bytes(const Qwen35Config& cfg, uint64_t matrix_bytes, size_t elem_bytes) {
    return streamed_weight_bytes(cfg, matrix_bytes, elem_bytes);
}
inline uint64_t qwen35_decode_bytes(const Qwen35Config& cfg, uint64_t matrix_bytes, uint64_t lm_head_bytes_if_tied,
                                    DType kv_k, DType kv_v, int ctx) {
    return decode_bytes(cfg, matrix_bytes, lm_head_bytes_if_tied, kv_k, kv_v, ctx);
}

}  // namespace lb
