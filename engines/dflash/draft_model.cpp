// The DFlash draft on the CPU (see draft_model.h), composed from the core's fp32 reference operations.
#include "draft_model.h"

#include <algorithm>
#include <cmath>

#include "core/cpu/ops.h"
#include "core/errors.h"

namespace lb::dflash {

// ---------------------------------------------------------------------------------------------- config

namespace {

const char* kWhere = "draft config.json";

// A key of the draft's config: inside dflash_config first (z-lab's placement), else at the top level.
const Json* draft_key(const Json& root, const char* key) {
    if (const Json* dc = root.get("dflash_config"); dc && dc->is_object())
        if (const Json* v = dc->get(key); v && !v->is_null()) return v;
    const Json* v = root.get(key);
    return v && !v->is_null() ? v : nullptr;
}

int as_int(const Json& v, const char* key) {
    if (!v.is_number()) fail("load", std::string(kWhere) + ": '" + key + "' must be an integer");
    return int(v.as_int());
}

// The tensors' names: z-lab's have no prefix; accept a `model.` prefix too.
std::string prefix_of(const TensorSource& src) {
    if (src.find("fc.weight")) return "";
    if (src.find("model.fc.weight")) return "model.";
    fail("load", "draft checkpoint: no tensor 'fc.weight' (is this a DFlash draft?)");
}

const TensorInfo& need(const TensorSource& src, const std::string& name) {
    const TensorInfo* t = src.find(name);
    if (!t) fail("load", "draft checkpoint: missing tensor '" + name + "'");
    return *t;
}

std::string shape_str(const std::vector<int64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
}

void check_shape(const TensorInfo& t, std::vector<int64_t> want) {
    if (t.shape != want)
        fail("load", "draft checkpoint: tensor '" + t.name + "' has shape " + shape_str(t.shape) + ", expected " +
                         shape_str(want));
}

}  // namespace

std::vector<int> default_target_layer_ids(int n_target_layers, int n_draft_layers) {
    if (n_draft_layers == 1) return {n_target_layers / 2};
    std::vector<int> ids;
    const double span = n_target_layers - 4;
    for (int i = 0; i < n_draft_layers; ++i)
        ids.push_back(int(std::nearbyint(1.0 + i * span / (n_draft_layers - 1))));  // ties to even, as Python
    return ids;
}

DraftConfig draft_config_from_source(const TensorSource& src) {
    const Json& root = src.metadata();
    if (src.format() != "safetensors")
        fail("unsupported", "draft checkpoint: only safetensors drafts (z-lab layout) are supported so far");
    if (const Json* arch = root.get("architectures"); arch && arch->is_array()) {
        bool ok = false;
        for (auto& a : arch->items()) ok |= a.is_string() && a.as_string() == "DFlashDraftModel";
        if (!ok) fail("unsupported", std::string(kWhere) + ": architectures " + arch->dump() + " (expected DFlashDraftModel)");
    }
    const std::string p = prefix_of(src);
    for (const auto& name : src.names())
        if (name.find("candidate_selector") != std::string::npos || name.find("attention_conv") != std::string::npos)
            fail("unsupported", "draft checkpoint: tensor '" + name + "' belongs to a DFlash2 draft (not supported)");

    DraftConfig c;
    // Dimensions from the shapes.
    const TensorInfo& fc = need(src, p + "fc.weight");
    if (fc.shape.size() != 2) fail("load", "draft checkpoint: 'fc.weight' must be a matrix, got " + shape_str(fc.shape));
    c.hidden = int(fc.shape[0]);
    while (src.find(p + "layers." + std::to_string(c.n_layers) + ".input_layernorm.weight")) ++c.n_layers;
    if (c.n_layers == 0) fail("load", "draft checkpoint: no tensor 'layers.0.input_layernorm.weight'");
    const std::string l0 = p + "layers.0.";
    const TensorInfo& qn = need(src, l0 + "self_attn.q_norm.weight");
    c.head_dim = int(qn.shape.at(0));
    c.n_heads = int(need(src, l0 + "self_attn.q_proj.weight").shape.at(0)) / c.head_dim;
    c.n_kv_heads = int(need(src, l0 + "self_attn.k_proj.weight").shape.at(0)) / c.head_dim;
    c.intermediate = int(need(src, l0 + "mlp.gate_proj.weight").shape.at(0));
    if (c.head_dim % 2 || c.n_heads < 1 || c.n_kv_heads < 1 || c.n_heads % c.n_kv_heads)
        fail("load", "draft checkpoint: head_dim " + std::to_string(c.head_dim) + " with " + std::to_string(c.n_heads) +
                         " query / " + std::to_string(c.n_kv_heads) + " KV heads is not a valid attention shape");
    if (auto* v = root.get("num_hidden_layers"); v && as_int(*v, "num_hidden_layers") != c.n_layers)
        fail("load", std::string(kWhere) + ": num_hidden_layers " + v->dump() + " but the checkpoint has " +
                         std::to_string(c.n_layers) + " layers");

    // The DFlash keys, in either placement.
    if (auto* v = draft_key(root, "block_size")) c.block_size = as_int(*v, "block_size");
    if (c.block_size < 2) fail("load", std::string(kWhere) + ": block_size must be >= 2");
    const Json* mask = draft_key(root, "mask_token_id");
    if (!mask) fail("load", std::string(kWhere) + ": missing 'mask_token_id' (top level or dflash_config)");
    c.mask_token_id = as_int(*mask, "mask_token_id");
    if (const Json* ids = draft_key(root, "target_layer_ids")) {
        if (!ids->is_array()) fail("load", std::string(kWhere) + ": 'target_layer_ids' must be a list");
        for (auto& v : ids->items()) c.target_layer_ids.push_back(as_int(v, "target_layer_ids"));
    } else {
        const Json* nt = draft_key(root, "num_target_layers");
        if (!nt) fail("load", std::string(kWhere) + ": neither 'target_layer_ids' nor 'num_target_layers'");
        c.target_layer_ids = default_target_layer_ids(as_int(*nt, "num_target_layers"), c.n_layers);
    }
    if (c.target_layer_ids.empty()) fail("load", std::string(kWhere) + ": 'target_layer_ids' is empty");
    if (fc.shape[1] % c.n_features())
        fail("load", "draft checkpoint: 'fc.weight' has " + std::to_string(fc.shape[1]) + " inputs, not a multiple of " +
                         std::to_string(c.n_features()) + " target layers");
    c.target_hidden = int(fc.shape[1]) / c.n_features();

    if (auto* v = root.get("rms_norm_eps")) c.eps = float(v->as_number());
    double theta = 10000.0;  // transformers' Qwen3 default
    if (auto* v = root.get("rope_theta")) theta = v->as_number();
    for (const char* key : {"rope_parameters", "rope_scaling"})
        if (auto* rp = root.get(key); rp && rp->is_object()) {
            if (auto* v = rp->get("rope_theta")) theta = v->as_number();
            const Json* type = rp->get("rope_type");
            if (!type) type = rp->get("type");
            if (type && type->is_string() && type->as_string() != "default")
                fail("unsupported", std::string(kWhere) + ": " + key + " type '" + type->as_string() + "' (only 'default')");
        }
    c.rope_theta = float(theta);
    if (auto* v = root.get("sliding_window"); v && v->is_number()) c.sliding_window = int(v->as_int());
    c.sliding.assign(size_t(c.n_layers), false);
    if (auto* lt = root.get("layer_types"); lt && lt->is_array()) {
        if (int(lt->size()) != c.n_layers)
            fail("load", std::string(kWhere) + ": layer_types has " + std::to_string(lt->size()) + " entries for " +
                             std::to_string(c.n_layers) + " layers");
        for (int l = 0; l < c.n_layers; ++l) {
            const std::string& t = lt->items()[size_t(l)].as_string();
            if (t == "sliding_attention") c.sliding[size_t(l)] = true;
            else if (t != "full_attention")
                fail("unsupported", std::string(kWhere) + ": layer_types[" + std::to_string(l) + "] '" + t + "'");
        }
    }
    for (bool s : c.sliding)
        if (s && c.sliding_window <= 0)
            fail("load", std::string(kWhere) + ": sliding_attention layers need a positive 'sliding_window'");
    c.causal = c.sliding;
    if (auto* v = draft_key(root, "is_causal"); v && v->is_bool()) c.causal.assign(size_t(c.n_layers), v->as_bool());
    if (auto* v = draft_key(root, "input_embedding_scale")) c.input_embedding_scale = float(v->as_number());
    if (auto* v = draft_key(root, "output_multiplier")) c.output_multiplier = float(v->as_number());
    if (auto* v = draft_key(root, "final_logit_softcapping"); v && v->is_number()) c.logit_softcap = float(v->as_number());
    return c;
}

// ------------------------------------------------------------------------------------------- the model

std::vector<float> read_draft_tensor(const TensorSource& src, const std::string& name, std::vector<int64_t> shape,
                                     uint64_t* bytes) {
    const TensorInfo& t = need(src, prefix_of(src) + name);
    check_shape(t, std::move(shape));
    *bytes += t.nbytes;
    return src.read_f32(t);
}

void DraftModelCpu::load(const TensorSource& src, const DraftConfig& cfg) {
    cfg_ = cfg;
    const int64_t H = cfg.hidden, hd = cfg.head_dim, qd = int64_t(cfg.n_heads) * hd, kvd = int64_t(cfg.n_kv_heads) * hd;
    const int64_t I = cfg.intermediate;
    weight_bytes_ = 0;
    auto read = [&](const std::string& name, std::vector<int64_t> shape) {
        return read_draft_tensor(src, name, std::move(shape), &weight_bytes_);
    };
    fc_ = read("fc.weight", {H, cfg.feature_width()});
    hidden_norm_ = read("hidden_norm.weight", {H});
    final_norm_ = read("norm.weight", {H});
    layers_.assign(size_t(cfg.n_layers), {});
    for (int l = 0; l < cfg.n_layers; ++l) {
        const std::string pre = "layers." + std::to_string(l) + ".";
        Layer& L = layers_[size_t(l)];
        L.input_norm = read(pre + "input_layernorm.weight", {H});
        L.post_norm = read(pre + "post_attention_layernorm.weight", {H});
        L.wq = read(pre + "self_attn.q_proj.weight", {qd, H});
        L.wk = read(pre + "self_attn.k_proj.weight", {kvd, H});
        L.wv = read(pre + "self_attn.v_proj.weight", {kvd, H});
        L.wo = read(pre + "self_attn.o_proj.weight", {H, qd});
        L.q_norm = read(pre + "self_attn.q_norm.weight", {hd});
        L.k_norm = read(pre + "self_attn.k_norm.weight", {hd});
        L.w_gate = read(pre + "mlp.gate_proj.weight", {I, H});
        L.w_up = read(pre + "mlp.up_proj.weight", {I, H});
        L.w_down = read(pre + "mlp.down_proj.weight", {H, I});
    }
}

void DraftModelCpu::allocate(int max_ctx) {
    max_ctx_ = max_ctx;
    const size_t rows = size_t(max_ctx) * cfg_.n_kv_heads * cfg_.head_dim;
    kcache_.assign(size_t(cfg_.n_layers), std::vector<float>(rows));
    vcache_.assign(size_t(cfg_.n_layers), std::vector<float>(rows));
    n_ctx_ = 0;
}

void DraftModelCpu::truncate_context(int n) {
    if (n < 0 || n > n_ctx_) fail("internal", "draft context truncate to " + std::to_string(n) + " of " + std::to_string(n_ctx_));
    n_ctx_ = n;
}

void DraftModelCpu::add_context(const float* features, int n) {
    if (n <= 0) return;
    if (n_ctx_ + n > max_ctx_)
        fail("context_overflow", "draft context " + std::to_string(n_ctx_ + n) + " exceeds max_ctx " + std::to_string(max_ctx_));
    const int H = cfg_.hidden, hd = cfg_.head_dim, nkv = cfg_.n_kv_heads, kvd = nkv * hd;
    std::vector<float> ctx(size_t(n) * H);
    cpu::matmul(features, n, cfg_.feature_width(), fc_.data(), H, ctx.data());
    cpu::rmsnorm(ctx.data(), hidden_norm_.data(), ctx.data(), n, H, cfg_.eps);
    for (int l = 0; l < cfg_.n_layers; ++l) {
        const Layer& L = layers_[size_t(l)];
        float* k = &kcache_[size_t(l)][size_t(n_ctx_) * kvd];
        float* v = &vcache_[size_t(l)][size_t(n_ctx_) * kvd];
        cpu::matmul(ctx.data(), n, H, L.wk.data(), kvd, k);
        cpu::matmul(ctx.data(), n, H, L.wv.data(), kvd, v);
        cpu::rmsnorm(k, L.k_norm.data(), k, n * nkv, hd, cfg_.eps);
        cpu::rope(k, n, nkv, hd, hd, cfg_.rope_theta, n_ctx_);
    }
    n_ctx_ += n;
}

void DraftModelCpu::forward_block(const float* block_embed, float* hidden_out) const {
    const int n = cfg_.block_size, H = cfg_.hidden, hd = cfg_.head_dim, nh = cfg_.n_heads, nkv = cfg_.n_kv_heads;
    const int qd = nh * hd, kvd = nkv * hd, I = cfg_.intermediate, start = n_ctx_;
    std::vector<float> x(block_embed, block_embed + size_t(n) * H), h(size_t(n) * H), y(size_t(n) * H);
    if (cfg_.input_embedding_scale != 1.f)
        for (auto& e : x) e *= cfg_.input_embedding_scale;
    std::vector<float> q(size_t(n) * qd), k(size_t(n) * kvd), v(size_t(n) * kvd), att(size_t(n) * qd);
    std::vector<float> gate(size_t(n) * I), up(size_t(n) * I);
    for (int l = 0; l < cfg_.n_layers; ++l) {
        const Layer& L = layers_[size_t(l)];
        cpu::rmsnorm(x.data(), L.input_norm.data(), h.data(), n, H, cfg_.eps);
        cpu::matmul(h.data(), n, H, L.wq.data(), qd, q.data());
        cpu::matmul(h.data(), n, H, L.wk.data(), kvd, k.data());
        cpu::matmul(h.data(), n, H, L.wv.data(), kvd, v.data());
        cpu::rmsnorm(q.data(), L.q_norm.data(), q.data(), n * nh, hd, cfg_.eps);
        cpu::rmsnorm(k.data(), L.k_norm.data(), k.data(), n * nkv, hd, cfg_.eps);
        cpu::rope(q.data(), n, nh, hd, hd, cfg_.rope_theta, start);
        cpu::rope(k.data(), n, nkv, hd, hd, cfg_.rope_theta, start);
        const int window = cfg_.sliding[size_t(l)] ? cfg_.sliding_window : 0;
        cpu::draft_attention(q.data(), n, nh, nkv, hd, start, kcache_[size_t(l)].data(), vcache_[size_t(l)].data(), n_ctx_,
                        k.data(), v.data(), cfg_.causal[size_t(l)], window, att.data());
        cpu::matmul(att.data(), n, qd, L.wo.data(), H, y.data());
        for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
        cpu::rmsnorm(x.data(), L.post_norm.data(), h.data(), n, H, cfg_.eps);
        cpu::matmul(h.data(), n, H, L.w_gate.data(), I, gate.data());
        cpu::matmul(h.data(), n, H, L.w_up.data(), I, up.data());
        for (size_t i = 0; i < gate.size(); ++i) gate[i] = cpu::silu(gate[i]) * up[i];
        cpu::matmul(gate.data(), n, I, L.w_down.data(), H, y.data());
        for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
    }
    // Position 0 (the bonus token) predicts nothing: only rows 1.. are normed and returned.
    cpu::rmsnorm(&x[size_t(H)], final_norm_.data(), hidden_out, n - 1, H, cfg_.eps);
}

void DraftModelCpu::logits(const float* hidden, int n, const float* lm_head, int vocab, float* logits_out) const {
    cpu::matmul(hidden, n, cfg_.hidden, lm_head, vocab, logits_out);
    const size_t count = size_t(n) * vocab;
    if (cfg_.output_multiplier != 1.f)
        for (size_t i = 0; i < count; ++i) logits_out[i] *= cfg_.output_multiplier;
    if (cfg_.logit_softcap > 0.f)
        for (size_t i = 0; i < count; ++i) logits_out[i] = std::tanh(logits_out[i] / cfg_.logit_softcap) * cfg_.logit_softcap;
}

}  // namespace lb::dflash
