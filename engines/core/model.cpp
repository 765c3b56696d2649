#include "model.h"

#include <cmath>
#include <map>

#include "errors.h"
#include "model_arch.h"

namespace lb {

// ---------------------------------------------------------------------------------------------- weights

namespace {

std::string shape_str(const std::vector<int64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
}

// Name lookups and format-specific value transforms.
struct Reader {
    const TensorSource& src;
    const ModelConfig& cfg;
    bool gguf;
    bool plus_one;  // norm gains stored as w with multiplier (1 + w)
    std::string prefix;  // HF: "model." or "model.language_model." ...
    LoadStats* stats;

    const TensorInfo& info(const std::string& name, const std::vector<int64_t>& want) {
        const TensorInfo* t = src.find(name);
        if (!t) fail("load", "missing tensor " + name + " in " + src.format() + " checkpoint");
        // Accept squeezed singleton dimensions (HF conv1d is [C, 1, K]; GGUF stores [C, K]).
        std::vector<int64_t> got, exp;
        for (auto d : t->shape) if (d != 1) got.push_back(d);
        for (auto d : want) if (d != 1) exp.push_back(d);
        if (got != exp) fail("load", "tensor " + name + " has shape " + shape_str(t->shape) + ", expected " + shape_str(want));
        return *t;
    }
    std::vector<float> read(const std::string& name, const std::vector<int64_t>& want) {
        const TensorInfo& t = info(name, want);
        if (stats) { stats->n_params += t.numel(); }
        return src.read_f32(t);
    }
    // Norm gains: Qwen3.5's HF files store w with output x * (1 + w); its GGUF and Qwen3's files store
    // the multiplier itself.
    std::vector<float> norm(const std::string& name, int64_t n) {
        auto v = read(name, {n});
        if (plus_one) for (auto& x : v) x += 1.f;
        return v;
    }
};

// llama.cpp stores DeltaNet value heads "tiled" ([k0v0, k1v0, ..., k0v1, ...]) when there are more value
// heads than key heads; the math here (and in transformers) uses "grouped" ([k0v0, k0v1, ..., k1v0, ...]).
// Rows [row0, row0 + nv * per_head) of a [rows, cols] matrix are reordered tiled -> grouped.
void untile_rows(std::vector<float>& m, int64_t cols, int64_t row0, int nk, int nv, int64_t per_head) {
    int r = nv / nk;
    if (r <= 1) return;
    std::vector<float> block(m.begin() + row0 * cols, m.begin() + (row0 + nv * per_head) * cols);
    for (int kh = 0; kh < nk; ++kh)
        for (int j = 0; j < r; ++j) {
            int grouped = kh * r + j, tiled = j * nk + kh;
            std::copy(block.begin() + tiled * per_head * cols, block.begin() + (tiled + 1) * per_head * cols,
                      m.begin() + (row0 + grouped * per_head) * cols);
        }
}
// Columns of a [rows, nv * per_head] matrix (out_proj), tiled -> grouped.
void untile_cols(std::vector<float>& m, int64_t rows, int nk, int nv, int64_t per_head) {
    int r = nv / nk;
    if (r <= 1) return;
    int64_t cols = nv * per_head;
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t i = 0; i < rows; ++i) {
        float* p = m.data() + i * cols;
        std::copy(p, p + cols, row.begin());
        for (int kh = 0; kh < nk; ++kh)
            for (int j = 0; j < r; ++j)
                std::copy(row.begin() + (j * nk + kh) * per_head, row.begin() + (j * nk + kh + 1) * per_head,
                          p + (kh * r + j) * per_head);
    }
}

void append(std::vector<float>& dst, const std::vector<float>& src) { dst.insert(dst.end(), src.begin(), src.end()); }

// One tensor of a canonical matrix: its name, expected shape and (untile_head > 0) the rows
// [untile_row0, untile_row0 + nv * untile_head) to reorder tiled -> grouped.
struct Piece {
    std::string name;
    std::vector<int64_t> shape;
    int64_t untile_row0 = 0, untile_head = 0;
};

bool block_type(DType t) { return t != DType::F32 && t != DType::F16 && t != DType::BF16; }

// The rows of a tensor as stored (bytes), with untile_rows' reordering applied to whole rows.
std::vector<uint8_t> raw_rows(const TensorInfo& t, const Piece& p, int nk, int nv) {
    std::vector<uint8_t> b(t.data, t.data + t.nbytes);
    const int r = nv / std::max(1, nk);
    if (p.untile_head <= 0 || r <= 1) return b;
    const size_t rb = t.nbytes / size_t(t.shape.at(0)), run = size_t(p.untile_head) * rb;
    const uint8_t* src = t.data + size_t(p.untile_row0) * rb;
    for (int kh = 0; kh < nk; ++kh)
        for (int j = 0; j < r; ++j)
            std::copy(src + size_t(j * nk + kh) * run, src + size_t(j * nk + kh + 1) * run,
                      b.begin() + size_t(p.untile_row0) * rb + size_t(kh * r + j) * run);
    return b;
}

}  // namespace

