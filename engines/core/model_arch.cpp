#include "model_arch.h"

#include <algorithm>

#include "errors.h"

namespace lb {

const ArchConventions& conventions(Arch a) {
    static const ArchConventions qwen35{"qwen3_5", "qwen35", true, "post_attention_norm"};
    static const ArchConventions qwen3{"qwen3", "qwen3", false, "ffn_norm"};
    return a == Arch::Qwen3 ? qwen3 : qwen35;
}

const char* arch_name(Arch a) { return conventions(a).name; }

static int64_t need_int(const Json& obj, const char* key, const std::string& where) {
    const Json* v = obj.get(key);
    if (!v || !v->is_number()) fail("load", where + ": missing integer '" + key + "'");
    return v->as_int();
}

// RoPE: transformers >= 5 nests it in rope_parameters; older files have top-level keys.
static void read_rope(const Json& c, const std::string& where, double default_partial, ModelConfig* cfg) {
    double theta = 10000.0, partial = default_partial;
    if (auto* v = c.get("rope_theta")) theta = v->as_number();
    if (auto* v = c.get("partial_rotary_factor")) partial = v->as_number();
    if (auto* rp = c.get("rope_parameters"); rp && rp->is_object()) {
        if (auto* v = rp->get("rope_theta")) theta = v->as_number();
        if (auto* v = rp->get("partial_rotary_factor")) partial = v->as_number();
        if (auto* v = rp->get("rope_type"); v && v->is_string() && v->as_string() != "default")
            fail("unsupported", where + ": rope_type '" + v->as_string() + "' (only 'default')");
    }
    if (auto* rs = c.get("rope_scaling"); rs && rs->is_object())
        if (auto* v = rs->get("rope_type"); v && v->is_string() && v->as_string() != "default")
            fail("unsupported", where + ": rope_scaling type '" + v->as_string() + "' (only 'default')");
    cfg->rope_theta = float(theta);
    cfg->rope_dims = int(cfg->head_dim * partial);
}

static void read_common(const Json& c, const std::string& where, ModelConfig* cfg) {
    cfg->n_layers = int(need_int(c, "num_hidden_layers", where));
    cfg->hidden = int(need_int(c, "hidden_size", where));
    cfg->intermediate = int(need_int(c, "intermediate_size", where));
    cfg->vocab = int(need_int(c, "vocab_size", where));
    cfg->n_heads = int(need_int(c, "num_attention_heads", where));
    cfg->n_kv_heads = int(need_int(c, "num_key_value_heads", where));
    cfg->head_dim = c.get("head_dim") ? int(c.get("head_dim")->as_int()) : cfg->hidden / std::max(1, cfg->n_heads);
    if (c.get("rms_norm_eps")) cfg->eps = float(c.get("rms_norm_eps")->as_number());
}

ModelConfig config_from_hf(const Json& root) {
    const std::string where = "config.json";
    const Json* text = root.get("text_config");
    const Json& c = text ? *text : root;
    std::string type;
    if (auto* mt = c.get("model_type"); mt && mt->is_string()) type = mt->as_string();
    else if (auto* mt2 = root.get("model_type"); mt2 && mt2->is_string()) type = mt2->as_string();
    ModelConfig cfg;
    if (type == "qwen3") cfg.arch = Arch::Qwen3;
    else if (type == "qwen3_5_text" || type == "qwen3_5" || type.empty()) cfg.arch = Arch::Qwen35;
    else fail("unsupported", where + ": model_type '" + type + "' (this engine runs qwen3_5 / qwen3_5_text and qwen3)");
    read_common(c, where, &cfg);
    // Tied embeddings: the top-level flag wins for multimodal checkpoints (that is the class transformers builds).
    const Json* tie = root.get("tie_word_embeddings");
    if (!tie && text) tie = text->get("tie_word_embeddings");

    if (cfg.arch == Arch::Qwen3) {
        if (auto* b = c.get("attention_bias"); b && b->is_bool() && b->as_bool())
            fail("unsupported", where + ": attention_bias true (Qwen3 checkpoints have none)");
        if (auto* s = c.get("use_sliding_window"); s && s->is_bool() && s->as_bool())
            fail("unsupported", where + ": use_sliding_window true (only full attention)");
        read_rope(c, where, 1.0, &cfg);
        cfg.tied = tie && tie->is_bool() && tie->as_bool();
        if (auto* lt = c.get("layer_types"); lt && lt->is_array())
            for (auto& t : lt->items())
                if (t.as_string() != "full_attention")
                    fail("unsupported", where + ": layer type '" + t.as_string() + "' (only full_attention)");
        cfg.kinds.assign(size_t(cfg.n_layers), LayerKind::Attention);
    } else {
        cfg.lin_k_heads = int(need_int(c, "linear_num_key_heads", where));
        cfg.lin_v_heads = int(need_int(c, "linear_num_value_heads", where));
        cfg.lin_k_dim = int(need_int(c, "linear_key_head_dim", where));
        cfg.lin_v_dim = int(need_int(c, "linear_value_head_dim", where));
        if (c.get("linear_conv_kernel_dim")) cfg.conv_kernel = int(c.get("linear_conv_kernel_dim")->as_int());
        read_rope(c, where, 0.25, &cfg);
        cfg.tied = tie && tie->is_bool() && tie->as_bool();
        if (auto* lt = c.get("layer_types"); lt && lt->is_array()) {
            for (auto& t : lt->items()) {
                const std::string& s = t.as_string();
                if (s == "full_attention" || s == "attention") cfg.kinds.push_back(LayerKind::GatedAttention);
                else if (s == "linear_attention") cfg.kinds.push_back(LayerKind::DeltaNet);
                else fail("unsupported", where + ": layer type '" + s + "'");
            }
        } else {
            int interval = c.get("full_attention_interval") ? int(c.get("full_attention_interval")->as_int()) : 4;
            for (int i = 0; i < cfg.n_layers; ++i)
                cfg.kinds.push_back((i + 1) % interval == 0 ? LayerKind::GatedAttention : LayerKind::DeltaNet);
        }
        if (int(cfg.kinds.size()) < cfg.n_layers) fail("load", where + ": layer_types is shorter than num_hidden_layers");
        cfg.kinds.resize(size_t(cfg.n_layers));
    }
    return cfg;
}

// GGUF keys are "<arch>.<name>"; some hybrid models store per-layer arrays (0 for recurrent layers).
static double gguf_num(const Json& md, const std::string& key, bool required, double fallback = 0) {
    const Json* v = md.get(key);
    if (!v) {
        if (required) fail("load", "GGUF metadata lacks " + key);
        return fallback;
    }
    if (v->is_array()) {
        double best = 0;
        for (auto& e : v->items()) best = std::max(best, e.as_number());
        return best;
    }
    return v->as_number();
}

ModelConfig config_from_gguf(const TensorSource& src) {
    const Json& md = src.metadata();
    const Json* arch_v = md.get("general.architecture");
    std::string arch = arch_v && arch_v->is_string() ? arch_v->as_string() : "";
    ModelConfig cfg;
    if (arch == "qwen35") cfg.arch = Arch::Qwen35;
    else if (arch == "qwen3") cfg.arch = Arch::Qwen3;
    else fail("unsupported", "GGUF architecture '" + arch + "' (this engine runs qwen35 and qwen3)");
    auto key = [&](const char* k) { return arch + "." + k; };
    cfg.n_layers = int(gguf_num(md, key("block_count"), true));
    cfg.hidden = int(gguf_num(md, key("embedding_length"), true));
    cfg.intermediate = int(gguf_num(md, key("feed_forward_length"), true));
    cfg.n_heads = int(gguf_num(md, key("attention.head_count"), true));
    cfg.n_kv_heads = int(gguf_num(md, key("attention.head_count_kv"), true));
    cfg.head_dim = int(gguf_num(md, key("attention.key_length"), false, cfg.hidden / std::max(1, cfg.n_heads)));
    cfg.eps = float(gguf_num(md, key("attention.layer_norm_rms_epsilon"), false, 1e-6));
    cfg.rope_theta = float(gguf_num(md, key("rope.freq_base"), false, 10000.0));
    const TensorInfo* emb = src.find("token_embd.weight");
    if (!emb) fail("load", "GGUF file lacks tensor token_embd.weight");
    cfg.vocab = int(emb->shape.at(0));
    cfg.tied = src.find("output.weight") == nullptr;
    if (cfg.arch == Arch::Qwen3) {
        cfg.rope_dims = int(gguf_num(md, key("rope.dimension_count"), false, cfg.head_dim));
        cfg.kinds.assign(size_t(cfg.n_layers), LayerKind::Attention);
        return cfg;
    }
    cfg.rope_dims = int(gguf_num(md, key("rope.dimension_count"), false, cfg.head_dim / 4));
    cfg.conv_kernel = int(gguf_num(md, key("ssm.conv_kernel"), true));
    cfg.lin_k_dim = int(gguf_num(md, key("ssm.state_size"), true));
    cfg.lin_k_heads = int(gguf_num(md, key("ssm.group_count"), true));
    cfg.lin_v_heads = int(gguf_num(md, key("ssm.time_step_rank"), true));
    cfg.lin_v_dim = int(gguf_num(md, key("ssm.inner_size"), true)) / std::max(1, cfg.lin_v_heads);
    // A layer is a DeltaNet layer exactly when it has the recurrent tensors.
    for (int i = 0; i < cfg.n_layers; ++i) {
        std::string b = "blk." + std::to_string(i) + ".";
        const bool recurrent = src.find(b + "ssm_a") || src.find(b + "ssm_a.weight");
        cfg.kinds.push_back(recurrent ? LayerKind::DeltaNet : LayerKind::GatedAttention);
    }
    return cfg;
}

ModelConfig config_from_source(const TensorSource& src) {
    ModelConfig cfg = src.format() == "gguf" ? config_from_gguf(src) : config_from_hf(src.metadata());
    cfg.is_full.clear();
    for (auto k : cfg.kinds) cfg.is_full.push_back(k != LayerKind::DeltaNet);
    auto check = [](bool ok, const std::string& what) { if (!ok) fail("load", "bad model config: " + what); };
    check(cfg.n_layers > 0 && cfg.hidden > 0 && cfg.vocab > 0 && cfg.intermediate > 0, "sizes must be positive");
    check(cfg.n_heads > 0 && cfg.n_kv_heads > 0 && cfg.n_heads % cfg.n_kv_heads == 0, "num_attention_heads must be a multiple of num_key_value_heads");
    check(cfg.head_dim > 0, "head_dim must be positive");
    if (cfg.has_recurrent())
        check(cfg.lin_k_heads > 0 && cfg.lin_v_heads % cfg.lin_k_heads == 0, "linear_num_value_heads must be a multiple of linear_num_key_heads");
    check(cfg.rope_dims % 2 == 0 && cfg.rope_dims <= cfg.head_dim, "rotary dims must be even and <= head_dim");
    return cfg;
}

}  // namespace lb
