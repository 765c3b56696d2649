// The DFlash draft (z-lab block-diffusion drafter, speculative.md §1) on the CPU in fp32: the numerical
// reference the GPU draft is checked against.
//
// What it owns: Qwen3-style decoder layers, `fc` and `hidden_norm`; no embedding table and no LM head (the
// caller passes the target's). A round of drafting:
//   1. add_context(): the target's hidden states at the newly committed positions (outputs of decoder
//      layers target_layer_ids, concatenated) -> fc -> hidden_norm = the context features; every layer's
//      k_proj / v_proj (+ k_norm, RoPE at the rows' absolute positions) turn them into K/V rows appended
//      to that layer's draft cache. Features are projected once, when their position is committed.
//   2. forward_block(): the block [bonus, MASK x (block_size - 1)] embedded by the target, at positions
//      start..start + block_size - 1 with start = context_length(). Queries come from the block only;
//      every layer attends over its cached context rows plus the block's own K/V rows (computed, used and
//      dropped: the cache keeps context rows only). Full-attention layers see everything; sliding-window
//      layers see the context within the window and the block causally.
//   3. logits(): the final-normed block rows 1..block_size-1 through the target's LM head.
#pragma once
#include <string>
#include <vector>

#include "core/tensor_source.h"

namespace lb::dflash {

struct DraftConfig {
    // From the tensor shapes (a GGUF draft: from its metadata, checked against the shapes).
    int n_layers = 0, hidden = 0, intermediate = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
    int target_hidden = 0;              // width of one captured target hidden state
    // From config.json (top level or dflash_config, whichever has it) or the GGUF's `<arch>.dflash.*` keys.
    int block_size = 16;
    int mask_token_id = -1;
    std::vector<int> target_layer_ids;  // 0-based target decoder layers whose outputs are the features
    float eps = 1e-6f, rope_theta = 1e6f;
    int sliding_window = 0;             // 0: no sliding layers
    std::vector<bool> sliding;          // per layer: sliding-window attention
    std::vector<bool> causal;           // per layer: causal inside the block (default: the sliding layers)
    float input_embedding_scale = 1.f;  // multiplies the block's target embeddings
    float output_multiplier = 1.f;      // multiplies the draft logits
    float logit_softcap = 0.f;          // tanh soft cap on the draft logits (0: none)
    int n_features() const { return int(target_layer_ids.size()); }
    int feature_width() const { return n_features() * target_hidden; }
};

// The config of a draft checkpoint: a z-lab safetensors draft (config.json and the tensor shapes) or a GGUF
// draft in Lucebox's layout (architecture `qwen35-dflash-draft`: the `<arch>.*` metadata, tensors named
// dflash.fc / dflash.hidden_norm / output_norm / blk.N.attn_q ..., any ggml type the core decodes).
// `target_layers`, the target's decoder layer count, gives the reference's default target_layer_ids where
// the draft lists none (0: unknown, then the draft must list them or, in config.json, num_target_layers).
// Throws EngineError("load") for a missing key or tensor or inconsistent shapes, EngineError("unsupported")
// for other draft kinds (a GGUF that is no DFlash draft, DFlash2, unknown metadata keys or tensors).
DraftConfig draft_config_from_source(const TensorSource& src, int target_layers = 0);

// z-lab's default when a config has no target_layer_ids: round(1 + i * (L - 4) / (n - 1)) (Python's
// round, half to even) for n draft layers over L target layers; L / 2 for one layer.
std::vector<int> default_target_layer_ids(int n_target_layers, int n_draft_layers);

// The draft tensor `name` (z-lab's name, without the checkpoint's prefix; a GGUF draft's own name is looked
// up) in fp32 (quantised GGUF types decoded exactly as ggml dequantises them), its shape checked; adds its
// file bytes to *bytes. Throws EngineError("load") for a missing or misshapen tensor.
std::vector<float> read_draft_tensor(const TensorSource& src, const std::string& name, std::vector<int64_t> shape,
                                     uint64_t* bytes);

class DraftModelCpu {
public:
    void load(const TensorSource& src, const DraftConfig& cfg);
    const DraftConfig& config() const { return cfg_; }
    // Context capacity in rows; the cache is [max_ctx, n_kv_heads, head_dim] fp32 per layer for K and V.
    void allocate(int max_ctx);
    void reset() { n_ctx_ = 0; }
    int context_length() const { return n_ctx_; }
    // Appends `n` committed positions: features[n, feature_width()] (the target's hidden states of
    // target_layer_ids at those positions, concatenated in that order). Throws context_overflow.
    void add_context(const float* features, int n);
    // Drops context rows past `n` (the caller's rollback; rows are only ever appended for committed
    // positions, so the engine loop does not need it).
    void truncate_context(int n);
    // block_embed[block_size, hidden]: the target's embeddings of [bonus, MASK, ...]. Writes the
    // final-normed hidden states of block positions 1..block_size-1: hidden_out[block_size - 1, hidden].
    void forward_block(const float* block_embed, float* hidden_out) const;
    // logits_out[n, vocab] = hidden[n, hidden] @ lm_head[vocab, hidden]^T, times output_multiplier, soft-capped.
    void logits(const float* hidden, int n, const float* lm_head, int vocab, float* logits_out) const;
    uint64_t weight_bytes() const { return weight_bytes_; }
    uint64_t context_cache_bytes() const {
        return 2ull * cfg_.n_layers * uint64_t(max_ctx_) * cfg_.n_kv_heads * cfg_.head_dim * sizeof(float);
    }

private:
    struct Layer {
        std::vector<float> input_norm, post_norm, wq, wk, wv, wo, q_norm, k_norm, w_gate, w_up, w_down;
    };
    DraftConfig cfg_;
    std::vector<float> fc_, hidden_norm_, final_norm_;
    std::vector<Layer> layers_;
    int max_ctx_ = 0, n_ctx_ = 0;
    std::vector<std::vector<float>> kcache_, vcache_;  // per layer [max_ctx, nkv, hd]
    uint64_t weight_bytes_ = 0;
};

}  // namespace lb::dflash
