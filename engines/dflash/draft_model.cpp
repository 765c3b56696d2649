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

// A GGUF draft's name for the z-lab tensor `name` (Lucebox's converter's mapping: the two DFlash singletons
// under `dflash.`, the rest in llama.cpp's names). Norm gains are stored as the same multiplier.
std::string gguf_name(const std::string& name) {
    if (name == "fc.weight") return "dflash.fc.weight";
    if (name == "hidden_norm.weight") return "dflash.hidden_norm.weight";
    if (name == "norm.weight") return "output_norm.weight";
    static const std::pair<const char*, const char*> kLayer[] = {
        {"input_layernorm.weight", "attn_norm.weight"},   {"post_attention_layernorm.weight", "ffn_norm.weight"},
        {"self_attn.q_proj.weight", "attn_q.weight"},     {"self_attn.k_proj.weight", "attn_k.weight"},
        {"self_attn.v_proj.weight", "attn_v.weight"},     {"self_attn.o_proj.weight", "attn_output.weight"},
        {"self_attn.q_norm.weight", "attn_q_norm.weight"}, {"self_attn.k_norm.weight", "attn_k_norm.weight"},
        {"mlp.gate_proj.weight", "ffn_gate.weight"},      {"mlp.up_proj.weight", "ffn_up.weight"},
        {"mlp.down_proj.weight", "ffn_down.weight"}};
    if (name.rfind("layers.", 0) == 0) {
        const size_t dot = name.find('.', 7);
        const std::string layer = name.substr(7, dot - 7), rest = dot == std::string::npos ? "" : name.substr(dot + 1);
        for (auto& [z, g] : kLayer)
            if (rest == z) return "blk." + layer + "." + g;
    }
    fail("internal", "no GGUF name for draft tensor '" + name + "'");
}

