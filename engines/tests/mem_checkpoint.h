// Random-weight checkpoints held in memory, in the Hugging Face layout of Qwen3.5 and Qwen3, for tests
// that drive a backend directly. Weights are scaled like tests/engines/qwen35_synth.py (matrices
// N(0, 1/fan_in), embeddings N(0, 1), norm gains near 1, a final gain of mixed sign) so greedy decoding
// wanders over the vocabulary instead of repeating one token.
#pragma once
#include <cmath>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "core/json.h"
#include "core/tensor_source.h"

namespace lbtest {

class MemCheckpoint : public lb::TensorSource {
public:
    // `config_json`: a config.json text with model_type qwen3_5_text or qwen3.
    MemCheckpoint(const std::string& config_json, uint32_t seed) : rng_(seed) {
        metadata_ = lb::Json::parse(config_json);
        format_ = "safetensors";
        const lb::Json& c = metadata_;
        auto I = [&](const char* k) { return int64_t(c.get(k)->as_int()); };
        const bool qwen3 = c.get("model_type")->as_string() == "qwen3";
        const int64_t H = I("hidden_size"), F = I("intermediate_size"), V = I("vocab_size"), L = I("num_hidden_layers");
        const int64_t nh = I("num_attention_heads"), nkv = I("num_key_value_heads"), hd = I("head_dim");
        const bool tied = c.get("tie_word_embeddings") && c.get("tie_word_embeddings")->as_bool();
        // Qwen3.5 stores gains as w in x * (1 + w); Qwen3 stores the multiplier.
        const float gain0 = qwen3 ? 1.f : 0.f;
        add("model.embed_tokens.weight", {V, H}, 1.f);
        add("model.norm.weight", {H}, 1.f, gain0 - 1.f);
        if (!tied) add("lm_head.weight", {V, H}, 1.f / std::sqrt(float(H)));
        for (int64_t l = 0; l < L; ++l) {
            const std::string p = "model.layers." + std::to_string(l) + ".";
            add(p + "input_layernorm.weight", {H}, 0.1f, gain0);
            add(p + "post_attention_layernorm.weight", {H}, 0.1f, gain0);
            bool full = true;
            if (!qwen3 && c.get("layer_types")) full = c.get("layer_types")->items()[size_t(l)].as_string() == "full_attention";
            else if (!qwen3) full = (l + 1) % I("full_attention_interval") == 0;
            if (full) {
                const std::string a = p + "self_attn.";
                add(a + "q_proj.weight", {(qwen3 ? 1 : 2) * nh * hd, H}, 1.f / std::sqrt(float(H)));
                add(a + "k_proj.weight", {nkv * hd, H}, 1.f / std::sqrt(float(H)));
                add(a + "v_proj.weight", {nkv * hd, H}, 1.f / std::sqrt(float(H)));
                add(a + "o_proj.weight", {H, nh * hd}, 1.f / std::sqrt(float(nh * hd)));
                add(a + "q_norm.weight", {hd}, 0.1f, gain0);
                add(a + "k_norm.weight", {hd}, 0.1f, gain0);
            } else {
                const int64_t nk = I("linear_num_key_heads"), nv = I("linear_num_value_heads");
                const int64_t dk = I("linear_key_head_dim"), dv = I("linear_value_head_dim"), K = I("linear_conv_kernel_dim");
                const int64_t cd = 2 * nk * dk + nv * dv;
                const std::string a = p + "linear_attn.";
                add(a + "in_proj_qkv.weight", {cd, H}, 1.f / std::sqrt(float(H)));
                add(a + "in_proj_z.weight", {nv * dv, H}, 1.f / std::sqrt(float(H)));
                add(a + "in_proj_b.weight", {nv, H}, 1.f / std::sqrt(float(H)));
                add(a + "in_proj_a.weight", {nv, H}, 1.f / std::sqrt(float(H)));
                add(a + "conv1d.weight", {cd, 1, K}, 0.5f);
                add_uniform(a + "A_log", {nv}, -2.f, 1.5f);
                add(a + "dt_bias", {nv}, 0.5f);
                add(a + "norm.weight", {dv}, 0.1f, 1.f);
                add(a + "out_proj.weight", {H, nv * dv}, 1.f / std::sqrt(float(nv * dv)));
            }
            add(p + "mlp.gate_proj.weight", {F, H}, 1.f / std::sqrt(float(H)));
            add(p + "mlp.up_proj.weight", {F, H}, 1.f / std::sqrt(float(H)));
            add(p + "mlp.down_proj.weight", {H, F}, 1.f / std::sqrt(float(F)));
        }
    }

private:
    void put(const std::string& name, std::vector<int64_t> shape, std::vector<float>&& v) {
        data_.push_back(std::move(v));
        lb::TensorInfo t;
        t.name = name;
        t.dtype = lb::DType::F32;
        t.shape = std::move(shape);
        t.data = (const uint8_t*)data_.back().data();
        t.nbytes = data_.back().size() * 4;
        tensors_[name] = t;
    }
    void add(const std::string& name, std::vector<int64_t> shape, float std, float mean = 0.f) {
        int64_t n = 1;
        for (auto d : shape) n *= d;
        std::normal_distribution<float> nd(mean, std);
        std::vector<float> v(static_cast<size_t>(n));
        for (auto& e : v) e = nd(rng_);
        put(name, std::move(shape), std::move(v));
    }
    void add_uniform(const std::string& name, std::vector<int64_t> shape, float lo, float hi) {
        int64_t n = 1;
        for (auto d : shape) n *= d;
        std::uniform_real_distribution<float> ud(lo, hi);
        std::vector<float> v(static_cast<size_t>(n));
        for (auto& e : v) e = ud(rng_);
        put(name, std::move(shape), std::move(v));
    }
    std::mt19937 rng_;
    std::deque<std::vector<float>> data_;
};

}  // namespace lbtest
