// The GPU verify forward (core/cuda/verify_forward.cu) end to end, on the device:
//  1. exactness: a Backend built from the core's GPU forward (AR: forward_layers, as the ar engine's
//     prefill and legacy decode) and its verify + commit runs the scripted trees of spec_check.h on random
//     Qwen3.5 models: the committed tokens must be the AR greedy tokens up to the first near-tie, the
//     states after commit the AR states (to bf16 rounding);
//  2. cost (`--time`): one verify forward of B + 1 rows (B in 1, 8, 16, 22, 32, 64; a DDTree-like tree:
//     the top-1 chain to depth 15, further nodes as siblings) against one decode step of the ar engine's
//     GPU backend (its fused decode graph) and of forward_layers n = 1, on full-shape synthetic
//     Qwen3.5-0.8B weights at a 512-token context, and beside it the append forward (forward_layers, the
//     prefill path) of as many tokens; medians of 20 repetitions (CUDA events).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/cuda/qwen35_forward.h"
#include "core/cuda/verify_forward.h"
#include "core/half.h"
#include "mem_checkpoint.h"
#include "spec_check.h"

using namespace lb;
using namespace spec_check;

namespace {

class GpuVerifyBackend : public Backend {
public:
    GpuVerifyBackend() {
        GPU_CHECK(gpuStreamCreate(&s_));
        GPU_CHECK(gpuEventCreate(&e0_));
        GPU_CHECK(gpuEventCreate(&e1_));
        d_pos_ = (int*)alloc(sizeof(int));
        d_next_ = (int*)alloc(sizeof(int));
        gpu::decode_setup(0);
    }
    ~GpuVerifyBackend() override { for (void* p : allocs_) (void)gpuFree(p); }
    std::string name() const override { return "cuda-verify-check"; }
    DeviceInfo device() const override { return {}; }
    std::string weight_dtype() const override { return LB_WTYPE_NAME; }

    void load(const TensorSource& src, const ModelConfig& cfg, LoadStats* stats) override {
        cfg_ = cfg;
        Uploader up = [this](std::vector<float>&& data, int64_t rows, int64_t cols, bool matrix) {
            Mat m{nullptr, rows, cols};
            if (matrix) {
                std::vector<gpu::wtype> conv(data.size());
                for (size_t i = 0; i < data.size(); ++i) conv[i] = gpu::wtype(data[i]);
                m.ptr = alloc(conv.size() * sizeof(gpu::wtype));
                GPU_CHECK(gpuMemcpy(m.ptr, conv.data(), conv.size() * sizeof(gpu::wtype), gpuMemcpyHostToDevice));
            } else {
                m.ptr = alloc(data.size() * 4);
                GPU_CHECK(gpuMemcpy(m.ptr, data.data(), data.size() * 4, gpuMemcpyHostToDevice));
            }
            return m;
        };
        w_ = load_qwen35_weights(src, cfg, up, stats);
    }
    void allocate(int max_ctx, DType kt, DType vt) override {
        max_ctx_ = max_ctx;
        kt_ = kt;
        vt_ = vt;
        const size_t krow = dtype_row_bytes(kt, size_t(cfg_.head_dim)), vrow = dtype_row_bytes(vt, size_t(cfg_.head_dim));
        k_.assign(size_t(cfg_.n_layers), nullptr);
        v_.assign(size_t(cfg_.n_layers), nullptr);
        ssm_.assign(size_t(cfg_.n_layers), nullptr);
        conv_.assign(size_t(cfg_.n_layers), nullptr);
        for (int l = 0; l < cfg_.n_layers; ++l) {
            if (cfg_.is_attention(l)) {
                k_[size_t(l)] = alloc(size_t(max_ctx) * cfg_.n_kv_heads * krow);
                v_[size_t(l)] = alloc(size_t(max_ctx) * cfg_.n_kv_heads * vrow);
            } else {
                ssm_[size_t(l)] = (float*)alloc(4 * state_elems());
                conv_[size_t(l)] = (float*)alloc(4 * conv_elems());
            }
        }
        reset();
    }
    void reset() override {
        len_ = 0;
        for (int l = 0; l < cfg_.n_layers; ++l) {
            if (ssm_[size_t(l)]) GPU_CHECK(gpuMemsetAsync(ssm_[size_t(l)], 0, 4 * state_elems(), s_));
            if (conv_[size_t(l)]) GPU_CHECK(gpuMemsetAsync(conv_[size_t(l)], 0, 4 * conv_elems(), s_));
        }
        set_pos();
    }
    int length() const override { return len_; }

