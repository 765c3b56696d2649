// A decoder-only language model as every backend computes it: its configuration (a description with
// one kind per layer) and its weights in the one canonical form, whatever file and architecture they
// came from. The architectures themselves (config keys, tensor names, value conventions) live in
// model_arch.cpp; nothing else names a model type.
//
// Canonical form (what the loader produces; see docs/engines.md for the mapping from HF and GGUF):
//  * matrices row-major [out_features, in_features], y = W x;
//  * RMSNorm gains are the effective multipliers (Qwen3.5's HF (1 + weight) is folded in at load);
//    the DeltaNet gated norm is a plain multiplier (weight) in both formats;
//  * A is stored as neg_A = -exp(A_log) (GGUF's ssm_a), so g = neg_A * softplus(a + dt_bias);
//  * DeltaNet value heads in Hugging Face's grouped order (llama.cpp's tiled order is undone);
//  * projections that read the same input are concatenated, so decode runs one GEMV for them:
//      attn_qkv = [q_proj; k_proj; v_proj], where a gated attention's q_proj holds per head the query
//                 then its output gate
//      lin_in   = [in_proj_qkv; in_proj_z; in_proj_b; in_proj_a]
//      gate_up  = [gate_proj; up_proj]
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "json.h"
#include "quant.h"
#include "tensor_source.h"

namespace lb {

// What one decoder layer's token mixer is. Every layer then has the same SwiGLU MLP.
enum class LayerKind {
    GatedAttention,  // softmax attention with per-head q/k RMSNorm and a sigmoid output gate (Qwen3.5)
    Attention,       // softmax attention with per-head q/k RMSNorm, no gate (Qwen3)
    DeltaNet,        // Gated DeltaNet: causal conv1d + gated delta rule, a fixed-size recurrent state
};

enum class Arch { Qwen35, Qwen3 };

struct ModelConfig {
    Arch arch = Arch::Qwen35;
    int n_layers = 0, hidden = 0, intermediate = 0, vocab = 0;
    // attention layers
    int n_heads = 0, n_kv_heads = 0, head_dim = 0, rope_dims = 0;
    float rope_theta = 10000.f;
    // Gated DeltaNet layers
    int lin_k_heads = 0, lin_v_heads = 0, lin_k_dim = 0, lin_v_dim = 0, conv_kernel = 4;
    float eps = 1e-6f;
    bool tied = false;
    std::vector<LayerKind> kinds;  // per layer
    std::vector<bool> is_full;     // per layer: an attention layer of either kind (kept in step with kinds)