// The file's name of the draft tensor `name` (z-lab's naming, without a prefix).
std::string source_name(const TensorSource& src, const std::string& name) {
    return src.format() == "gguf" ? gguf_name(name) : prefix_of(src) + name;
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

namespace {

// A GGUF draft in the layout of Lucebox's converter: architecture `qwen35-dflash-draft` (or any other whose
// metadata carries the same `<arch>.dflash.*` keys), the config in `<arch>.*` keys, the tensors in llama.cpp
// names (gguf_name). Keys this loader does not read and tensors it does not expect are refused: they belong
// to draft variants (DFlash2's conv, aux heads) whose computation differs.
DraftConfig draft_config_from_gguf(const TensorSource& src, int target_layers) {
    const Json& m = src.metadata();
    const Json* archv = m.get("general.architecture");
    const std::string arch = archv && archv->is_string() ? archv->as_string() : "";
    const std::string P = arch + ".";
    const std::string where = "draft GGUF (architecture '" + arch + "')";
    if (!m.get(P + "dflash.mask_token_id") && !m.get(P + "dflash.block_size")) {
        std::string why = where + " is not a DFlash draft: no '" + P + "dflash.*' keys";
        if (src.find("token_embd.weight")) why += " (it holds token_embd.weight: a target model, for --model)";
        fail("unsupported", why);
    }
    static const char* const kKnown[] = {
        "context_length", "vocab_size", "embedding_length", "block_count", "feed_forward_length",
        "attention.head_count", "attention.head_count_kv", "attention.key_length", "attention.value_length",
        "attention.layer_norm_rms_epsilon", "rope.freq_base", "rope.dimension_count", "attention.sliding_window",
        "attention.sliding_window_pattern", "dflash.n_target_layers", "dflash.n_target_features", "dflash.block_size",
        "dflash.mask_token_id", "dflash.target_layer_ids"};
    for (auto& [key, v] : m.members()) {
        if (key.rfind(P, 0) != 0) continue;
        bool known = false;
        for (const char* k : kKnown) known |= key.compare(P.size(), std::string::npos, k) == 0;
        if (!known)
            fail("unsupported", where + ": key '" + key + "' is not one this loader reads (a draft variant it does not run)");
    }
    auto count = [&](const char* k, bool required, int64_t fallback) -> int64_t {
        const Json* v = m.get(P + k);
        if (!v) {
            if (required) fail("load", where + ": missing key '" + P + k + "'");
            return fallback;
        }
        const double d = v->is_number() ? v->as_number() : -1.0;
        if (d < 0 || d != std::floor(d) || d > double(1 << 30))
            fail("load", where + ": '" + P + k + "' must be a non-negative integer, got " + v->dump());
        return int64_t(d);
    };
    auto real = [&](const char* k, bool required, double fallback) -> double {
        const Json* v = m.get(P + k);
        if (!v) {
            if (required) fail("load", where + ": missing key '" + P + k + "'");
            return fallback;
        }
        if (!v->is_number() || !(v->as_number() > 0))
            fail("load", where + ": '" + P + k + "' must be a positive number, got " + v->dump());
        return v->as_number();
    };

    DraftConfig c;
    c.hidden = int(count("embedding_length", true, 0));
    c.n_layers = int(count("block_count", true, 0));
    c.intermediate = int(count("feed_forward_length", true, 0));
    c.n_heads = int(count("attention.head_count", true, 0));
    c.n_kv_heads = int(count("attention.head_count_kv", true, 0));
    c.head_dim = int(count("attention.key_length", true, 0));
    if (count("attention.value_length", false, c.head_dim) != c.head_dim)
        fail("unsupported", where + ": value_length differs from key_length (the draft's heads have one head_dim)");
    if (c.hidden < 1 || c.n_layers < 1 || c.intermediate < 1 || c.head_dim % 2 || c.head_dim < 2 || c.n_heads < 1 ||
        c.n_kv_heads < 1 || c.n_heads % c.n_kv_heads)
        fail("load", where + ": hidden " + std::to_string(c.hidden) + ", " + std::to_string(c.n_layers) + " layers, MLP " +
                         std::to_string(c.intermediate) + ", head_dim " + std::to_string(c.head_dim) + " with " +
                         std::to_string(c.n_heads) + " query / " + std::to_string(c.n_kv_heads) +
                         " KV heads is not a valid draft shape");
    if (c.hidden > (1 << 20) || c.n_layers > 1024 || c.n_heads > 4096 || c.head_dim > 4096 || c.intermediate > (1 << 22))
        fail("load", where + ": sizes out of range");
    c.block_size = int(count("dflash.block_size", true, 0));
    if (c.block_size < 2) fail("load", where + ": dflash.block_size must be >= 2");
    c.mask_token_id = int(count("dflash.mask_token_id", true, 0));
    c.eps = float(real("attention.layer_norm_rms_epsilon", false, 1e-6));
    c.rope_theta = float(real("rope.freq_base", true, 0));
    if (count("rope.dimension_count", false, c.head_dim) != c.head_dim)
        fail("unsupported", where + ": partial RoPE (rope.dimension_count below head_dim)");

    // The tensors: exactly the draft's, every layer present.
    std::vector<std::string> want = {"dflash.fc.weight", "dflash.hidden_norm.weight", "output_norm.weight"};
    for (int l = 0; l < c.n_layers; ++l)
        for (const char* t : {"attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm",
                              "attn_k_norm", "ffn_gate", "ffn_up", "ffn_down"})
            want.push_back("blk." + std::to_string(l) + "." + t + ".weight");
    for (const auto& name : src.names())
        if (std::find(want.begin(), want.end(), name) == want.end())
            fail("unsupported", where + ": unexpected tensor '" + name + "' (not a plain DFlash draft of " +
                                    std::to_string(c.n_layers) + " layers)");
    for (const auto& name : want) need(src, name);

    // The conditioning: fc is [hidden, n_features * target_hidden].
    const TensorInfo& fc = need(src, "dflash.fc.weight");
    if (fc.shape.size() != 2 || fc.shape[0] != c.hidden)
        fail("load", where + ": dflash.fc.weight has shape " + shape_str(fc.shape) + ", expected [" +
                         std::to_string(c.hidden) + ", n_features * hidden]");
    if (const Json* ids = m.get(P + "dflash.target_layer_ids")) {
        if (!ids->is_array()) fail("load", where + ": '" + P + "dflash.target_layer_ids' must be an array");
        for (auto& v : ids->items()) {
            if (!v.is_number() || v.as_number() != std::floor(v.as_number()))
                fail("load", where + ": '" + P + "dflash.target_layer_ids' must hold integers, got " + ids->dump());
            c.target_layer_ids.push_back(int(v.as_number()));
        }
        if (c.target_layer_ids.empty()) fail("load", where + ": '" + P + "dflash.target_layer_ids' is empty");
    } else {
        const int64_t n = count("dflash.n_target_layers", false, fc.shape[1] / c.hidden);
        if (target_layers <= 0)
            fail("load", where + ": no dflash.target_layer_ids, and the default needs the target's layer count");
        if (n < 1) fail("load", where + ": dflash.n_target_layers must be >= 1");
        c.target_layer_ids = default_target_layer_ids(target_layers, int(n));
    }
    if (fc.shape[1] % c.n_features())
        fail("load", where + ": dflash.fc.weight has " + std::to_string(fc.shape[1]) + " inputs, not a multiple of " +
                         std::to_string(c.n_features()) + " target layers");
    c.target_hidden = int(fc.shape[1]) / c.n_features();
    if (count("dflash.n_target_layers", false, c.n_features()) != c.n_features())
        fail("load", where + ": dflash.n_target_layers is " + m.get(P + "dflash.n_target_layers")->dump() + " but " +
                         std::to_string(c.n_features()) + " target layers are listed");
    if (count("dflash.n_target_features", false, fc.shape[1]) != fc.shape[1])
        fail("load", where + ": dflash.n_target_features disagrees with dflash.fc.weight's " + std::to_string(fc.shape[1]) +
                         " inputs");

    // Sliding-window layers: a window and a per-layer pattern (true: sliding); none without a pattern.
    c.sliding_window = int(count("attention.sliding_window", false, 0));
    c.sliding.assign(size_t(c.n_layers), false);
    if (const Json* pat = m.get(P + "attention.sliding_window_pattern")) {
        if (!pat->is_array() || int(pat->size()) != c.n_layers)
            fail("load", where + ": attention.sliding_window_pattern must list " + std::to_string(c.n_layers) +
                             " booleans, got " + pat->dump());
        for (int l = 0; l < c.n_layers; ++l) {
            const Json& v = pat->items()[size_t(l)];
            if (!v.is_bool()) fail("load", where + ": attention.sliding_window_pattern must hold booleans");
            c.sliding[size_t(l)] = v.as_bool();
            if (v.as_bool() && c.sliding_window <= 0)
                fail("load", where + ": sliding layers need a positive attention.sliding_window");
        }
    }
    c.causal = c.sliding;  // as z-lab's default: causal inside the block on the sliding layers
    return c;
}

}  // namespace

DraftConfig draft_config_from_source(const TensorSource& src, int target_layers) {
    if (src.format() == "gguf") return draft_config_from_gguf(src, target_layers);
    const Json& root = src.metadata();
    if (src.format() != "safetensors")
        fail("unsupported", "draft checkpoint: format '" + src.format() + "' (safetensors or GGUF drafts)");
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
        if (!nt && target_layers <= 0)
            fail("load", std::string(kWhere) + ": neither 'target_layer_ids' nor 'num_target_layers'");
        c.target_layer_ids = default_target_layer_ids(nt ? as_int(*nt, "num_target_layers") : target_layers, c.n_layers);
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
    const TensorInfo& t = need(src, source_name(src, name));
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