ModelWeights load_weights(const TensorSource& src, const ModelConfig& cfg, const Uploader& upload, LoadStats* stats,
                          const QuantUploader* quant) {
    const bool gguf = src.format() == "gguf";
    const ArchConventions& conv = conventions(cfg.arch);
    Reader rd{src, cfg, gguf, !gguf && conv.hf_norm_plus_one, "", stats};
    if (!gguf) {
        // Text-only (*ForCausalLM) and multimodal (*ForConditionalGeneration) layouts.
        for (const char* p : {"model.", "model.language_model.", "language_model.model.", "language_model."})
            if (src.find(std::string(p) + "embed_tokens.weight")) { rd.prefix = p; break; }
        if (rd.prefix.empty())
            fail("load", "missing tensor model.embed_tokens.weight (nor model.language_model.embed_tokens.weight)");
    }
    const int64_t H = cfg.hidden, I = cfg.intermediate, V = cfg.vocab;
    const int64_t hd = cfg.head_dim, nh = cfg.n_heads, nkv = cfg.n_kv_heads;
    const int nk = cfg.lin_k_heads, nv = cfg.lin_v_heads;
    const int64_t kd = cfg.lin_key_dim(), vd = cfg.lin_value_dim(), cd = cfg.conv_dim(), K = cfg.conv_kernel;
    auto vec = [&](std::vector<float>&& v) { int64_t n = int64_t(v.size()); return upload(std::move(v), n, 1, false); };
    auto mat = [&](std::vector<float>&& v, int64_t r, int64_t c) { return upload(std::move(v), r, c, true); };
    // A canonical matrix from its pieces (row-concatenated). With `quant` and a block-typed piece: the stored
    // rows to `quant`; otherwise decoded to fp32, rows untiled, and (tiled_cols) the columns untiled too.
    auto matrix = [&](const std::vector<Piece>& pieces, int64_t r, int64_t c, bool tiled_cols = false) {
        bool raw = false;
        for (const Piece& p : pieces) raw |= gguf && quant && block_type(rd.info(p.name, p.shape).dtype);
        if (raw) {
            std::vector<RawRows> parts;
            for (const Piece& p : pieces) {
                const TensorInfo& t = rd.info(p.name, p.shape);
                if (stats) stats->n_params += t.numel();
                std::vector<uint8_t> b = raw_rows(t, p, nk, nv);
                if (!parts.empty() && parts.back().dtype == t.dtype) {
                    parts.back().rows += t.shape.at(0);
                    parts.back().bytes.insert(parts.back().bytes.end(), b.begin(), b.end());
                } else {
                    parts.push_back(RawRows{t.dtype, t.shape.at(0), std::move(b)});
                }
            }
            return (*quant)(std::move(parts), r, c, tiled_cols && nv / std::max(1, nk) > 1);
        }
        std::vector<float> m;
        for (const Piece& p : pieces) {
            std::vector<float> v = rd.read(p.name, p.shape);
            if (gguf && p.untile_head > 0) untile_rows(v, p.shape.back(), p.untile_row0, nk, nv, p.untile_head);
            append(m, v);
        }
        if (gguf && tiled_cols) untile_cols(m, r, nk, nv, cfg.lin_v_dim);
        return mat(std::move(m), r, c);
    };

    ModelWeights w;
    const std::string embed_name = gguf ? "token_embd.weight" : rd.prefix + "embed_tokens.weight";
    w.embed = matrix({{embed_name, {V, H}}}, V, H);
    w.final_norm = vec(rd.norm(gguf ? "output_norm.weight" : rd.prefix + "norm.weight", H));
    std::string head_name = gguf ? "output.weight" : "lm_head.weight";
    if (!gguf && !src.find(head_name) && src.find("language_model.lm_head.weight")) head_name = "language_model.lm_head.weight";
    if (cfg.tied) {
        w.lm_head = w.embed;
    } else {
        if (!src.find(head_name)) fail("load", "missing tensor " + head_name + " (tie_word_embeddings is false)");
        w.lm_head = matrix({{head_name, {V, H}}}, V, H);
    }

    for (int l = 0; l < cfg.n_layers; ++l) {
        LayerWeights L;
        L.kind = cfg.kinds[size_t(l)];
        L.full = L.kind != LayerKind::DeltaNet;
        const std::string b = gguf ? "blk." + std::to_string(l) + "." : rd.prefix + "layers." + std::to_string(l) + ".";
        auto nm = [&](const char* hf, const char* gg) { return b + (gguf ? gg : hf); };
        L.input_norm = vec(rd.norm(nm("input_layernorm.weight", "attn_norm.weight"), H));
        const std::string post_norm_gguf = std::string(conv.gguf_post_norm) + ".weight";
        L.post_norm = vec(rd.norm(nm("post_attention_layernorm.weight", post_norm_gguf.c_str()), H));
        if (L.full) {
            const int64_t q_rows = (L.kind == LayerKind::GatedAttention ? 2 : 1) * nh * hd;  // query (+ gate)
            L.attn_qkv = matrix({{nm("self_attn.q_proj.weight", "attn_q.weight"), {q_rows, H}},
                                 {nm("self_attn.k_proj.weight", "attn_k.weight"), {nkv * hd, H}},
                                 {nm("self_attn.v_proj.weight", "attn_v.weight"), {nkv * hd, H}}},
                                cfg.attn_qkv_rows(l), H);
            L.q_norm = vec(rd.norm(nm("self_attn.q_norm.weight", "attn_q_norm.weight"), hd));
            L.k_norm = vec(rd.norm(nm("self_attn.k_norm.weight", "attn_k_norm.weight"), hd));
            L.o_proj = matrix({{nm("self_attn.o_proj.weight", "attn_output.weight"), {H, nh * hd}}}, H, nh * hd);
        } else {
            // The in-projection [in_proj_qkv; in_proj_z; in_proj_b; in_proj_a]; GGUF stores the value heads tiled.
            L.lin_in = matrix({{nm("linear_attn.in_proj_qkv.weight", "attn_qkv.weight"), {cd, H}, 2 * kd, cfg.lin_v_dim},
                               {nm("linear_attn.in_proj_z.weight", "attn_gate.weight"), {vd, H}, 0, cfg.lin_v_dim},
                               {nm("linear_attn.in_proj_b.weight", "ssm_beta.weight"), {nv, H}, 0, 1},
                               {nm("linear_attn.in_proj_a.weight", "ssm_alpha.weight"), {nv, H}, 0, 1}},
                              cfg.lin_in_rows(), H);
            std::vector<float> conv = rd.read(nm("linear_attn.conv1d.weight", "ssm_conv1d.weight"), {cd, 1, K});
            std::vector<float> A, dt;
            if (gguf) {
                A = rd.read(src.find(b + "ssm_a") ? b + "ssm_a" : b + "ssm_a.weight", {nv});
                dt = rd.read(src.find(b + "ssm_dt.bias") ? b + "ssm_dt.bias" : b + "ssm_dt", {nv});
                untile_rows(conv, K, 2 * kd, nk, nv, cfg.lin_v_dim);
                untile_rows(A, 1, 0, nk, nv, 1);
                untile_rows(dt, 1, 0, nk, nv, 1);
            } else {
                A = rd.read(b + "linear_attn.A_log", {nv});
                for (auto& x : A) x = -std::exp(x);
                dt = rd.read(b + "linear_attn.dt_bias", {nv});
            }
            L.conv_w = upload(std::move(conv), cd, K, false);
            L.neg_A = vec(std::move(A));
            L.dt_bias = vec(std::move(dt));
            L.ssm_norm = vec(rd.read(nm("linear_attn.norm.weight", "ssm_norm.weight"), {cfg.lin_v_dim}));
            L.out_proj = matrix({{nm("linear_attn.out_proj.weight", "ssm_out.weight"), {H, vd}}}, H, vd, gguf);
        }
        L.gate_up = matrix({{nm("mlp.gate_proj.weight", "ffn_gate.weight"), {I, H}},
                            {nm("mlp.up_proj.weight", "ffn_up.weight"), {I, H}}},
                           2 * I, H);
        L.down = matrix({{nm("mlp.down_proj.weight", "ffn_down.weight"), {H, I}}}, H, I);
        w.layers.push_back(L);
    }

    if (stats) {
        // Bytes and dominant dtype over the tensors of the text model (vision tower and MTP head excluded).
        std::map<std::string, uint64_t> by_dtype;
        uint64_t total = 0;
        for (auto& name : src.names()) {
            bool text = gguf ? true : (name.rfind(rd.prefix, 0) == 0 || name == head_name);
            if (!gguf && name.find("visual") != std::string::npos) text = false;
            if (!text) continue;
            const TensorInfo* t = src.find(name);
            by_dtype[dtype_name(t->dtype)] += t->nbytes;
            total += t->nbytes;
        }
        stats->weight_bytes = total;
        uint64_t best = 0;
        for (auto& [d, n] : by_dtype) if (n > best) { best = n; stats->dtype = d; }
    }
    return w;
}

}  // namespace lb

