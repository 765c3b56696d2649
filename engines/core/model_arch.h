// The architectures the engines run, each in one place: how its config.json / GGUF metadata reads
// into a ModelConfig, and the file conventions the generic loader (model.cpp) follows for it.
//   qwen3_5 (GGUF qwen35): Gated DeltaNet + gated attention, partial rotary, HF norm gains (1 + w)
//   qwen3   (GGUF qwen3):  attention with per-head q/k norm, full rotary, no output gate, plain gains
#pragma once
#include <string>

#include "model.h"

namespace lb {

struct ArchConventions {
    const char* name;              // as the ready line reports it
    const char* gguf_name;         // general.architecture
    bool hf_norm_plus_one;         // HF RMSNorm gains are stored as w with multiplier (1 + w)
    const char* gguf_post_norm;    // GGUF name of the norm before the MLP
};
const ArchConventions& conventions(Arch a);

ModelConfig config_from_hf(const Json& config_json);
ModelConfig config_from_gguf(const TensorSource& src);

}  // namespace lb