    int forward(const int* tokens, int n, std::vector<float>* last_logits) override {
        fws_.ensure(cfg_, n, [this](size_t b) { return alloc(b); });
        GPU_CHECK(gpuMemcpyAsync(fws_.tokens, tokens, sizeof(int) * size_t(n), gpuMemcpyHostToDevice, s_));
        gpu::forward_layers(cfg_, w_, fws_, caches(), fws_.tokens, n, d_next_, s_);
        int next = 0;
        GPU_CHECK(gpuMemcpyAsync(&next, d_next_, sizeof(int), gpuMemcpyDeviceToHost, s_));
        if (last_logits) {
            last_logits->resize(size_t(cfg_.vocab));
            GPU_CHECK(gpuMemcpyAsync(last_logits->data(), fws_.logits, 4 * size_t(cfg_.vocab), gpuMemcpyDeviceToHost, s_));
        }
        GPU_CHECK(gpuStreamSynchronize(s_));
        GPU_CHECK(gpuGetLastError());
        len_ += n;
        return next;
    }

    void verify(const VerifyRequest& req, VerifyResult* out) override {
        const int n = upload_rows(req);
        gpu::verify_layers(cfg_, w_, vws_, vcaches(), len_, n, s_);
        out->argmax.resize(size_t(n));
        GPU_CHECK(gpuMemcpyAsync(out->argmax.data(), vws_.argmax, sizeof(int) * size_t(n), gpuMemcpyDeviceToHost, s_));
        GPU_CHECK(gpuStreamSynchronize(s_));
        GPU_CHECK(gpuGetLastError());
    }
    void commit(const std::vector<int>& path) override {
        GPU_CHECK(gpuMemcpyAsync(vws_.path, path.data(), sizeof(int) * path.size(), gpuMemcpyHostToDevice, s_));
        gpu::commit_path(cfg_, vws_, vcaches(), len_, int(path.size()), s_);
        len_ += int(path.size());
        set_pos();
        GPU_CHECK(gpuStreamSynchronize(s_));
        GPU_CHECK(gpuGetLastError());
    }
    void export_state(SequenceState* out) const override {
        const int hd = cfg_.head_dim, nkv = cfg_.n_kv_heads;
        const size_t krow = dtype_row_bytes(kt_, size_t(hd)), vrow = dtype_row_bytes(vt_, size_t(hd));
        out->length = len_;
        out->k.assign(size_t(cfg_.n_layers), {});
        out->v.assign(size_t(cfg_.n_layers), {});
        out->recurrent.assign(size_t(cfg_.n_layers), {});
        out->conv.assign(size_t(cfg_.n_layers), {});
        for (int l = 0; l < cfg_.n_layers; ++l) {
            if (cfg_.is_attention(l)) {
                std::vector<uint8_t> kb(size_t(len_) * nkv * krow), vb(size_t(len_) * nkv * vrow);
                GPU_CHECK(gpuMemcpy(kb.data(), k_[size_t(l)], kb.size(), gpuMemcpyDeviceToHost));
                GPU_CHECK(gpuMemcpy(vb.data(), v_[size_t(l)], vb.size(), gpuMemcpyDeviceToHost));
                auto& k = out->k[size_t(l)];
                auto& v = out->v[size_t(l)];
                k.resize(size_t(len_) * nkv * hd);
                v.resize(k.size());
                for (size_t r = 0; r < size_t(len_) * nkv; ++r) {
                    decode_row(kt_, &kb[r * krow], &k[r * hd], size_t(hd));
                    decode_row(vt_, &vb[r * vrow], &v[r * hd], size_t(hd));
                }
            } else {
                out->recurrent[size_t(l)].resize(state_elems());
                out->conv[size_t(l)].resize(conv_elems());
                GPU_CHECK(gpuMemcpy(out->recurrent[size_t(l)].data(), ssm_[size_t(l)], 4 * state_elems(), gpuMemcpyDeviceToHost));
                GPU_CHECK(gpuMemcpy(out->conv[size_t(l)].data(), conv_[size_t(l)], 4 * conv_elems(), gpuMemcpyDeviceToHost));
            }
        }
    }