namespace lb {
uint64_t streamed_weight_bytes(const ModelConfig& cfg, uint64_t matrix_bytes, size_t elem_bytes) {
    const uint64_t embed = uint64_t(cfg.vocab) * cfg.hidden * elem_bytes;
    return matrix_bytes - (cfg.tied ? 0 : embed) + uint64_t(cfg.hidden) * elem_bytes;
}

uint64_t decode_bytes(const ModelConfig& cfg, uint64_t matrix_bytes, uint64_t lm_head_bytes_if_tied, DType kv_k,
                      DType kv_v, int ctx) {
    const uint64_t row = uint64_t(cfg.n_kv_heads) *
                         (dtype_row_bytes(kv_k, size_t(cfg.head_dim)) + dtype_row_bytes(kv_v, size_t(cfg.head_dim)));
    const uint64_t kv = uint64_t(cfg.n_full_layers()) * row * uint64_t(ctx + 1);
    const int n_lin = cfg.n_layers - cfg.n_full_layers();
    const uint64_t state = uint64_t(n_lin) * 2 * 4 *
                           (uint64_t(cfg.lin_v_heads) * cfg.lin_k_dim * cfg.lin_v_dim +
                            uint64_t(cfg.conv_dim()) * (cfg.conv_kernel - 1));
    return matrix_bytes + lm_head_bytes_if_tied + kv + state;
}
}  // namespace lb
