// The CPU backend: the Qwen3.5 forward pass composed from the reference operations in ops.h, fp32
// throughout. This is the numerical reference the GPU backends are checked against.
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <fstream>
#include <thread>
#include <unistd.h>

#include "../backend.h"
#include "../errors.h"
#include "ops.h"

namespace lb {
namespace {

class CpuBackend : public Qwen35Backend {
public:
    std::string name() const override { return "cpu"; }

    DeviceInfo device() const override {
        DeviceInfo d;
        d.name = "CPU";
        std::ifstream f("/proc/cpuinfo");
        std::string line;
        while (std::getline(f, line))
            if (line.rfind("model name", 0) == 0) { d.name = line.substr(line.find(':') + 2); break; }
        d.name += " (" + std::to_string(std::thread::hardware_concurrency()) + " threads)";
        long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
        d.memory_bytes = uint64_t(pages) * uint64_t(page);
        return d;
    }

    void load(const TensorSource& src, const Qwen35Config& cfg, LoadStats* stats) override {
        cfg_ = cfg;
        Uploader up = [this](std::vector<float>&& data, int64_t rows, int64_t cols, bool matrix) {
            storage_.push_back(std::move(data));
            if (matrix) matrix_bytes_ += uint64_t(rows * cols) * 4;
            return Mat{storage_.back().data(), rows, cols};
        };
        w_ = load_qwen35_weights(src, cfg, up, stats);
    }

    void allocate(int max_ctx, DType kv_k, DType kv_v) override {
        max_ctx_ = max_ctx;
        kt_ = kv_k;
        vt_ = kv_v;
        const int hd = cfg_.head_dim;
        if ((kt_ == DType::Q8_0 || kt_ == DType::Q4_0 || vt_ == DType::Q8_0 || vt_ == DType::Q4_0) && hd % QK != 0)
            fail("unsupported", "quantised KV cache needs head_dim a multiple of 32");
        krow_ = dtype_row_bytes(kt_, size_t(hd));
        vrow_ = dtype_row_bytes(vt_, size_t(hd));
        kcache_.assign(size_t(cfg_.n_layers), {});
        vcache_.assign(size_t(cfg_.n_layers), {});
        ssm_.assign(size_t(cfg_.n_layers), {});
        conv_.assign(size_t(cfg_.n_layers), {});
        for (int l = 0; l < cfg_.n_layers; ++l) {
            if (cfg_.is_full[size_t(l)]) {
                kcache_[size_t(l)].resize(size_t(max_ctx) * cfg_.n_kv_heads * krow_);
                vcache_[size_t(l)].resize(size_t(max_ctx) * cfg_.n_kv_heads * vrow_);
            } else {
                ssm_[size_t(l)].resize(size_t(cfg_.lin_v_heads) * cfg_.lin_k_dim * cfg_.lin_v_dim);
                conv_[size_t(l)].resize(size_t(cfg_.conv_dim()) * (cfg_.conv_kernel - 1));
            }
        }
        reset();
    }

    void reset() override {
        len_ = 0;
        for (auto& s : ssm_) std::fill(s.begin(), s.end(), 0.f);
        for (auto& c : conv_) std::fill(c.begin(), c.end(), 0.f);
    }

    int length() const override { return len_; }

    int forward(const int* tokens, int n, std::vector<float>* last_logits) override {
        const int H = cfg_.hidden;
        std::vector<float> x(size_t(n) * H), h(size_t(n) * H), y(size_t(n) * H);
        for (int t = 0; t < n; ++t) {
            const float* e = (const float*)w_.embed.ptr + int64_t(tokens[t]) * H;
            std::copy(e, e + H, &x[size_t(t) * H]);
        }
        for (int l = 0; l < cfg_.n_layers; ++l) {
            const Qwen35Layer& L = w_.layers[size_t(l)];
            cpu::rmsnorm(x.data(), F(L.input_norm), h.data(), n, H, cfg_.eps);
            if (L.full) full_attention(l, L, h.data(), n, y.data());
            else delta_net(l, L, h.data(), n, y.data());
            for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
            cpu::rmsnorm(x.data(), F(L.post_norm), h.data(), n, H, cfg_.eps);
            mlp(L, h.data(), n, y.data());
            for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
        }
        len_ += n;
        // Logits of the last position only: generation needs nothing else.
        std::vector<float> last(static_cast<size_t>(H)), logits(static_cast<size_t>(cfg_.vocab));
        cpu::rmsnorm(&x[size_t(n - 1) * H], F(w_.final_norm), last.data(), 1, H, cfg_.eps);
        cpu::matmul(last.data(), 1, H, F(w_.lm_head), cfg_.vocab, logits.data());
        int next = cpu::argmax(logits.data(), cfg_.vocab);
        if (last_logits) *last_logits = std::move(logits);
        return next;
    }

