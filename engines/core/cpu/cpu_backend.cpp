// The CPU backend: the forward pass of any model.h description composed from the reference operations
// in ops.h, fp32 throughout. This is the numerical reference the GPU backends are checked against.
// Everything it holds is a member of the backend object, so several models live in one process.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <fstream>
#include <numeric>
#include <thread>
#include <unistd.h>

#include "../backend.h"
#include "../errors.h"
#include "../verify_plan.h"
#include "ops.h"

namespace lb {
namespace {

// How the rows of one forward relate to the committed sequence.
struct Rows {
    int n = 0;
    bool verify = false;          // false: append (forward); true: verify rows after the committed length
    std::vector<int> positions;   // rotary position per row
    std::vector<int> parent;      // verify: parent row or -1
    std::vector<uint8_t> visible;  // verify: [n, n] ancestor-or-self mask
};

// What a verify keeps per DeltaNet layer for commit (row-major over the verify's rows).
struct RecurrentRows {
    std::vector<float> k, u, gamma, conv_in;  // [n, hk*dk], [n, hv*dv], [n, hv], [n, conv_dim]
};

class CpuBackend : public Backend {
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

    void load(const TensorSource& src, const ModelConfig& cfg, LoadStats* stats) override {
        cfg_ = cfg;
        Uploader up = [this](std::vector<float>&& data, int64_t rows, int64_t cols, bool matrix) {
            storage_.push_back(std::move(data));
            if (matrix) matrix_bytes_ += uint64_t(rows * cols) * 4;
            weight_bytes_ += uint64_t(rows * cols) * 4;
            return Mat{storage_.back().data(), rows, cols};
        };
        w_ = load_weights(src, cfg, up, stats);
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
        spec_.assign(size_t(cfg_.n_layers), {});
        for (int l = 0; l < cfg_.n_layers; ++l) {
            if (cfg_.is_attention(l)) {
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
        sparse_read_ = sparse_seen_ = 0;
        pending_.n = 0;
        for (auto& s : ssm_) std::fill(s.begin(), s.end(), 0.f);
        for (auto& c : conv_) std::fill(c.begin(), c.end(), 0.f);
    }

    int length() const override { return len_; }

    // Block-sparse attention as the GPU's (gpu::BlockSparse): the same rule (cpu::block_sparse_select) on the
    // GPU kernel's query tiles (128 / G rows), for measuring what it does to a trained drafter's scores on a
    // CPU. Per forward call: a call whose sequence reaches `from` runs it, its last 256 rows dense.
    void set_block_sparse(int from, float alpha, float budget) override {
        if (from < 0 || !(alpha > 0.f && alpha <= 1.f) || !(budget > 0.f && budget <= 1.f))
            fail("bad_request", "block-sparse attention: from >= 0, 0 < alpha <= 1, 0 < budget <= 1");
        sparse_from_ = from;
        sparse_.alpha = alpha;
        sparse_.budget = budget;
    }
    double block_sparse_read_fraction() override {
        return sparse_seen_ ? double(sparse_read_) / double(sparse_seen_) : -1.0;
    }

    int forward(const int* tokens, int n, std::vector<float>* last_logits) override {
        if (len_ + n > max_ctx_)
            fail("context_overflow", "forward of " + std::to_string(n) + " tokens at length " + std::to_string(len_) +
                                         " exceeds max_ctx " + std::to_string(max_ctx_));
        pending_.n = 0;
        Rows rows;
        rows.n = n;
        for (int t = 0; t < n; ++t) rows.positions.push_back(len_ + t);
        std::vector<float> x = run_layers(tokens, rows, {}, {}, nullptr);
        len_ += n;
        // Logits of the last position only: generation needs nothing else.
        std::vector<float> logits;
        const int next = head(&x[size_t(n - 1) * cfg_.hidden], &logits);
        if (last_logits) *last_logits = std::move(logits);
        return next;
    }

    int forward_scored(const int* tokens, int n, int n_tail, TailScores* scores) override {
        if (n_tail < 1 || n_tail > n)
            fail("bad_request", "scored forward: " + std::to_string(n_tail) + " tail rows of a " + std::to_string(n) + "-row forward");
        *scores = TailScores{};
        scores->n_tail = n_tail;
        scores->ctx = len_ + n;
        capture_ = scores;
        try {
            const int next = forward(tokens, n, nullptr);
            capture_ = nullptr;
            return next;
        } catch (...) {
            capture_ = nullptr;
            throw;
        }
    }

    void verify(const VerifyRequest& req, VerifyResult* out) override {
        pending_.n = 0;
        VerifyPlan plan = plan_verify(req, cfg_, len_, max_ctx_);
        Rows rows;
        rows.n = plan.n;
        rows.verify = true;
        rows.positions = req.positions;
        rows.parent = std::move(plan.parent);
        rows.visible = std::move(plan.visible);
        const std::vector<int>& out_rows = plan.out_rows;

        *out = VerifyResult{};
        std::vector<float> x = run_layers(req.tokens.data(), rows, out_rows, req.feature_layers, &out->features);
        const int V = cfg_.vocab;
        for (int r : out_rows) {
            std::vector<float> logits;
            out->argmax.push_back(head(&x[size_t(r) * cfg_.hidden], &logits));
            if (req.want_logits) out->logits.insert(out->logits.end(), logits.begin(), logits.end());
            if (req.top_k > 0) append_top_k(logits.data(), V, req.top_k, &out->top_ids, &out->top_logprobs);
        }
        pending_ = std::move(rows);
    }

    void commit(const std::vector<int>& path) override {
        check_commit_path(path, pending_.n, pending_.parent, pending_.positions, len_);
        const int m = int(path.size());
        for (int l = 0; l < cfg_.n_layers; ++l) {
            if (cfg_.is_attention(l)) {
                // Compact: the accepted rows' K/V move to contiguous slots (row i of the path to len + i).
                // Path rows are increasing, so moving in order never overwrites a row still to be read.
                uint8_t* kc = kcache_[size_t(l)].data();
                uint8_t* vc = vcache_[size_t(l)].data();
                const size_t kb = size_t(cfg_.n_kv_heads) * krow_, vb = size_t(cfg_.n_kv_heads) * vrow_;
                for (int i = 0; i < m; ++i) {
                    const size_t from = size_t(len_ + path[size_t(i)]), to = size_t(len_ + i);
                    if (from == to) continue;
                    memmove(kc + to * kb, kc + from * kb, kb);
                    memmove(vc + to * vb, vc + from * vb, vb);
                }
            } else {
                const RecurrentRows& s = spec_[size_t(l)];
                cpu::delta_rule_tree_commit(s.k.data(), s.u.data(), s.gamma.data(), cfg_.lin_k_heads, cfg_.lin_v_heads,
                                            cfg_.lin_k_dim, cfg_.lin_v_dim, path.data(), m, ssm_[size_t(l)].data());
                cpu::conv_state_commit(s.conv_in.data(), cfg_.conv_dim(), cfg_.conv_kernel, path.data(), m,
                                       conv_[size_t(l)].data());
            }
        }
        len_ += m;
        pending_.n = 0;
    }

    void truncate(int length) override {
        if (length < 0 || length > len_) fail("bad_request", "truncate to " + std::to_string(length) + " outside [0, " + std::to_string(len_) + "]");
        if (length != len_ && cfg_.has_recurrent())
            fail("unsupported", "a DeltaNet state cannot go back: use verify + commit to keep only accepted tokens");
        len_ = length;
        pending_.n = 0;
    }

    void export_state(SequenceState* out) const override {
        const int hd = cfg_.head_dim, nkv = cfg_.n_kv_heads;
        out->length = len_;
        out->k.assign(size_t(cfg_.n_layers), {});
        out->v.assign(size_t(cfg_.n_layers), {});
        out->recurrent = ssm_;
        out->conv = conv_;
        for (int l = 0; l < cfg_.n_layers; ++l) {
            if (!cfg_.is_attention(l)) continue;
            auto& k = out->k[size_t(l)];
            auto& v = out->v[size_t(l)];
            k.resize(size_t(len_) * nkv * hd);
            v.resize(size_t(len_) * nkv * hd);
            for (size_t r = 0; r < size_t(len_) * nkv; ++r) {
                decode_row(kt_, kcache_[size_t(l)].data() + r * krow_, &k[r * hd], size_t(hd));
                decode_row(vt_, vcache_[size_t(l)].data() + r * vrow_, &v[r * hd], size_t(hd));
            }
        }
    }

    MemoryReport memory() const override {
        MemoryReport m;
        m.weights = weight_bytes_;
        for (int l = 0; l < cfg_.n_layers; ++l) {
            m.kv_cache += kcache_[size_t(l)].size() + vcache_[size_t(l)].size();
            m.recurrent_state += (ssm_[size_t(l)].size() + conv_[size_t(l)].size()) * 4;
            if (!cfg_.is_attention(l))
                m.verify_bytes_per_node += uint64_t(cfg_.lin_key_dim() + cfg_.lin_value_dim() + cfg_.lin_v_heads + cfg_.conv_dim()) * 4;
        }
        m.max_verify_rows = max_ctx_;  // rows share the KV cache's tail; the rest is allocated per verify
        return m;
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
        return lb::decode_bytes(cfg_, streamed_weight_bytes(cfg_, matrix_bytes_, 4), 0, kt_, vt_, ctx);
    }
    std::string weight_dtype() const override { return "f32"; }

private:
    static const float* F(const Mat& m) { return (const float*)m.ptr; }

    // The decoder layers over `rows` (K/V written at cache rows len_ + t); returns the final residual
    // stream [n, hidden]. Features of `feature_layers` at `out_rows` are appended to *features.
    std::vector<float> run_layers(const int* tokens, const Rows& rows, const std::vector<int>& out_rows,
                                  const std::vector<int>& feature_layers, std::vector<float>* features) {
        const int H = cfg_.hidden, n = rows.n;
        std::vector<float> x(size_t(n) * H), h(size_t(n) * H), y(size_t(n) * H);
        for (int t = 0; t < n; ++t) {
            const float* e = F(w_.embed) + int64_t(tokens[t]) * H;
            std::copy(e, e + H, &x[size_t(t) * H]);
        }
        // features laid out [out row, feature layer, hidden]
        const size_t nf = feature_layers.size();
        if (features && nf) features->assign(out_rows.size() * nf * size_t(H), 0.f);
        for (int l = 0; l < cfg_.n_layers; ++l) {
            const LayerWeights& L = w_.layers[size_t(l)];
            cpu::rmsnorm(x.data(), F(L.input_norm), h.data(), n, H, cfg_.eps);
            if (L.full) attention(l, L, h.data(), rows, y.data());
            else delta_net(l, L, h.data(), rows, y.data());
            for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
            cpu::rmsnorm(x.data(), F(L.post_norm), h.data(), n, H, cfg_.eps);
            mlp(L, h.data(), n, y.data());
            for (size_t i = 0; i < x.size(); ++i) x[i] += y[i];
            for (size_t f = 0; f < nf; ++f)
                if (feature_layers[f] == l)
                    for (size_t r = 0; r < out_rows.size(); ++r)
                        std::copy(&x[size_t(out_rows[r]) * H], &x[size_t(out_rows[r] + 1) * H],
                                  &(*features)[(r * nf + f) * size_t(H)]);
        }
        return x;
    }

    // Final norm + LM head of one row: the greedy token, the logits in *logits.
    int head(const float* x, std::vector<float>* logits) {
        const int H = cfg_.hidden;
        std::vector<float> normed(static_cast<size_t>(H));
        logits->resize(size_t(cfg_.vocab));
        cpu::rmsnorm(x, F(w_.final_norm), normed.data(), 1, H, cfg_.eps);
        cpu::matmul(normed.data(), 1, H, F(w_.lm_head), cfg_.vocab, logits->data());
        return cpu::argmax(logits->data(), cfg_.vocab);
    }

    void attention(int l, const LayerWeights& L, const float* x, const Rows& rows, float* out) {
        const int n = rows.n;
        const int nh = cfg_.n_heads, nkv = cfg_.n_kv_heads, hd = cfg_.head_dim, H = cfg_.hidden;
        const bool gated = L.kind == LayerKind::GatedAttention;
        const int rows_qkv = cfg_.attn_qkv_rows(l);
        std::vector<float> qkv(size_t(n) * rows_qkv);
        cpu::matmul(x, n, H, F(L.attn_qkv), rows_qkv, qkv.data());
        std::vector<float> q(size_t(n) * nh * hd), gate(gated ? size_t(n) * nh * hd : 0), k(size_t(n) * nkv * hd), v(size_t(n) * nkv * hd);
        const int q_rows = (gated ? 2 : 1) * nh * hd;
        for (int t = 0; t < n; ++t) {
            const float* r = &qkv[size_t(t) * rows_qkv];
            if (gated) {
                for (int hh = 0; hh < nh; ++hh) {  // q_proj rows per head: [query (hd), gate (hd)]
                    std::copy(r + hh * 2 * hd, r + hh * 2 * hd + hd, &q[(size_t(t) * nh + hh) * hd]);
                    std::copy(r + hh * 2 * hd + hd, r + (hh + 1) * 2 * hd, &gate[(size_t(t) * nh + hh) * hd]);
                }
            } else {
                std::copy(r, r + nh * hd, &q[size_t(t) * nh * hd]);
            }
            std::copy(r + q_rows, r + q_rows + nkv * hd, &k[size_t(t) * nkv * hd]);
            std::copy(r + q_rows + nkv * hd, r + rows_qkv, &v[size_t(t) * nkv * hd]);
        }
        cpu::rmsnorm(q.data(), F(L.q_norm), q.data(), n * nh, hd, cfg_.eps);
        cpu::rmsnorm(k.data(), F(L.k_norm), k.data(), n * nkv, hd, cfg_.eps);
        std::vector<float> tail_q;  // a scored forward's tail queries, before RoPE
        if (capture_) tail_q.assign(q.end() - int64_t(capture_->n_tail) * nh * hd, q.end());
        cpu::rope_at(q.data(), n, nh, hd, cfg_.rope_dims, cfg_.rope_theta, rows.positions.data());
        cpu::rope_at(k.data(), n, nkv, hd, cfg_.rope_dims, cfg_.rope_theta, rows.positions.data());
        uint8_t* kc = kcache_[size_t(l)].data();
        uint8_t* vc = vcache_[size_t(l)].data();
        for (int t = 0; t < n; ++t)
            for (int j = 0; j < nkv; ++j) {
                const size_t r = size_t(len_ + t) * nkv + j;
                encode_row(kt_, &k[(size_t(t) * nkv + j) * hd], kc + r * krow_, size_t(hd));
                encode_row(vt_, &v[(size_t(t) * nkv + j) * hd], vc + r * vrow_, size_t(hd));
            }
        if (capture_) score_tail(l, tail_q, rows);
        std::vector<float> att(size_t(n) * nh * hd);
        if (rows.verify) cpu::tree_attention(q.data(), n, nh, nkv, hd, len_, kc, kt_, vc, vt_, rows.visible.data(), att.data());
        else if (sparse_from_ > 0 && len_ + n >= sparse_from_) sparse_attention(q.data(), n, kc, vc, att.data());
        else cpu::attention(q.data(), n, nh, nkv, hd, len_, kc, kt_, vc, vt_, att.data());
        if (gated) for (size_t i = 0; i < att.size(); ++i) att[i] *= cpu::sigmoid(gate[i]);
        cpu::matmul(att.data(), n, nh * hd, F(L.o_proj), H, out);
    }

    void sparse_attention(const float* q, int n, const uint8_t* kc, const uint8_t* vc, float* out) {
        const int nh = cfg_.n_heads, nkv = cfg_.n_kv_heads, hd = cfg_.head_dim, ctx = len_ + n;
        std::vector<float> K(size_t(ctx) * nkv * hd), V(K.size());
        for (int64_t r = 0; r < int64_t(ctx) * nkv; ++r) {
            decode_row(kt_, kc + r * krow_, &K[size_t(r) * hd], size_t(hd));
            decode_row(vt_, vc + r * vrow_, &V[size_t(r) * hd], size_t(hd));
        }
        cpu::SparseRule rule = sparse_;
        rule.dense_from = ctx - 256;
        const int rows = std::max(1, 128 / (nh / nkv));
        const auto tiles = cpu::block_sparse_select(q, n, nh, nkv, hd, rows, len_, K.data(), rule);
        for (size_t th = 0; th < tiles.size(); ++th) {
            sparse_read_ += tiles[th].size();
            sparse_seen_ += size_t((len_ + std::min(int(th / nkv) * rows + rows, n) - 1) / cpu::kSparseTile + 1);
        }
        cpu::block_sparse_attention(q, n, nh, nkv, hd, rows, len_, K.data(), V.data(), tiles, out);
    }

    // A scored forward's probabilities for layer l: the whole sequence's keys read back from the cache and
    // un-rotated to their pre-RoPE values (RoPE is a rotation; RoPE at -pos is its inverse).
    void score_tail(int l, const std::vector<float>& tail_q, const Rows& rows) {
        const int nkv = cfg_.n_kv_heads, hd = cfg_.head_dim, ctx = capture_->ctx, n_tail = capture_->n_tail;
        std::vector<float> K(size_t(ctx) * nkv * hd);
        for (int64_t r = 0; r < int64_t(ctx) * nkv; ++r)
            decode_row(kt_, kcache_[size_t(l)].data() + r * krow_, &K[size_t(r) * hd], size_t(hd));
        std::vector<int> back(static_cast<size_t>(ctx));
        for (int s = 0; s < ctx; ++s) back[size_t(s)] = -s;
        cpu::rope_at(K.data(), ctx, nkv, hd, cfg_.rope_dims, cfg_.rope_theta, back.data());
        const size_t at = capture_->probs.size();
        capture_->probs.resize(at + size_t(n_tail) * ctx);
        cpu::tail_attention_probs(tail_q.data(), rows.positions.data() + (rows.n - n_tail), n_tail, cfg_.n_heads, nkv,
                                  hd, K.data(), ctx, capture_->probs.data() + at);
        capture_->layers.push_back(l);
    }

    void delta_net(int l, const LayerWeights& L, const float* x, const Rows& rows, float* out) {
        const int n = rows.n;
        const int H = cfg_.hidden, hk = cfg_.lin_k_heads, hv = cfg_.lin_v_heads;
        const int dk = cfg_.lin_k_dim, dv = cfg_.lin_v_dim, kd = cfg_.lin_key_dim(), vd = cfg_.lin_value_dim();
        const int cd = cfg_.conv_dim(), nrows = cfg_.lin_in_rows();
        std::vector<float> proj(size_t(n) * nrows);
        cpu::matmul(x, n, H, F(L.lin_in), nrows, proj.data());
        // Split the fused projection: [qkv (cd) | z (vd) | b (hv) | a (hv)].
        std::vector<float> mixed(size_t(n) * cd), conv_out(size_t(n) * cd), z(size_t(n) * vd);
        std::vector<float> g(size_t(n) * hv), beta(size_t(n) * hv);
        const float* negA = F(L.neg_A);
        const float* dt = F(L.dt_bias);
        for (int t = 0; t < n; ++t) {
            const float* r = &proj[size_t(t) * nrows];
            std::copy(r, r + cd, &mixed[size_t(t) * cd]);
            std::copy(r + cd, r + cd + vd, &z[size_t(t) * vd]);
            for (int hh = 0; hh < hv; ++hh) {
                beta[size_t(t) * hv + hh] = cpu::sigmoid(r[cd + vd + hh]);
                g[size_t(t) * hv + hh] = negA[hh] * cpu::softplus(r[cd + vd + hv + hh] + dt[hh]);
            }
        }
        if (rows.verify)
            cpu::causal_conv1d_silu_tree(mixed.data(), n, cd, cfg_.conv_kernel, F(L.conv_w), conv_[size_t(l)].data(),
                                         rows.parent.data(), conv_out.data());
        else
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
        if (rows.verify) {
            RecurrentRows& s = spec_[size_t(l)];
            s.u.resize(size_t(n) * vd);
            s.gamma.resize(size_t(n) * hv);
            cpu::delta_rule_tree(q.data(), k.data(), v.data(), g.data(), beta.data(), n, hk, hv, dk, dv, rows.parent.data(),
                                 ssm_[size_t(l)].data(), o.data(), s.u.data(), s.gamma.data());
            s.k = std::move(k);
            s.conv_in = std::move(mixed);
        } else if (n == 1) {
            cpu::delta_rule_recurrent(q.data(), k.data(), v.data(), g.data(), beta.data(), n, hk, hv, dk, dv, ssm_[size_t(l)].data(), o.data());
        } else {
            cpu::delta_rule_chunked(q.data(), k.data(), v.data(), g.data(), beta.data(), n, hk, hv, dk, dv, ssm_[size_t(l)].data(), o.data());
        }
        std::vector<float> normed(size_t(n) * vd);
        cpu::gated_rmsnorm(o.data(), z.data(), F(L.ssm_norm), normed.data(), n * hv, dv, cfg_.eps);
        cpu::matmul(normed.data(), n, vd, F(L.out_proj), H, out);
    }

    void mlp(const LayerWeights& L, const float* x, int n, float* out) {
        const int H = cfg_.hidden, I = cfg_.intermediate;
        std::vector<float> gu(size_t(n) * 2 * I), act(size_t(n) * I);
        cpu::matmul(x, n, H, F(L.gate_up), 2 * I, gu.data());
        for (int t = 0; t < n; ++t)
            for (int i = 0; i < I; ++i)
                act[size_t(t) * I + i] = cpu::silu(gu[size_t(t) * 2 * I + i]) * gu[size_t(t) * 2 * I + I + i];
        cpu::matmul(act.data(), n, I, F(L.down), H, out);
    }

    ModelConfig cfg_;
    ModelWeights w_;
    std::deque<std::vector<float>> storage_;
    uint64_t matrix_bytes_ = 0, weight_bytes_ = 0;
    int max_ctx_ = 0, len_ = 0;
    DType kt_ = DType::BF16, vt_ = DType::BF16;
    size_t krow_ = 0, vrow_ = 0;
    std::vector<std::vector<uint8_t>> kcache_, vcache_;
    std::vector<std::vector<float>> ssm_, conv_;
    TailScores* capture_ = nullptr;     // set during a scored forward
    int sparse_from_ = 0;               // set_block_sparse
    cpu::SparseRule sparse_;
    size_t sparse_read_ = 0, sparse_seen_ = 0;  // since reset(): key tiles read / causal key tiles
    Rows pending_;                      // the last verify's rows, until commit or another forward
    std::vector<RecurrentRows> spec_;   // per DeltaNet layer: what commit needs from the last verify
    std::chrono::steady_clock::time_point t0_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace lb
