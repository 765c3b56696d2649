// The Qwen3.5 hybrid model (Gated DeltaNet + gated full attention): its configuration and its weights
// in the one canonical form every backend computes with, whatever file they came from.
//
// Canonical form (what the loader produces; see docs/engines.md for the mapping from HF and GGUF):
//  * matrices row-major [out_features, in_features], y = W x;
//  * RMSNorm gains are the effective multipliers, i.e. HF's (1 + weight) (GGUF stores them so already);
//    the DeltaNet gated norm is a plain multiplier (weight) in both formats;
//  * A is stored as neg_A = -exp(A_log) (GGUF's ssm_a), so g = neg_A * softplus(a + dt_bias);
//  * DeltaNet value heads in Hugging Face's grouped order (llama.cpp's tiled order is undone);
//  * projections that read the same input are concatenated, so decode runs one GEMV for them:
//      attn_qkv = [q_proj (per head: query then gate); k_proj; v_proj]
//      lin_in   = [in_proj_qkv; in_proj_z; in_proj_b; in_proj_a]
//      gate_up  = [gate_proj; up_proj]
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "json.h"
#include "tensor_source.h"

namespace lb {

struct Qwen35Config {
    int n_layers = 0, hidden = 0, intermediate = 0, vocab = 0;
    // gated full attention
    int n_heads = 0, n_kv_heads = 0, head_dim = 0, rope_dims = 0;
    float rope_theta = 10000.f;
    // Gated DeltaNet
    int lin_k_heads = 0, lin_v_heads = 0, lin_k_dim = 0, lin_v_dim = 0, conv_kernel = 4;
    float eps = 1e-6f;
    bool tied = false;
    std::vector<bool> is_full;  // per layer: full attention (true) or DeltaNet (false)

    int lin_key_dim() const { return lin_k_heads * lin_k_dim; }
    int lin_value_dim() const { return lin_v_heads * lin_v_dim; }
    int conv_dim() const { return 2 * lin_key_dim() + lin_value_dim(); }
    int lin_in_rows() const { return conv_dim() + lin_value_dim() + 2 * lin_v_heads; }
    int attn_qkv_rows() const { return 2 * n_heads * head_dim + 2 * n_kv_heads * head_dim; }
    int n_full_layers() const { int n = 0; for (bool f : is_full) n += f; return n; }
};

// Parses config.json (text-only or multimodal with text_config) or GGUF metadata. Throws EngineError("load").
Qwen35Config config_from_source(const TensorSource& src);

// A tensor as a backend stores it: an opaque pointer (host float* on CPU, device memory on GPU).
struct Mat {
    void* ptr = nullptr;
    int64_t rows = 0, cols = 0;  // vectors: rows = n, cols = 1
};

struct Qwen35Layer {
    bool full = false;
    Mat input_norm, post_norm;                       // [hidden]
    Mat attn_qkv, q_norm, k_norm, o_proj;            // full attention
    Mat lin_in, conv_w, neg_A, dt_bias, ssm_norm, out_proj;  // DeltaNet
    Mat gate_up, down;                               // SwiGLU MLP
};

struct Qwen35Weights {
    Mat embed;       // [vocab, hidden]
    Mat final_norm;  // [hidden]
    Mat lm_head;     // [vocab, hidden]; the same storage as embed when tied
    std::vector<Qwen35Layer> layers;
};

// How a backend takes ownership of a canonical tensor. `matrix` tensors are the large GEMV/GEMM
// operands (a GPU stores them in bf16/fp16); the others (norm gains, conv taps, A, dt_bias) stay fp32.
using Uploader = std::function<Mat(std::vector<float>&& data, int64_t rows, int64_t cols, bool matrix)>;

struct LoadStats {
    int64_t n_params = 0;     // parameters of the text model as stored in the file
    uint64_t weight_bytes = 0;  // bytes of those parameters in the file
    std::string dtype;        // dtype of most weight bytes: "bf16", "f16", "f32", "q8_0", ...
};

// Reads, checks (names, shapes) and converts every tensor, handing each to `upload` as soon as it is
// ready. Throws EngineError("load") naming the missing or misshapen tensor.
Qwen35Weights load_qwen35_weights(const TensorSource& src, const Qwen35Config& cfg, const Uploader& upload,
                                  LoadStats* stats);

}  // namespace lb

namespace lb {
// Bytes a one-token decode step moves through memory at context `ctx` (for bytes_per_token / roofline):
// the weight matrices (`matrix_bytes` as the backend stores them; tied LM head counted once more since
// it is read again), the KV cache rows read (ctx) and written (1) in every full-attention layer, the
// DeltaNet recurrent state read and written (fp32) and the conv state read and written.
// Weight bytes one decode step streams, from the loaded matrices' total (embedding table included once):
// every matrix once; the embedding table is not streamed (one row is read), so it counts only as the LM
// head when tied and not at all when untied; plus one row for the token's embedding.
uint64_t qwen35_streamed_weight_bytes(const Qwen35Config& cfg, uint64_t matrix_bytes, size_t elem_bytes);
uint64_t qwen35_decode_bytes(const Qwen35Config& cfg, uint64_t matrix_bytes, uint64_t lm_head_bytes_if_tied,
                             DType kv_k, DType kv_v, int ctx);
}  // namespace lb