    bool is_attention(int l) const { return kinds[size_t(l)] != LayerKind::DeltaNet; }
    bool gated(int l) const { return kinds[size_t(l)] == LayerKind::GatedAttention; }
    bool has_recurrent() const { for (auto k : kinds) if (k == LayerKind::DeltaNet) return true; return false; }
    int lin_key_dim() const { return lin_k_heads * lin_k_dim; }
    int lin_value_dim() const { return lin_v_heads * lin_v_dim; }
    int conv_dim() const { return 2 * lin_key_dim() + lin_value_dim(); }
    int lin_in_rows() const { return conv_dim() + lin_value_dim() + 2 * lin_v_heads; }
    // Rows of the fused q/k/v projection of a gated (Qwen3.5) attention layer.
    int attn_qkv_rows() const { return 2 * n_heads * head_dim + 2 * n_kv_heads * head_dim; }
    int attn_qkv_rows(int l) const { return (gated(l) ? 2 : 1) * n_heads * head_dim + 2 * n_kv_heads * head_dim; }
    int n_full_layers() const { int n = 0; for (bool f : is_full) n += f; return n; }
};

// The architecture's name as the ready line reports it ("qwen3_5", "qwen3").
const char* arch_name(Arch a);

// Parses config.json (text-only or multimodal with text_config) or GGUF metadata into the layer
// description. Throws EngineError("load") for a malformed file, ("unsupported") for another model type.
ModelConfig config_from_source(const TensorSource& src);

// A tensor as a backend stores it: an opaque pointer (host float* on CPU, device memory on GPU).
struct Mat {
    Mat() = default;
    Mat(void* p, int64_t r, int64_t c) : ptr(p), rows(r), cols(c) {}
    void* ptr = nullptr;
    int64_t rows = 0, cols = 0;  // vectors: rows = n, cols = 1
    // Set only for a matrix a backend keeps in GGUF's blocks (QuantUploader): the element type at ptr, or
    // (parts non-empty, ptr null) runs of whole rows in order, each a Mat of one type. tiled_cols: the
    // columns are in llama.cpp's tiled value-head order (a DeltaNet out_proj; see load_weights).
    DType dtype = DType::F32;
    std::vector<Mat> parts;
    bool tiled_cols = false;
};

struct LayerWeights {
    LayerKind kind = LayerKind::GatedAttention;
    bool full = false;                               // an attention layer (either kind)
    Mat input_norm, post_norm;                       // [hidden]
    Mat attn_qkv, q_norm, k_norm, o_proj;            // attention
    Mat lin_in, conv_w, neg_A, dt_bias, ssm_norm, out_proj;  // DeltaNet
    Mat gate_up, down;                               // SwiGLU MLP
};

struct ModelWeights {
    Mat embed;       // [vocab, hidden]
    Mat final_norm;  // [hidden]
    Mat lm_head;     // [vocab, hidden]; the same storage as embed when tied
    std::vector<LayerWeights> layers;
};

// How a backend takes ownership of a canonical tensor. `matrix` tensors are the large GEMV/GEMM
// operands (a GPU stores them in bf16/fp16); the others (norm gains, conv taps, A, dt_bias) stay fp32.
using Uploader = std::function<Mat(std::vector<float>&& data, int64_t rows, int64_t cols, bool matrix)>;

// A run of whole rows of one element type as the file stores them (dtype_row_bytes(dtype, cols) bytes a row).
struct RawRows {
    DType dtype = DType::F32;
    int64_t rows = 0;
    std::vector<uint8_t> bytes;
};
// How a backend that keeps GGUF's quantised blocks takes a matrix with at least one block-typed part: its row
// runs in row order (adjacent runs of one type merged), after the canonical form's row concatenations and
// permutations, which move whole rows and so whole blocks. A column permutation moves parts of blocks, so the
// DeltaNet out_proj (columns in llama.cpp's tiled value-head order) is handed over as stored, tiled_cols true:
// the backend reorders its input instead (gpu::heads_to_tiled).
using QuantUploader = std::function<Mat(std::vector<RawRows>&& parts, int64_t rows, int64_t cols, bool tiled_cols)>;

struct LoadStats {
    int64_t n_params = 0;     // parameters of the text model as stored in the file
    uint64_t weight_bytes = 0;  // bytes of those parameters in the file
    std::string dtype;        // dtype of most weight bytes: "bf16", "f16", "f32", "q8_0", ...
};

// Reads, checks (names, shapes) and converts every tensor, handing each to `upload` as soon as it is
// ready. Throws EngineError("load") naming the missing or misshapen tensor.
// `quant` (GGUF only; may be null): matrices with a quantised part go to it instead of `upload`.
ModelWeights load_weights(const TensorSource& src, const ModelConfig& cfg, const Uploader& upload, LoadStats* stats,
                          const QuantUploader* quant = nullptr);

// Weight bytes one decode step streams, from the loaded matrices' total (embedding table included once):
// every matrix once; the embedding table is not streamed (one row is read), so it counts only as the LM
// head when tied and not at all when untied; plus one row for the token's embedding.
uint64_t streamed_weight_bytes(const ModelConfig& cfg, uint64_t matrix_bytes, size_t elem_bytes);
// Bytes a one-token decode step moves through memory at context `ctx` (for bytes_per_token / roofline):
// the weight matrices (`matrix_bytes` as the backend stores them; tied LM head counted once more since
// it is read again), the KV cache rows read (ctx) and written (1) in every attention layer, the
// DeltaNet recurrent state read and written (fp32) and the conv state read and written.
uint64_t decode_bytes(const ModelConfig& cfg, uint64_t matrix_bytes, uint64_t lm_head_bytes_if_tied, DType kv_k,
                      DType kv_v, int ctx);

}  // namespace lb