    void timer_start() override { GPU_CHECK(gpuEventRecord(e0_, s_)); }
    double timer_stop_ms() override {
        GPU_CHECK(gpuEventRecord(e1_, s_));
        GPU_CHECK(gpuEventSynchronize(e1_));
        float ms = 0;
        GPU_CHECK(gpuEventElapsedTime(&ms, e0_, e1_));
        return ms;
    }
    void synchronize() override { GPU_CHECK(gpuStreamSynchronize(s_)); }
    uint64_t peak_mem_bytes() const override { return 0; }
    uint64_t decode_bytes(int) const override { return 0; }

    // Timing helpers: the rows of `req` uploaded once, then verify_layers / forward_layers n = 1 alone.
    int upload_rows(const VerifyRequest& req) {
        const int n = int(req.tokens.size());
        if (len_ + n > max_ctx_) fail("context_overflow", "verify past max_ctx");
        vws_.ensure(cfg_, n, [this](size_t b) { return alloc(b); });
        std::vector<int> parent(static_cast<size_t>(n));
        for (int t = 0; t < n; ++t) parent[size_t(t)] = req.parents.empty() ? t - 1 : req.parents[size_t(t)];
        std::vector<unsigned char> vis(size_t(n) * n, 0);
        for (int t = 0; t < n; ++t) for (int s = t; s >= 0; s = parent[size_t(s)]) vis[size_t(t) * n + s] = 1;
        GPU_CHECK(gpuMemcpyAsync(vws_.tokens, req.tokens.data(), sizeof(int) * size_t(n), gpuMemcpyHostToDevice, s_));
        GPU_CHECK(gpuMemcpyAsync(vws_.positions, req.positions.data(), sizeof(int) * size_t(n), gpuMemcpyHostToDevice, s_));
        GPU_CHECK(gpuMemcpyAsync(vws_.parent, parent.data(), sizeof(int) * size_t(n), gpuMemcpyHostToDevice, s_));
        GPU_CHECK(gpuMemcpyAsync(vws_.visible, vis.data(), vis.size(), gpuMemcpyHostToDevice, s_));
        GPU_CHECK(gpuStreamSynchronize(s_));
        return n;
    }
    void verify_only(int n) { gpu::verify_layers(cfg_, w_, vws_, vcaches(), len_, n, s_); }
    void decode_only(int token) {
        fws_.ensure(cfg_, 1, [this](size_t b) { return alloc(b); });
        GPU_CHECK(gpuMemcpyAsync(fws_.tokens, &token, sizeof(int), gpuMemcpyHostToDevice, s_));
        gpu::forward_layers(cfg_, w_, fws_, caches(), fws_.tokens, 1, d_next_, s_);
    }
    void append_only(const std::vector<int>& tokens) {
        const int n = int(tokens.size());
        fws_.ensure(cfg_, n, [this](size_t b) { return alloc(b); });
        GPU_CHECK(gpuMemcpyAsync(fws_.tokens, tokens.data(), sizeof(int) * size_t(n), gpuMemcpyHostToDevice, s_));
        gpu::forward_layers(cfg_, w_, fws_, caches(), fws_.tokens, n, d_next_, s_);
    }
    // Medians (ms) of the verify's largest per-layer pieces over the rows of the last verify_only: one
    // attention layer's tree_attention, one DeltaNet layer's delta_tree, and the LM head + argmax of every row.
    void time_parts(int n, double* attn_ms, double* delta_ms, double* head_ms) {
        auto med = [&](const std::function<void()>& f) {
            std::vector<double> v;
            for (int r = 0; r < 13; ++r) {
                timer_start();
                f();
                const double ms = timer_stop_ms();
                if (r >= 3) v.push_back(ms);
            }
            std::sort(v.begin(), v.end());
            return v[v.size() / 2];
        };
        int la = 0, ld = 0;
        while (!cfg_.is_attention(la)) ++la;
        while (cfg_.is_attention(ld)) ++ld;
        const LayerWeights& A = w_.layers[size_t(la)];
        *attn_ms = med([&] {
            gpu::tree_attention(vws_.big, cfg_.attn_qkv_rows(la), n, cfg_.n_heads, cfg_.n_kv_heads, cfg_.head_dim,
                                A.kind == LayerKind::GatedAttention, len_, k_[size_t(la)], kt_, v_[size_t(la)], vt_,
                                vws_.visible, vws_.o, s_);
        });
        *delta_ms = med([&] {
            gpu::delta_tree(vws_.conv, cfg_.conv_dim(), n, cfg_.lin_k_heads, cfg_.lin_v_heads, cfg_.lin_k_dim, cfg_.lin_v_dim,
                            vws_.g, vws_.beta, vws_.parent, vws_.visible, ssm_[size_t(ld)], vws_.o, vws_.keep_u[size_t(ld)],
                            vws_.keep_gamma[size_t(ld)], vws_.keep_k[size_t(ld)], vws_.scratch, s_);
        });
        *head_ms = med([&] {
            gpu::matmul(vws_.h, n, cfg_.hidden, (const gpu::wtype*)w_.lm_head.ptr, cfg_.vocab, vws_.logits, false, s_);
            gpu::argmax_rows(vws_.logits, n, cfg_.vocab, vws_.argmax, s_);
        });
        GPU_CHECK(gpuGetLastError());
    }
    void set_length(int len) { len_ = len; set_pos(); GPU_CHECK(gpuStreamSynchronize(s_)); }

private:
    size_t state_elems() const { return size_t(cfg_.lin_v_heads) * cfg_.lin_k_dim * cfg_.lin_v_dim; }
    size_t conv_elems() const { return size_t(cfg_.conv_dim()) * (cfg_.conv_kernel - 1); }
    void set_pos() { GPU_CHECK(gpuMemcpyAsync(d_pos_, &len_, sizeof(int), gpuMemcpyHostToDevice, s_)); }
    gpu::ForwardCaches caches() { return gpu::ForwardCaches{k_, v_, kt_, vt_, ssm_, conv_, d_pos_}; }
    gpu::VerifyCaches vcaches() { return gpu::VerifyCaches{k_, v_, kt_, vt_, ssm_, conv_}; }
    void* alloc(size_t b) {
        void* p = nullptr;
        GPU_CHECK(gpuMalloc(&p, std::max<size_t>(b, 4)));
        allocs_.push_back(p);
        return p;
    }