    void timer_start() override { t0_ = std::chrono::steady_clock::now(); }
    double timer_stop_ms() override {
        return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
    }
    void synchronize() override {}
    uint64_t peak_mem_bytes() const override {
        std::ifstream f("/proc/self/status");
        std::string line;
        while (std::getline(f, line))
            if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
        return 0;
    }
    uint64_t decode_bytes(int ctx) const override {
        return qwen35_decode_bytes(cfg_, qwen35_streamed_weight_bytes(cfg_, matrix_bytes_, 4), 0, kt_, vt_, ctx);
    }
    std::string weight_dtype() const override { return "f32"; }

private:
    static const float* F(const Mat& m) { return (const float*)m.ptr; }

    void full_attention(int l, const Qwen35Layer& L, const float* x, int n, float* out) {
        const int nh = cfg_.n_heads, nkv = cfg_.n_kv_heads, hd = cfg_.head_dim, H = cfg_.hidden;
        const int rows = cfg_.attn_qkv_rows();
        std::vector<float> qkv(size_t(n) * rows);
        cpu::matmul(x, n, H, F(L.attn_qkv), rows, qkv.data());
        std::vector<float> q(size_t(n) * nh * hd), gate(size_t(n) * nh * hd), k(size_t(n) * nkv * hd), v(size_t(n) * nkv * hd);
        for (int t = 0; t < n; ++t) {
            const float* r = &qkv[size_t(t) * rows];
            for (int hh = 0; hh < nh; ++hh) {  // q_proj rows per head: [query (hd), gate (hd)]
                std::copy(r + hh * 2 * hd, r + hh * 2 * hd + hd, &q[(size_t(t) * nh + hh) * hd]);
                std::copy(r + hh * 2 * hd + hd, r + (hh + 1) * 2 * hd, &gate[(size_t(t) * nh + hh) * hd]);
            }
            std::copy(r + 2 * nh * hd, r + 2 * nh * hd + nkv * hd, &k[size_t(t) * nkv * hd]);
            std::copy(r + 2 * nh * hd + nkv * hd, r + rows, &v[size_t(t) * nkv * hd]);
        }
        cpu::rmsnorm(q.data(), F(L.q_norm), q.data(), n * nh, hd, cfg_.eps);
        cpu::rmsnorm(k.data(), F(L.k_norm), k.data(), n * nkv, hd, cfg_.eps);
        cpu::rope(q.data(), n, nh, hd, cfg_.rope_dims, cfg_.rope_theta, len_);
        cpu::rope(k.data(), n, nkv, hd, cfg_.rope_dims, cfg_.rope_theta, len_);
        uint8_t* kc = kcache_[size_t(l)].data();
        uint8_t* vc = vcache_[size_t(l)].data();
        for (int t = 0; t < n; ++t)
            for (int j = 0; j < nkv; ++j) {
                const size_t r = size_t(len_ + t) * nkv + j;
                encode_row(kt_, &k[(size_t(t) * nkv + j) * hd], kc + r * krow_, size_t(hd));
                encode_row(vt_, &v[(size_t(t) * nkv + j) * hd], vc + r * vrow_, size_t(hd));
            }
        std::vector<float> att(size_t(n) * nh * hd);
        cpu::attention(q.data(), n, nh, nkv, hd, len_, kc, kt_, vc, vt_, att.data());
        for (size_t i = 0; i < att.size(); ++i) att[i] *= cpu::sigmoid(gate[i]);
        cpu::matmul(att.data(), n, nh * hd, F(L.o_proj), H, out);
    }