    ModelConfig cfg_;
    ModelWeights w_;
    gpuStream_t s_;
    gpuEvent_t e0_, e1_;
    int *d_pos_ = nullptr, *d_next_ = nullptr;
    int max_ctx_ = 0, len_ = 0;
    DType kt_ = DType::BF16, vt_ = DType::BF16;
    std::vector<void*> k_, v_;
    std::vector<float*> ssm_, conv_;
    gpu::ForwardWorkspace fws_;
    gpu::VerifyWorkspace vws_;
    std::vector<void*> allocs_;
};

const char* kTiny = R"({"model_type": "qwen3_5_text", "vocab_size": 301, "hidden_size": 64, "intermediate_size": 96,
  "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "linear_num_key_heads": 2,
  "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4,
  "rms_norm_eps": 1e-6, "tie_word_embeddings": false,
  "layer_types": ["linear_attention", "linear_attention", "full_attention", "linear_attention"],
  "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}})";
const char* kOdd = R"({"model_type": "qwen3_5_text", "vocab_size": 263, "hidden_size": 40, "intermediate_size": 56,
  "num_hidden_layers": 5, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 20, "linear_num_key_heads": 1,
  "linear_num_value_heads": 3, "linear_key_head_dim": 12, "linear_value_head_dim": 6, "linear_conv_kernel_dim": 3,
  "rms_norm_eps": 1e-6, "tie_word_embeddings": true,
  "layer_types": ["full_attention", "linear_attention", "linear_attention", "full_attention", "linear_attention"],
  "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.5}})";
const char* k08b = R"({"model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 1024, "intermediate_size": 3584,
  "num_hidden_layers": 24, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256, "linear_num_key_heads": 16,
  "linear_num_value_heads": 16, "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
  "rms_norm_eps": 1e-6, "tie_word_embeddings": true, "full_attention_interval": 4,
  "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25}})";

// Five prompts per model: a random model's bf16 logits have near-ties (a flip there ends the comparison),
// so the rounds compared are summed over the runs.
void exactness(const char* name, const char* config, uint32_t seed) {
    lbtest::MemCheckpoint src(config, seed);
    const ModelConfig cfg = config_from_source(src);
    GpuVerifyBackend ar_be, spec_be;
    for (GpuVerifyBackend* b : {&ar_be, &spec_be}) {
        b->load(src, cfg, nullptr);
        b->allocate(320, DType::BF16, DType::BF16);
    }
    int total = 0, most = 0;
    double worst = 0;
    for (uint32_t p = 0; p < 5; ++p) {
        const ArRun ar = ar_run(ar_be, random_prompt(9, cfg.vocab, 7 + p), 200);
        int rounds = 0;
        // bf16 weights and KV; the verify's GEMM (more than 8 rows) rounds activations differently from the
        // decode GEMV, so flips are allowed below a 2e-2 relative margin and states agree to bf16 rounding
        spec_run(name, cfg.vocab, spec_be, ar, 11 + p, &worst, &rounds, 2e-2f, 5e-2);
        total += rounds;
        most = std::max(most, rounds);
    }
    printf("%s: %d verify rounds on the GPU == AR greedy over 5 prompts (longest run %d, each to its first near-tie), "
           "worst state difference %.2e\n", name, total, most, worst);
    CHECK(total >= 16, "%s: only %d rounds compared", name, total);
}

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// A DDTree-shaped tree of B + 1 rows: root, the top-1 chain to depth min(B, 15), then siblings of the chain
// nodes best-first (depth 1 first), each a new row.
VerifyRequest ddtree_like(int B, int len, int vocab) {
    VerifyRequest r;
    std::vector<int> depth{0};
    r.tokens.push_back(1);
    r.parents.push_back(-1);
    const int chain = std::min(B, 15);
    for (int d = 1; d <= chain; ++d) { r.tokens.push_back((d * 7919) % vocab); r.parents.push_back(d - 1); depth.push_back(d); }
    for (int i = chain, k = 0; i < B; ++i, ++k) {
        const int at = k % chain;  // sibling of chain node at + 1: child of chain node `at`
        r.tokens.push_back((i * 104729) % vocab);
        r.parents.push_back(at);
        depth.push_back(depth[size_t(at)] + 1);
    }
    for (int d : depth) r.positions.push_back(len + d);
    return r;
}

void timing() {
    auto t0 = std::chrono::steady_clock::now();
    lbtest::MemCheckpoint src(k08b, 5);
    const ModelConfig cfg = config_from_source(src);
    printf("synthetic Qwen3.5-0.8B (random weights, full shape) built in %.1f s\n",
           std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    const int ctx = 512, max_ctx = 1024, reps = 20;
    const std::vector<int> prompt = random_prompt(ctx, cfg.vocab, 3);
    // The ar engine's backend: its decode step (fused graph), timed over 64 steps.
    double ar_step_ms = 0;
    {
        auto be = make_gpu_backend(0);
        be->load(src, cfg, nullptr);
        be->allocate(max_ctx, DType::BF16, DType::BF16);
        std::vector<double> per_step;
        for (int r = 0; r < 5; ++r) {
            be->reset();
            std::vector<int> out{be->forward(prompt.data(), ctx, nullptr)};
            be->synchronize();
            be->timer_start();
            be->decode(64, [](int) { return false; }, &out);
            per_step.push_back(be->timer_stop_ms() / 64);
        }
        ar_step_ms = median(per_step);
    }
    GpuVerifyBackend be;
    be.load(src, cfg, nullptr);
    be.allocate(max_ctx, DType::BF16, DType::BF16);
    be.forward(prompt.data(), ctx, nullptr);
    std::vector<double> dec;
    for (int r = 0; r < reps + 3; ++r) {
        be.set_length(ctx);
        be.timer_start();
        be.decode_only(prompt[size_t(r)]);
        const double ms = be.timer_stop_ms();
        if (r >= 3) dec.push_back(ms);
    }
    be.set_length(ctx);
    const double step_ms = median(dec);
    printf("context %d: ar decode step (fused graph) %.3f ms; forward_layers n=1 %.3f ms (medians)\n", ctx, ar_step_ms, step_ms);
    printf("| B | rows | verify ms | / ar decode step | / forward_layers n=1 | append forward of as many rows, ms |\n|---|---|---|---|---|---|\n");
    for (int B : {1, 8, 16, 22, 32, 64}) {
        const VerifyRequest req = ddtree_like(B, ctx, cfg.vocab);
        const int n = be.upload_rows(req);
        std::vector<double> ts;
        for (int r = 0; r < reps + 3; ++r) {
            be.timer_start();
            be.verify_only(n);
            const double ms = be.timer_stop_ms();
            if (r >= 3) ts.push_back(ms);
        }
        const double v = median(ts);
        std::vector<double> fs;
        for (int r = 0; r < reps + 3; ++r) {
            be.set_length(ctx);
            be.timer_start();
            be.append_only(req.tokens);
            const double ms = be.timer_stop_ms();
            if (r >= 3) fs.push_back(ms);
        }
        be.set_length(ctx);
        printf("| %d | %d | %.3f | %.2f | %.2f | %.3f |\n", B, n, v, v / ar_step_ms, v / step_ms, median(fs));
    }
    printf("per piece, ms (medians of 10): | B | tree_attention, one layer | delta_tree, one layer | LM head + argmax, all rows |\n");
    for (int B : {1, 22, 64}) {
        const VerifyRequest req = ddtree_like(B, ctx, cfg.vocab);
        const int n = be.upload_rows(req);
        be.verify_only(n);
        double a = 0, d = 0, h = 0;
        be.time_parts(n, &a, &d, &h);
        printf("| %d | %.3f | %.3f | %.3f |\n", B, a, d, h);
    }
    printf("commit state kept per verify row: %zu bytes\n", gpu::VerifyWorkspace::commit_bytes_per_row(cfg));
}

}  // namespace

int main(int argc, char** argv) {
    gpuDeviceProp p;
    GPU_CHECK(gpuGetDeviceProperties(&p, 0));
    printf("device: %s\n", p.name);
    exactness("qwen3.5 tiny", kTiny, 1);
    exactness("qwen3.5 odd", kOdd, 2);
    if (argc > 1 && std::string(argv[1]) == "--time") timing();
    if (failures()) { printf("%d check(s) failed\n", failures()); return 1; }
    printf("GPU verify checks passed\n");
    return 0;
}