    void delta_net(int l, const Qwen35Layer& L, const float* x, int n, float* out) {
        const int H = cfg_.hidden, hk = cfg_.lin_k_heads, hv = cfg_.lin_v_heads;
        const int dk = cfg_.lin_k_dim, dv = cfg_.lin_v_dim, kd = cfg_.lin_key_dim(), vd = cfg_.lin_value_dim();
        const int cd = cfg_.conv_dim(), rows = cfg_.lin_in_rows();
        std::vector<float> proj(size_t(n) * rows);
        cpu::matmul(x, n, H, F(L.lin_in), rows, proj.data());
        // Split the fused projection: [qkv (cd) | z (vd) | b (hv) | a (hv)].
        std::vector<float> mixed(size_t(n) * cd), conv_out(size_t(n) * cd), z(size_t(n) * vd);
        std::vector<float> g(size_t(n) * hv), beta(size_t(n) * hv);
        const float* negA = F(L.neg_A);
        const float* dt = F(L.dt_bias);
        for (int t = 0; t < n; ++t) {
            const float* r = &proj[size_t(t) * rows];
            std::copy(r, r + cd, &mixed[size_t(t) * cd]);
            std::copy(r + cd, r + cd + vd, &z[size_t(t) * vd]);
            for (int hh = 0; hh < hv; ++hh) {
                beta[size_t(t) * hv + hh] = cpu::sigmoid(r[cd + vd + hh]);
                g[size_t(t) * hv + hh] = negA[hh] * cpu::softplus(r[cd + vd + hv + hh] + dt[hh]);
            }
        }
        cpu::causal_conv1d_silu(mixed.data(), n, cd, cfg_.conv_kernel, F(L.conv_w), conv_[size_t(l)].data(), conv_out.data());
        std::vector<float> q(size_t(n) * kd), k(size_t(n) * kd), v(size_t(n) * vd);
        for (int t = 0; t < n; ++t) {
            const float* r = &conv_out[size_t(t) * cd];
            std::copy(r, r + kd, &q[size_t(t) * kd]);
            std::copy(r + kd, r + 2 * kd, &k[size_t(t) * kd]);
            std::copy(r + 2 * kd, r + cd, &v[size_t(t) * vd]);
        }
        cpu::l2norm(q.data(), n * hk, dk, 1e-6f);
        cpu::l2norm(k.data(), n * hk, dk, 1e-6f);
        const float qscale = 1.0f / std::sqrt(float(dk));
        for (auto& e : q) e *= qscale;
        std::vector<float> o(size_t(n) * vd);
        if (n == 1) cpu::delta_rule_recurrent(q.data(), k.data(), v.data(), g.data(), beta.data(), n, hk, hv, dk, dv, ssm_[size_t(l)].data(), o.data());
        else cpu::delta_rule_chunked(q.data(), k.data(), v.data(), g.data(), beta.data(), n, hk, hv, dk, dv, ssm_[size_t(l)].data(), o.data());
        std::vector<float> normed(size_t(n) * vd);
        cpu::gated_rmsnorm(o.data(), z.data(), F(L.ssm_norm), normed.data(), n * hv, dv, cfg_.eps);
        cpu::matmul(normed.data(), n, vd, F(L.out_proj), H, out);
    }

    void mlp(const Qwen35Layer& L, const float* x, int n, float* out) {
        const int H = cfg_.hidden, I = cfg_.intermediate;
        std::vector<float> gu(size_t(n) * 2 * I), act(size_t(n) * I);
        cpu::matmul(x, n, H, F(L.gate_up), 2 * I, gu.data());
        for (int t = 0; t < n; ++t)
            for (int i = 0; i < I; ++i)
                act[size_t(t) * I + i] = cpu::silu(gu[size_t(t) * 2 * I + i]) * gu[size_t(t) * 2 * I + I + i];
        cpu::matmul(act.data(), n, I, F(L.down), H, out);
    }

    Qwen35Config cfg_;
    Qwen35Weights w_;
    std::deque<std::vector<float>> storage_;
    uint64_t matrix_bytes_ = 0;
    int max_ctx_ = 0, len_ = 0;
    DType kt_ = DType::BF16, vt_ = DType::BF16;
    size_t krow_ = 0, vrow_ = 0;
    std::vector<std::vector<uint8_t>> kcache_, vcache_;
    std::vector<std::vector<float>> ssm_, conv_;
    std::chrono::steady_clock::time_point t0_;
};

}  // namespace

std::unique_ptr<Qwen35Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace lb
