// The GPU backend (CUDA, or HIP through gpu_compat.h): the forward pass of ../cpu/cpu_backend.cpp as a
// sequence of kernels on one stream. Decode steps (one token) are captured once as a graph and replayed.
// The decode graph uses the fused one-token kernels (gpu_ops.h, "fused decode"): 4 kernels per DeltaNet
// layer (in-projection + conv, delta rule, gated norm + out-projection, MLP), 5 per attention layer
// (qkv, prep, attention, o_proj, MLP), plus embed, LM head and finish: 105 a token for Qwen3.5-0.8B. Norms
// sit inside the GEMVs, the LM head's argmax in its epilogue, and sm_90+ uses programmatic dependent launch.
// The MLP is one kernel (gpu::mlp_fused: gate/up and down over a transposed down_proj, the output summed in
// a fixed-point accumulator that the next layer's in-projection reads and its out-projection folds into the
// residual); the fused_mlp knob at 0 (LB_GPU_FUSED_MLP=0, ../tuning.h) selects the gate_up + down GEMVs (5 / 6
// kernels a layer, 129 a token). CUDA only by default; HIP opts in with LB_GPU_FUSED_MLP=1. Shapes the fused
// kernels do not handle take the unfused sequence.
// Qwen3 dense layers (LayerKind::Attention: no output gate) take the same prefill kernels with the gate off;
// the fused decode kernels read Qwen3.5's gated layout, so a model with such layers decodes through the
// captured layer sequence (forward_layers for one token, also one graph launch a step), as does a model that
// keeps GGUF blocks; both graphs read the token from d_next_ and leave the next there and in host_ring_, so
// that decode() queues steps ahead of the token the host reads either way.
// Prefill runs in chunks of Tuning::prefill_chunk tokens, so a 128K-token prompt needs the activations of
// one chunk; forward_scored (PFlash importance) scores the last chunk's tail rows (tail_scores.cu).
// Verify + commit (backend.h) run verify_forward.h's layer sequence on the same caches. The ops' limits and
// scratch are this backend's gpu::DeviceContext, bound in every entry point, so two backends (two models) in
// one process share nothing.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "../backend.h"
#include "../tuning.h"
#include "../half.h"
#include "../verify_plan.h"
#include "gpu_ops.h"
#include "qwen35_forward.h"
#include "verify_forward.h"

namespace lb {
namespace {

using gpu::wtype;

class GpuBackend : public Qwen35Backend {
public:
    explicit GpuBackend(int device) : ctx_(device), device_(device) {
        gpu::ContextScope bind(ctx_);
        GPU_CHECK(gpuSetDevice(device));
        GPU_CHECK(gpuStreamCreate(&s_));
        GPU_CHECK(gpuEventCreate(&ev0_));
        GPU_CHECK(gpuEventCreate(&ev1_));
        GPU_CHECK(gpuEventCreate(&commit_ev_));
        GPU_CHECK(gpuEventRecord(commit_ev_, s_));
        for (gpuEvent_t& e : step_ev_) GPU_CHECK(gpuEventCreate(&e));
        GPU_CHECK(gpuMallocHost((void**)&host_ring_, sizeof(int) * kRing));
        GPU_CHECK(gpuMalloc(&d_pos_, sizeof(int)));
        GPU_CHECK(gpuMalloc(&d_next_, sizeof(int)));
        GPU_CHECK(gpuMalloc(&d_key_, sizeof(unsigned long long)));
        gpu::decode_setup(device);
        // the fused decode graph's stages (the unfused kernel for a stage whose knob is off)
        fused_attn_ = tuning().fused_attn;
        fused_delta_ = tuning().fused_delta;
        want_delta_out_ = tuning().delta_out;
#if defined(__HIPCC__) || defined(LB_USE_HIP)
        want_fused_mlp_ = tuning().fused_mlp == 1;  // not yet run on an AMD GPU: opt-in
#else
        want_fused_mlp_ = tuning().fused_mlp != 0;
#endif
    }
    ~GpuBackend() override {
        for (gpuGraphExec_t g : graph_exec_)
            if (g) (void)gpuGraphExecDestroy(g);
        for (void* p : allocations_) (void)gpuFree(p);
        if (d_key_) (void)gpuFree(d_key_);
        if (host_ring_) (void)gpuFreeHost(host_ring_);
        if (host_commit_) (void)gpuFreeHost(host_commit_);
        for (gpuEvent_t e : step_ev_) (void)gpuEventDestroy(e);
        (void)gpuEventDestroy(commit_ev_);
    }

    std::string name() const override { return LB_GPU_NAME; }
    DeviceInfo device() const override {
        gpuDeviceProp p;
        GPU_CHECK(gpuGetDeviceProperties(&p, device_));
        return DeviceInfo{p.name, device_, uint64_t(p.totalGlobalMem)};
    }
    // GGUF blocks kept (quant_): "gguf(<types of the matrices>)", e.g. gguf(q4_k,q6_k,bf16) where bf16 is the
    // weight type the file's f32/f16/bf16 matrices took.
    std::string weight_dtype() const override { return quant_ ? "gguf(" + quant_types_ + ")" : LB_WTYPE_NAME; }

    void load(const TensorSource& src, const Qwen35Config& cfg, LoadStats* stats) override {
        gpu::ContextScope bind(ctx_);
        cfg_ = cfg;
        Uploader up = [this](std::vector<float>&& data, int64_t rows, int64_t cols, bool matrix) {
            Mat m{nullptr, rows, cols};
            if (matrix) {
                std::vector<wtype> conv(data.size());
                for (size_t i = 0; i < data.size(); ++i) conv[i] = wtype(data[i]);
                m.ptr = alloc(conv.size() * sizeof(wtype));
                GPU_CHECK(gpuMemcpy(m.ptr, conv.data(), conv.size() * sizeof(wtype), gpuMemcpyHostToDevice));
                matrix_bytes_ += conv.size() * sizeof(wtype);
                weight_bytes_ += conv.size() * sizeof(wtype);
            } else {
                m.ptr = alloc(data.size() * sizeof(float));
                weight_bytes_ += data.size() * sizeof(float);
                GPU_CHECK(gpuMemcpy(m.ptr, data.data(), data.size() * sizeof(float), gpuMemcpyHostToDevice));
            }
            return m;
        };
        // GGUF blocks stay as stored (the knob gpu_quant): each run of rows uploaded in its type, f32/f16/bf16 runs
        // converted to wtype. The fused decode kernels read wtype only, so a model with blocks decodes through
        // the unfused kernel sequence (still one graph a step).
        QuantUploader qup = [this](std::vector<RawRows>&& parts, int64_t rows, int64_t cols, bool tiled_cols) {
            Mat m{nullptr, rows, cols};
            m.tiled_cols = tiled_cols;
            for (RawRows& p : parts) {
                Mat part{nullptr, p.rows, cols};
                part.dtype = p.dtype;
                if (!gpu::quant_type_ok(p.dtype)) {
                    std::vector<float> f(size_t(p.rows * cols));
                    decode_row(p.dtype, p.bytes.data(), f.data(), f.size());
                    std::vector<wtype> conv(f.size());
                    for (size_t i = 0; i < f.size(); ++i) conv[i] = wtype(f[i]);
                    p.bytes.assign((const uint8_t*)conv.data(), (const uint8_t*)(conv.data() + conv.size()));
                    part.dtype = gpu::kWtypeDType;
                }
                part.ptr = alloc(p.bytes.size());
                GPU_CHECK(gpuMemcpy(part.ptr, p.bytes.data(), p.bytes.size(), gpuMemcpyHostToDevice));
                matrix_bytes_ += p.bytes.size();
                weight_bytes_ += p.bytes.size();
                if (quant_types_.find(dtype_name(part.dtype)) == std::string::npos)
                    quant_types_ += std::string(quant_types_.empty() ? "" : ",") + dtype_name(part.dtype);
                m.parts.push_back(std::move(part));
            }
            quant_ = true;
            if (m.parts.size() == 1) {  // one type: the Mat itself
                Mat one = m.parts[0];
                one.tiled_cols = tiled_cols;
                return one;
            }
            return m;
        };
        // Qwen3.5 (gated attention + DeltaNet) and Qwen3 dense (plain attention) layers both run here.
        w_ = load_weights(src, cfg, up, stats, tuning().gpu_quant ? &qup : nullptr);
        embed_bytes_ = mat_bytes(w_.embed);
        // Fused MLP: a transposed copy of each down_proj ([I, H]: a block's slice of the intermediate is
        // contiguous rows). Prefill keeps reading `down`. Not counted in matrix_bytes_: decode reads down_t
        // instead of down, so the bytes a token streams (decode_bytes) stay the same.
        const int H = cfg.hidden, I = cfg.intermediate;
        ungated_ = false;
        for (int l = 0; l < cfg.n_layers; ++l) ungated_ = ungated_ || cfg.kinds[size_t(l)] == LayerKind::Attention;
        mlp_fused_ = want_fused_mlp_ && !ungated_ && !quant_ && gpu::mlp_fused_ok(H, I);
        for (const Qwen35Layer& L : w_.layers)
            if (L.down.rows != H || L.down.cols != I) mlp_fused_ = false;
        if (mlp_fused_) {
            down_t_.assign(w_.layers.size(), nullptr);
            for (size_t l = 0; l < w_.layers.size(); ++l) {
                down_t_[l] = (wtype*)alloc(size_t(H) * I * sizeof(wtype));
                weight_bytes_ += size_t(H) * I * sizeof(wtype);
                gpu::transpose(W(w_.layers[l].down), H, I, down_t_[l], s_);
            }
            // DeltaNet layers: the delta step and its out-projection in one kernel (LB_GPU_DELTA_OUT=0: two), its
            // output left in one of two more accumulators after mlp_acc_ (run_decode's protocol)
            delta_out_ = want_delta_out_ && fused_delta_ && cfg.n_full_layers() < cfg.n_layers &&
                         gpu::delta_out_ok(H, cfg.lin_k_dim, cfg.lin_v_dim, cfg.lin_k_heads, cfg.lin_v_heads);
            for (const Qwen35Layer& L : w_.layers)
                if (!L.full && (L.out_proj.rows != H || L.out_proj.cols != cfg.lin_value_dim())) delta_out_ = false;
            mlp_acc_ = (unsigned long long*)alloc(sizeof(unsigned long long) * size_t(n_acc()) * H);
            GPU_CHECK(gpuMemsetAsync(mlp_acc_, 0, sizeof(unsigned long long) * size_t(n_acc()) * H, s_));
            if (delta_out_) {
                const size_t n = size_t(cfg.n_layers) * cfg.lin_v_heads;
                delta_counters_ = (unsigned*)alloc(sizeof(unsigned) * n);
                GPU_CHECK(gpuMemsetAsync(delta_counters_, 0, sizeof(unsigned) * n, s_));
            }
            GPU_CHECK(gpuStreamSynchronize(s_));
        }
    }

    void allocate(int max_ctx, DType kv_k, DType kv_v) override {
        gpu::ContextScope bind(ctx_);
        max_ctx_ = max_ctx;
        kt_ = kv_k;
        vt_ = kv_v;
        const int hd = cfg_.head_dim;
        if ((kt_ == DType::Q8_0 || kt_ == DType::Q4_0 || vt_ == DType::Q8_0 || vt_ == DType::Q4_0) && hd % QK != 0)
            fail("unsupported", "quantised KV cache needs head_dim a multiple of 32");
        const size_t krow = dtype_row_bytes(kt_, size_t(hd)), vrow = dtype_row_bytes(vt_, size_t(hd));
        kc_.assign(size_t(cfg_.n_layers), nullptr);
        vc_.assign(size_t(cfg_.n_layers), nullptr);
        ssm_.assign(size_t(cfg_.n_layers), nullptr);
        conv_.assign(size_t(cfg_.n_layers), nullptr);
        for (int l = 0; l < cfg_.n_layers; ++l) {
            if (cfg_.is_full[size_t(l)]) {
                kc_[size_t(l)] = alloc(size_t(max_ctx) * cfg_.n_kv_heads * krow);
                vc_[size_t(l)] = alloc(size_t(max_ctx) * cfg_.n_kv_heads * vrow);
            } else {
                ssm_[size_t(l)] = (float*)alloc(sizeof(float) * size_t(cfg_.lin_v_heads) * cfg_.lin_k_dim * cfg_.lin_v_dim);
                conv_[size_t(l)] = (float*)alloc(sizeof(float) * size_t(cfg_.conv_dim()) * (cfg_.conv_kernel - 1));
            }
        }
        // fused decode: which shapes it handles, attention split scratch
        const int H = cfg_.hidden, I = cfg_.intermediate, vd = cfg_.lin_value_dim();
        fused_ = !ungated_ && !quant_ && gpu::gemv_fused_ok(H, gpu::GV_RMSNORM, 0) &&
                 (mlp_fused_ || gpu::gemv_fused_ok(I, gpu::GV_SILU, 0)) &&
                 (cfg_.n_full_layers() == 0 || (gpu::gemv_fused_ok(cfg_.n_heads * hd, gpu::GV_PLAIN, 0) &&
                                                 gpu::attention_decode_ok(cfg_.n_heads, cfg_.n_kv_heads, hd))) &&
                 (cfg_.n_full_layers() == cfg_.n_layers ||
                  (gpu::gemv_fused_ok(vd, gpu::GV_GATED, cfg_.lin_v_dim) && cfg_.conv_kernel <= 8 &&
                   cfg_.lin_v_heads % cfg_.lin_k_heads == 0));
        attn_short_ctx_ = fused_ && fused_attn_ && cfg_.n_full_layers() > 0
                              ? gpu::attn_decode_short_ctx(cfg_.n_heads, cfg_.n_kv_heads, hd, cfg_.rope_dims, kt_, vt_)
                              : 0;
        ensure_workspace(1);  // with the attention split's scratch, which the fused decode's flash-decoding uses
        reset();
    }

    void reset() override {
        len_ = 0;
        have_next_ = false;
        pending_n_ = 0;
        for (int l = 0; l < cfg_.n_layers; ++l) {
            if (ssm_[size_t(l)]) GPU_CHECK(gpuMemsetAsync(ssm_[size_t(l)], 0, sizeof(float) * size_t(cfg_.lin_v_heads) * cfg_.lin_k_dim * cfg_.lin_v_dim, s_));
            if (conv_[size_t(l)]) GPU_CHECK(gpuMemsetAsync(conv_[size_t(l)], 0, sizeof(float) * size_t(cfg_.conv_dim()) * (cfg_.conv_kernel - 1), s_));
        }
        GPU_CHECK(gpuMemsetAsync(d_pos_, 0, sizeof(int), s_));
        sparse_ran_ = false;
        if (bs_.stats) GPU_CHECK(gpuMemsetAsync(bs_.stats, 0, 2 * sizeof(unsigned long long), s_));
    }
    int length() const override { return len_; }

    int forward(const int* tokens, int n, std::vector<float>* last_logits) override {
        return run_forward(tokens, n, last_logits, 0, nullptr);
    }

    int forward_scored(const int* tokens, int n, int n_tail, TailScores* scores) override {
        if (n_tail < 1 || n_tail > n)
            fail("bad_request", "scored forward: " + std::to_string(n_tail) + " tail rows of a " + std::to_string(n) + "-row forward");
        return run_forward(tokens, n, nullptr, n_tail, scores);
    }

    void set_block_sparse(int from, float alpha, float budget) override {
        if (from < 0 || !(alpha > 0.f && alpha <= 1.f) || !(budget > 0.f && budget <= 1.f))
            fail("bad_request", "block-sparse attention: from >= 0, 0 < alpha <= 1, 0 < budget <= 1");
        sparse_from_ = from;
        bs_.alpha = alpha;
        bs_.budget = budget;
    }

    double block_sparse_read_fraction() override {
        if (!sparse_ran_) return -1.0;
        gpu::ContextScope bind(ctx_);
        unsigned long long st[2] = {0, 0};
        GPU_CHECK(gpuMemcpyAsync(st, bs_.stats, sizeof st, gpuMemcpyDeviceToHost, s_));
        GPU_CHECK(gpuStreamSynchronize(s_));
        return st[1] ? double(st[0]) / double(st[1]) : -1.0;
    }

    // forward() and forward_scored(): n tokens in chunks of at most prefill_chunk (the last chunk holds
    // the n_tail scored rows, when scoring).
    int run_forward(const int* tokens, int n, std::vector<float>* last_logits, int n_tail, TailScores* scores) {
        gpu::ContextScope bind(ctx_);
        if (n < 1) fail("bad_request", "forward of no tokens");
        if (len_ + n > max_ctx_)
            fail("context_overflow", "forward of " + std::to_string(n) + " tokens at length " + std::to_string(len_) +
                                         " exceeds max_ctx " + std::to_string(max_ctx_));
        stop_event_ = nullptr;
        pending_n_ = 0;
        if (n == 1 && !scores && (fused_ || !last_logits)) {
            launch_step(tokens[0], !next_holds(tokens[0]), len_);
        } else {
            const int ctx = len_ + n;
            int chunk = tuning().prefill_chunk > 0 ? std::max(tuning().prefill_chunk, n_tail) : n;
            ensure_workspace(std::min(chunk, n));
            std::function<void(int, const float*, int, int)> score;
            if (scores) score = scorer(n_tail, ctx, scores);
            const gpu::BlockSparse* sparse = sparse_from_ > 0 && ctx >= sparse_from_ ? sparse_for(chunk, ctx) : nullptr;
            sparse_ran_ = sparse_ran_ || sparse != nullptr;
            for (int a = 0, m = 0; a < n; a += m) {
                m = std::min(chunk, n - a);
                if (scores && n - a - m > 0 && n - a - m < n_tail) m = n - a - n_tail;  // the tail in one chunk
                GPU_CHECK(gpuMemcpyAsync(ws_.tokens, tokens + a, sizeof(int) * size_t(m), gpuMemcpyHostToDevice, s_));
                run_layers(ws_.tokens, m, a + m == n ? score : nullptr, sparse, len_ + a);
            }
            if (scores) {
                GPU_CHECK(gpuMemcpyAsync(scores->probs.data(), probs_, sizeof(float) * scores->probs.size(),
                                         gpuMemcpyDeviceToHost, s_));
            }
        }
        GPU_CHECK(gpuGetLastError());
        int next = 0;
        GPU_CHECK(gpuMemcpyAsync(&next, d_next_, sizeof(int), gpuMemcpyDeviceToHost, s_));
        if (last_logits) {
            last_logits->resize(size_t(cfg_.vocab));
            GPU_CHECK(gpuMemcpyAsync(last_logits->data(), ws_.logits, sizeof(float) * size_t(cfg_.vocab), gpuMemcpyDeviceToHost, s_));
        }
        GPU_CHECK(gpuStreamSynchronize(s_));
        len_ += n;
        last_next_ = next;
        have_next_ = true;
        return next;
    }

    // Decode with the step graph: up to kInFlight steps queued ahead of the one whose token the host
    // reads, so that the GPU does not idle through each token's stream wait and graph launch. Each step's
    // last kernel writes its token into host_ring_ (pinned memory, slot = the step's position), and the
    // step records an event; the host takes the tokens in order and stops at the first that stop()
    // accepts. Steps already queued past it still run (their tokens are dropped; length() counts them),
    // and timer_stop_ms() ends at the stop step's event. No copy runs between two graph launches: a
    // 4-byte device-to-host copy there kept the next step waiting on the copy engine.
    void decode(int n_steps, const std::function<bool(int)>& stop, std::vector<int>* out) override {
        if (n_steps <= 0) return Qwen35Backend::decode(n_steps, stop, out);
        gpu::ContextScope bind(ctx_);
        pending_n_ = 0;
        static_assert(kRing > kInFlight, "the ring holds every step in flight");
        stop_event_ = nullptr;
        const volatile int* ring = host_ring_;  // written by the GPU
        int launched = 0, taken = 0;
        while (taken < n_steps) {
            for (; launched < n_steps && launched - taken < kInFlight; ++launched) {
                // the first step's token is uploaded unless d_next_ already holds it; later steps read the
                // token their predecessor left in d_next_
                launch_step(out->back(), launched == 0 && !next_holds(out->back()), len_ + launched);
                GPU_CHECK(gpuEventRecord(step_ev_[launched % kInFlight], s_));
            }
            gpuEvent_t ev = step_ev_[taken % kInFlight];
            GPU_CHECK(gpuEventSynchronize(ev));  // the step's kernels, and so its host write, are complete
            const int tok = ring[(len_ + taken++) & (kRing - 1)];
            out->push_back(tok);
            if (stop(tok)) {
                stop_event_ = ev;  // not recorded again: no launch follows the stop
                break;
            }
        }
        GPU_CHECK(gpuGetLastError());
        if (launched > taken) GPU_CHECK(gpuStreamSynchronize(s_));  // steps past the stop: their tokens too
        last_next_ = ring[(len_ + launched - 1) & (kRing - 1)];     // what d_next_ holds now
        len_ += launched;
        have_next_ = true;
    }


    // Verify forward (backend.h): gpu::verify_layers (verify_forward.h) over the rows, the committed sequence
    // read only. Argmax is taken on the device for every row; logits, top-k and features are copied back
    // for the rows asked (top-k log-probs computed on the host from those logits).
    void verify(const VerifyRequest& req, VerifyResult* out) override {
        gpu::ContextScope bind(ctx_);
        const int n = int(req.tokens.size());
        pending_n_ = 0;
        VerifyPlan plan = plan_verify(req, cfg_, len_, max_ctx_);
        const std::vector<int>& parent = plan.parent;
        const std::vector<uint8_t>& visible = plan.visible;
        const std::vector<int>& out_rows = plan.out_rows;
        vws_.ensure(cfg_, n, [this](size_t bytes) { return alloc(bytes); });
        GPU_CHECK(gpuMemcpyAsync(vws_.tokens, req.tokens.data(), sizeof(int) * size_t(n), gpuMemcpyHostToDevice, s_));
        GPU_CHECK(gpuMemcpyAsync(vws_.positions, req.positions.data(), sizeof(int) * size_t(n), gpuMemcpyHostToDevice, s_));
        GPU_CHECK(gpuMemcpyAsync(vws_.parent, parent.data(), sizeof(int) * size_t(n), gpuMemcpyHostToDevice, s_));
        GPU_CHECK(gpuMemcpyAsync(vws_.visible, visible.data(), visible.size(), gpuMemcpyHostToDevice, s_));
        // Feature layers: each distinct layer's [n, hidden] rows land in its slot of feat_.
        const size_t H = size_t(cfg_.hidden);
        std::vector<int> slot_of(size_t(cfg_.n_layers), -1);
        int slots = 0;
        for (int l : req.feature_layers) if (slot_of[size_t(l)] < 0) slot_of[size_t(l)] = slots++;
        std::vector<float*> feature_dst;
        if (slots > 0) {
            const size_t floats = size_t(slots) * n * H;
            if (floats > feat_cap_) { feat_ = (float*)alloc(sizeof(float) * floats); feat_cap_ = floats; }
            feature_dst.assign(size_t(cfg_.n_layers), nullptr);
            for (int l = 0; l < cfg_.n_layers; ++l)
                if (slot_of[size_t(l)] >= 0) feature_dst[size_t(l)] = feat_ + size_t(slot_of[size_t(l)]) * n * H;
        }
        gpu::verify_layers(cfg_, w_, vws_, vcaches(), len_, n, s_, feature_dst);
        GPU_CHECK(gpuGetLastError());

        *out = VerifyResult{};
        const size_t V = size_t(cfg_.vocab), R = out_rows.size();
        std::vector<int> argmax(static_cast<size_t>(n));
        GPU_CHECK(gpuMemcpyAsync(argmax.data(), vws_.argmax, sizeof(int) * size_t(n), gpuMemcpyDeviceToHost, s_));
        std::vector<float> logits;
        if (req.want_logits || req.top_k > 0) {
            logits.resize(R * V);
            for (size_t i = 0; i < R; ++i)
                GPU_CHECK(gpuMemcpyAsync(&logits[i * V], vws_.logits + size_t(out_rows[i]) * V, sizeof(float) * V,
                                         gpuMemcpyDeviceToHost, s_));
        }
        std::vector<float> feats;
        if (slots > 0 && !req.features_on_device) {
            feats.resize(size_t(slots) * n * H);
            GPU_CHECK(gpuMemcpyAsync(feats.data(), feat_, sizeof(float) * feats.size(), gpuMemcpyDeviceToHost, s_));
        }
        GPU_CHECK(gpuStreamSynchronize(s_));
        for (int r : out_rows) out->argmax.push_back(argmax[size_t(r)]);
        if (req.features_on_device) out->device_features = slots > 0 ? feat_ : nullptr;
        for (size_t i = 0; i < R && slots > 0 && !req.features_on_device; ++i)
            for (int l : req.feature_layers) {
                const float* src = &feats[(size_t(slot_of[size_t(l)]) * n + size_t(out_rows[i])) * H];
                out->features.insert(out->features.end(), src, src + H);
            }
        for (size_t i = 0; i < R && req.top_k > 0; ++i)
            append_top_k(&logits[i * V], int(V), req.top_k, &out->top_ids, &out->top_logprobs);
        if (req.want_logits) out->logits = std::move(logits);
        pending_n_ = n;
        pending_parent_ = std::move(plan.parent);
        pending_positions_ = req.positions;
    }

    // Commit (backend.h): gpu::commit_path (KV rows compacted, DeltaNet and conv state set to the last row's).
    void commit(const std::vector<int>& path) override {
        gpu::ContextScope bind(ctx_);
        check_commit_path(path, pending_n_, pending_parent_, pending_positions_, len_);
        const int m = int(path.size());
        // The new length and the path go up from pinned memory, and the commit is not waited for: whatever
        // runs next is on this stream (the caller's next forward or verify, or the draft's context rows).
        // The staging is rewritten once the stream has passed the last commit's uploads (commit_ev_; a
        // verify, which waits for the stream, comes between two commits).
        GPU_CHECK(gpuEventSynchronize(commit_ev_));
        if (size_t(m) + 1 > host_commit_cap_) {
            if (host_commit_) GPU_CHECK(gpuFreeHost(host_commit_));
            host_commit_cap_ = std::max<size_t>(size_t(m) + 1, 64);
            GPU_CHECK(gpuMallocHost((void**)&host_commit_, sizeof(int) * host_commit_cap_));
        }
        host_commit_[0] = len_ + m;
        std::copy(path.begin(), path.end(), host_commit_ + 1);
        if (m > 0) {
            GPU_CHECK(gpuMemcpyAsync(vws_.path, host_commit_ + 1, sizeof(int) * path.size(), gpuMemcpyHostToDevice, s_));
            gpu::commit_path(cfg_, vws_, vcaches(), len_, m, s_);
        }
        len_ += m;
        GPU_CHECK(gpuMemcpyAsync(d_pos_, host_commit_, sizeof(int), gpuMemcpyHostToDevice, s_));
        GPU_CHECK(gpuEventRecord(commit_ev_, s_));
        GPU_CHECK(gpuGetLastError());
        pending_n_ = 0;
        have_next_ = false;  // d_next_ holds no argmax of the committed sequence's last token
    }

    void export_state(SequenceState* out) const override {
        GPU_CHECK(gpuStreamSynchronize(s_));
        const int hd = cfg_.head_dim, nkv = cfg_.n_kv_heads;
        const size_t krow = dtype_row_bytes(kt_, size_t(hd)), vrow = dtype_row_bytes(vt_, size_t(hd));
        out->length = len_;
        out->k.assign(size_t(cfg_.n_layers), {});
        out->v.assign(size_t(cfg_.n_layers), {});
        out->recurrent.assign(size_t(cfg_.n_layers), {});
        out->conv.assign(size_t(cfg_.n_layers), {});
        for (int l = 0; l < cfg_.n_layers; ++l) {
            const size_t li = size_t(l);
            if (cfg_.is_attention(l)) {
                std::vector<uint8_t> kb(size_t(len_) * nkv * krow), vb(size_t(len_) * nkv * vrow);
                GPU_CHECK(gpuMemcpy(kb.data(), kc_[li], kb.size(), gpuMemcpyDeviceToHost));
                GPU_CHECK(gpuMemcpy(vb.data(), vc_[li], vb.size(), gpuMemcpyDeviceToHost));
                out->k[li].resize(size_t(len_) * nkv * hd);
                out->v[li].resize(size_t(len_) * nkv * hd);
                for (size_t r = 0; r < size_t(len_) * nkv; ++r) {
                    decode_row(kt_, &kb[r * krow], &out->k[li][r * hd], size_t(hd));
                    decode_row(vt_, &vb[r * vrow], &out->v[li][r * hd], size_t(hd));
                }
            } else {
                out->recurrent[li].resize(state_elems());
                out->conv[li].resize(conv_elems());
                GPU_CHECK(gpuMemcpy(out->recurrent[li].data(), ssm_[li], sizeof(float) * state_elems(), gpuMemcpyDeviceToHost));
                GPU_CHECK(gpuMemcpy(out->conv[li].data(), conv_[li], sizeof(float) * conv_elems(), gpuMemcpyDeviceToHost));
            }
        }
    }

    DeviceHead device_head() override {
        DeviceHead h;
        h.stream = (void*)s_;
        h.device = device_;
        h.embed = [this](const int* d_tokens, int n, float* d_x) {
            gpu::ContextScope bind(ctx_);
            gpu::embed(d_tokens, n, w_.embed, d_x, s_);  // bf16 or GGUF blocks
        };
        h.lm_head = [this](const float* d_x, int n, float* d_logits) {
            gpu::ContextScope bind(ctx_);
            gpu::matmul(d_x, n, w_.lm_head, d_logits, false, s_);
        };
        return h;
    }

    MemoryReport memory() const override {
        MemoryReport m;
        m.weights = weight_bytes_;
        const size_t krow = dtype_row_bytes(kt_, size_t(cfg_.head_dim)), vrow = dtype_row_bytes(vt_, size_t(cfg_.head_dim));
        for (int l = 0; l < cfg_.n_layers; ++l) {
            if (cfg_.is_attention(l))
                m.kv_cache += uint64_t(max_ctx_) * cfg_.n_kv_heads * (krow + vrow);
            else
                m.recurrent_state += sizeof(float) * (state_elems() + conv_elems());
        }
        m.verify_bytes_per_node = gpu::VerifyWorkspace::commit_bytes_per_row(cfg_);
        m.max_verify_rows = max_ctx_;  // rows use the KV cache's tail; the workspace grows per verify
        return m;
    }

    void timer_start() override {
        stop_event_ = nullptr;
        GPU_CHECK(gpuEventRecord(ev0_, s_));
    }
    double timer_stop_ms() override {
        GPU_CHECK(gpuEventRecord(ev1_, s_));
        GPU_CHECK(gpuEventSynchronize(ev1_));
        float ms = 0;
        GPU_CHECK(gpuEventElapsedTime(&ms, ev0_, stop_event_ ? stop_event_ : ev1_));
        stop_event_ = nullptr;
        return ms;
    }
    void synchronize() override { GPU_CHECK(gpuStreamSynchronize(s_)); }
    uint64_t peak_mem_bytes() const override { return allocated_; }
    uint64_t decode_bytes(int ctx) const override {
        if (quant_) {  // the matrices as stored, less the (untied) embedding table, plus the token's row of it
            const uint64_t streamed = matrix_bytes_ - (cfg_.tied ? 0 : embed_bytes_) + embed_bytes_ / uint64_t(cfg_.vocab);
            return qwen35_decode_bytes(cfg_, streamed, 0, kt_, vt_, ctx);
        }
        return qwen35_decode_bytes(cfg_, qwen35_streamed_weight_bytes(cfg_, matrix_bytes_, sizeof(wtype)), 0, kt_,
                                   vt_, ctx);
    }

private:
    size_t state_elems() const { return size_t(cfg_.lin_v_heads) * cfg_.lin_k_dim * cfg_.lin_v_dim; }
    size_t conv_elems() const { return size_t(cfg_.conv_dim()) * (cfg_.conv_kernel - 1); }
    gpu::VerifyCaches vcaches() { return gpu::VerifyCaches{kc_, vc_, kt_, vt_, ssm_, conv_}; }

    // Whether the step graph's input, d_next_, already holds `token`: the previous step's argmax, as read back.
    bool next_holds(int token) const { return have_next_ && token == last_next_; }

    // One step of the single-token graph (captured at first use) on the stream. The graph embeds the token
    // in d_next_, where the previous step left its argmax, so a greedy loop uploads nothing.
    // upload: copy `token` into d_next_ first. pos: the step's
    // position (the tokens already in the caches): up to a context of attn_short_ctx_ the step runs the graph
    // whose attention layers take the short-context kernel, beyond it the flash-decoding one.
    void launch_step(int token, bool upload, int pos) {
        if (upload) GPU_CHECK(gpuMemcpyAsync(d_next_, &token, sizeof(int), gpuMemcpyHostToDevice, s_));
        const bool short_attn = pos + 1 <= attn_short_ctx_;  // 0 unless the fused graph takes the kernel
        gpuGraphExec_t& exec = graph_exec_[short_attn ? 1 : 0];
        if (!exec) {
            gpuGraph_t graph;
            GPU_CHECK(gpuStreamBeginCapture(s_, gpuStreamCaptureModeThreadLocal));
            if (fused_)
                run_decode(d_next_, short_attn);
            else
                run_layers(d_next_, 1, nullptr, nullptr, 0, host_ring_);
            GPU_CHECK(gpuStreamEndCapture(s_, &graph));
            GPU_CHECK(gpuGraphInstantiate(&exec, graph));
            (void)gpuGraphDestroy(graph);
        }
        GPU_CHECK(gpuGraphLaunch(exec, s_));
    }

    void* alloc(size_t bytes) {
        void* p = nullptr;
        GPU_CHECK(gpuMalloc(&p, std::max<size_t>(bytes, 16)));
        allocations_.push_back(p);
        allocated_ += bytes;
        return p;
    }
    static const wtype* W(const Mat& m) { return (const wtype*)m.ptr; }
    static uint64_t mat_bytes(const Mat& m) {
        // a Mat of the Uploader path keeps the default F32 tag and holds wtype
        if (m.parts.empty())
            return m.dtype == DType::F32 ? uint64_t(m.rows) * m.cols * sizeof(wtype)
                                         : dtype_row_bytes(m.dtype, size_t(m.cols)) * uint64_t(m.rows);
        uint64_t b = 0;
        for (const Mat& p : m.parts) b += mat_bytes(p);
        return b;
    }
    static const float* F(const Mat& m) { return (const float*)m.ptr; }

    gpu::ForwardWorkspace ws_;

    void ensure_workspace(int n) {
        // Buffers only grow; the captured decode graph uses the n = 1 slice of them, so it is recaptured.
        if (n <= ws_.cap) return;
        for (gpuGraphExec_t& g : graph_exec_)
            if (g) { (void)gpuGraphExecDestroy(g); g = nullptr; }
        ws_.ensure(cfg_, n, [this](size_t bytes) { return alloc(bytes); });
    }

    // host_ring: the unfused decode graph's (gpu::ForwardCaches::host_ring)
    void run_layers(const int* d_tokens, int n, std::function<void(int, const float*, int, int)> score = nullptr,
                    const gpu::BlockSparse* sparse = nullptr, int pos0 = 0, int* host_ring = nullptr) {
        gpu::ForwardCaches c{kc_, vc_, kt_, vt_, ssm_, conv_, d_pos_};
        c.score = std::move(score);
        c.sparse = sparse;
        c.pos0 = pos0;
        c.host_ring = host_ring;
        c.ring_mask = kRing - 1;
        gpu::forward_layers(cfg_, w_, ws_, c, d_tokens, n, d_next_, s_);
    }

    // The block-sparse scratch for chunks of up to `chunk` rows in a sequence of ctx tokens (buffers only grow);
    // the forward's last 2 key blocks of rows attend densely.
    const gpu::BlockSparse* sparse_for(int chunk, int ctx) {
        gpu::BlockSparse want;
        want.size_for(chunk, cfg_.n_heads, cfg_.n_kv_heads, cfg_.head_dim, ctx);
        if (want.tiles_ints > bs_.tiles_ints) {
            bs_.tiles = (int*)alloc(sizeof(int) * want.tiles_ints);
            bs_.tiles_ints = want.tiles_ints;
        }
        if (want.counts_ints > bs_.counts_ints) {
            bs_.counts = (int*)alloc(sizeof(int) * want.counts_ints);
            bs_.counts_ints = want.counts_ints;
        }
        if (want.kmean_floats > bs_.kmean_floats) {
            bs_.kmean = (float*)alloc(sizeof(float) * want.kmean_floats);
            bs_.kmean_floats = want.kmean_floats;
        }
        if (!bs_.stats) {
            bs_.stats = (unsigned long long*)alloc(2 * sizeof(unsigned long long));
            GPU_CHECK(gpuMemsetAsync(bs_.stats, 0, 2 * sizeof(unsigned long long), s_));
        }
        bs_.rows = want.rows;
        bs_.max_tiles = want.max_tiles;
        bs_.dense_from = ctx - 256;
        return &bs_;
    }

    // A scored forward's hook (ForwardCaches::score): sizes *scores and the device buffers for a sequence of
    // ctx tokens, and returns the call that scores each attention layer's last n_tail rows into probs_.
    std::function<void(int, const float*, int, int)> scorer(int n_tail, int ctx, TailScores* scores) {
        *scores = TailScores{};
        scores->n_tail = n_tail;
        scores->ctx = ctx;
        for (int l = 0; l < cfg_.n_layers; ++l)
            if (cfg_.is_attention(l)) scores->layers.push_back(l);
        scores->probs.assign(scores->layers.size() * size_t(n_tail) * ctx, 0.f);
        const size_t scratch = gpu::tail_scores_scratch(n_tail, cfg_.n_heads, cfg_.head_dim, ctx);
        if (scores->probs.size() > probs_cap_) {
            probs_ = (float*)alloc(sizeof(float) * scores->probs.size());
            probs_cap_ = scores->probs.size();
        }
        if (scratch > score_scratch_cap_) {
            score_scratch_ = (float*)alloc(sizeof(float) * scratch);
            score_scratch_cap_ = scratch;
        }
        return [this, n_tail, ctx](int l, const float* qkv, int ld, int n) {
            int slot = 0;
            for (int j = 0; j < l; ++j) slot += cfg_.is_attention(j);
            gpu::tail_scores(qkv + size_t(n - n_tail) * ld, ld, cfg_.gated(l), n_tail, cfg_.n_heads, cfg_.n_kv_heads,
                             cfg_.head_dim, cfg_.rope_dims, cfg_.rope_theta, kc_[size_t(l)], kt_, ctx, score_scratch_,
                             probs_ + size_t(slot) * n_tail * ctx, s_);
        };
    }

    // One token through the fused decode kernels (captured into the decode graph). short_attn: attention
    // layers run attn_decode_short (attn_prep folded in) instead of attn_prep + attention_decode.
    // Fused MLP (mlp_fused_): layer l's MLP output stays in mlp_acc_ (fixed point) instead of x. Protocol:
    //   embed_decode      x = embedding row, acc = 0 (the previous token's LM head read acc, nothing folded it)
    //   layer l > 0       in-projection normalises x + acc; out-projection x = (x + acc) + Wx, acc = 0
    //                     (between the two only the mixer runs: attn_prep / attention or the delta rule,
    //                     none reads x or acc); layer 0 passes neither (acc is 0)
    //   every layer's MLP reads x (complete), adds into acc (zero on entry)
    //   LM head           normalises x + acc of the last layer
    // With delta_out_, a DeltaNet layer's mixer (delta_out: no block owns a whole output row) adds its output
    // into mix[l % 2] instead of x, and it stays pending there:
    //   DeltaNet l        delta_out: x = (x + acc) + pending, acc = pending = 0 (each block its rows), mix[l % 2]
    //                     += Wo; pending = mix[l % 2] (zero on entry: layer l - 1's mixer folded it)
    //   attention l       out-projection: x = ((x + acc) + pending) + Wx, acc = pending = 0; pending = none
    //   in-projection, LM head normalise x + acc + pending; the MLP reads x + pending, adds into acc
    // Every kernel reads these only after its dependency wait, and each waits for the one before it.
    void run_decode(const int* d_token, bool short_attn) {
        const int H = cfg_.hidden, I = cfg_.intermediate;
        unsigned long long* acc = mlp_fused_ ? mlp_acc_ : nullptr;
        unsigned long long* mix[2] = {delta_out_ ? mlp_acc_ + H : nullptr, delta_out_ ? mlp_acc_ + 2 * H : nullptr};
        unsigned long long* pending = nullptr;  // a DeltaNet mixer output not yet folded into x (delta_out_)
        gpu::embed_decode(d_token, W(w_.embed), H, ws_.x, d_key_, acc, n_acc(), s_);
        auto gemv = [&](int pro, int epi, const float* x, int in, const Mat& m, int out, float* y) {
            gpu::FusedGemv a;
            a.pro = pro; a.epi = epi; a.x = x; a.in = in; a.W = W(m); a.out = out; a.y = y; a.eps = cfg_.eps;
            return a;
        };
        for (int l = 0; l < cfg_.n_layers; ++l) {
            const Qwen35Layer& L = w_.layers[size_t(l)];
            unsigned long long* prev_mlp = l > 0 ? acc : nullptr;  // the previous layer's MLP output, if fused
            if (L.full) {
                const int nh = cfg_.n_heads, nkv = cfg_.n_kv_heads, hd = cfg_.head_dim, rows = cfg_.attn_qkv_rows();
                gpu::FusedGemv a = gemv(gpu::GV_RMSNORM, gpu::GV_STORE, ws_.x, H, L.attn_qkv, rows, ws_.big);
                a.gain = F(L.input_norm);
                a.acc = prev_mlp;
                a.acc2 = pending;
                gpu::gemv_fused(a, s_);
                if (short_attn) {
                    gpu::attn_decode_short(ws_.big, nh, nkv, cfg_.rope_dims, cfg_.rope_theta, F(L.q_norm), F(L.k_norm),
                                           cfg_.eps, d_pos_, kc_[size_t(l)], vc_[size_t(l)], ws_.o, s_);
                } else {
                    gpu::attn_prep(ws_.big, rows, 1, nh, nkv, hd, cfg_.rope_dims, cfg_.rope_theta, F(L.q_norm),
                                   F(L.k_norm), cfg_.eps, d_pos_, kc_[size_t(l)], kt_, vc_[size_t(l)], vt_, s_);
                    if (fused_attn_)
                        gpu::attention_decode(ws_.big, nh, nkv, hd, d_pos_, kc_[size_t(l)], kt_, vc_[size_t(l)], vt_,
                                              ws_.attn.decode_blocks, ws_.attn.part, ws_.attn.counters, ws_.o, s_);
                    else
                        gpu::attention(ws_.big, rows, 1, nh, nkv, hd, d_pos_, kc_[size_t(l)], kt_, vc_[size_t(l)], vt_,
                                       ws_.o, s_);
                }
                a = gemv(gpu::GV_PLAIN, gpu::GV_ADD, ws_.o, nh * hd, L.o_proj, H, ws_.x);
                a.fold = prev_mlp;
                a.fold2 = pending;
                gpu::gemv_fused(a, s_);
                pending = nullptr;
            } else {
                const int rows = cfg_.lin_in_rows(), cd = cfg_.conv_dim(), vd = cfg_.lin_value_dim();
                const int hk = cfg_.lin_k_heads, hv = cfg_.lin_v_heads, dk = cfg_.lin_k_dim, dv = cfg_.lin_v_dim;
                gpu::FusedGemv a = gemv(gpu::GV_RMSNORM, gpu::GV_CONV, ws_.x, H, L.lin_in, rows, ws_.big);
                a.gain = F(L.input_norm);
                a.acc = prev_mlp;
                a.acc2 = pending;
                a.conv_rows = cd; a.conv_k = cfg_.conv_kernel; a.conv_w = F(L.conv_w);
                a.conv_state = conv_[size_t(l)]; a.conv_out = ws_.conv;
                gpu::gemv_fused(a, s_);
                if (delta_out_) {
                    gpu::DeltaOut d;
                    d.conv = ws_.conv; d.proj = ws_.big; d.z_off = cd; d.b_off = cd + vd;
                    d.negA = F(L.neg_A); d.dt_bias = F(L.dt_bias); d.gain = F(L.ssm_norm); d.eps = cfg_.eps;
                    d.hk = hk; d.hv = hv; d.H = H; d.state = ssm_[size_t(l)]; d.W = W(L.out_proj);
                    d.acc = mix[l % 2]; d.x = ws_.x; d.fold_a = prev_mlp; d.fold_b = pending;
                    d.counters = delta_counters_ + size_t(l) * hv;
                    gpu::delta_out(d, s_);
                    pending = mix[l % 2];
                } else {
                    if (fused_delta_ && gpu::delta_decode_ok(dk, dv)) {
                        gpu::delta_decode(ws_.conv, ws_.big, cd + vd, F(L.neg_A), F(L.dt_bias), hk, hv, dk, dv,
                                          ssm_[size_t(l)], ws_.o, s_);
                    } else {
                        gpu::deltanet_prep(ws_.conv, cd, ws_.big, rows, cd + vd, F(L.neg_A), F(L.dt_bias), 1, hk, dk,
                                           hv, ws_.g, ws_.beta, s_);
                        gpu::delta_rule(ws_.conv, cd, 1, hk, hv, dk, dv, ws_.g, ws_.beta, ssm_[size_t(l)], ws_.o, s_);
                    }
                    a = gemv(gpu::GV_GATED, gpu::GV_ADD, ws_.o, vd, L.out_proj, H, ws_.x);
                    a.gain = F(L.ssm_norm); a.z = ws_.big + cd; a.head_dim = dv;
                    a.fold = prev_mlp;
                    gpu::gemv_fused(a, s_);
                }
            }
            if (acc) {
                gpu::FusedMlp m;
                m.x = ws_.x; m.gain = F(L.post_norm); m.eps = cfg_.eps;
                m.gate_up = W(L.gate_up); m.down_t = down_t_[size_t(l)]; m.acc = acc; m.H = H; m.I = I;
                m.x_acc = pending;
                gpu::mlp_fused(m, s_);
            } else {
                gpu::FusedGemv a = gemv(gpu::GV_RMSNORM, gpu::GV_STORE, ws_.x, H, L.gate_up, 2 * I, ws_.big);
                a.gain = F(L.post_norm);
                gpu::gemv_fused(a, s_);
                gpu::gemv_fused(gemv(gpu::GV_SILU, gpu::GV_ADD, ws_.big, I, L.down, H, ws_.x), s_);
            }
        }
        gpu::FusedGemv a = gemv(gpu::GV_RMSNORM, gpu::GV_ARGMAX, ws_.x, H, w_.lm_head, cfg_.vocab, ws_.logits);
        a.gain = F(w_.final_norm);
        a.acc = cfg_.n_layers > 0 ? acc : nullptr;
        a.acc2 = pending;
        a.key = d_key_;
        gpu::gemv_fused(a, s_);
        gpu::decode_finish(d_key_, d_next_, d_pos_, host_ring_, kRing - 1, s_);
    }

    gpu::DeviceContext ctx_;  // the ops' limits and scratch (gpu_ops.h), this backend's alone: bound in every entry point
    int device_;
    gpuStream_t s_;
    gpuEvent_t ev0_, ev1_;
    int *d_pos_ = nullptr, *d_next_ = nullptr;
    unsigned long long* d_key_ = nullptr;
    bool fused_ = false, fused_attn_ = true, fused_delta_ = true;
    bool ungated_ = false;  // some layer is a Qwen3 (ungated) attention layer: no fused decode graph
    int sparse_from_ = 0;   // set_block_sparse: forwards reaching this many tokens run block-sparse attention
    gpu::BlockSparse bs_;   // its settings and scratch
    bool sparse_ran_ = false;  // a forward since reset() ran block-sparse attention (bs_.stats counts its tiles)
    float *probs_ = nullptr, *score_scratch_ = nullptr;  // forward_scored: [layers, n_tail, ctx] and the kernels'
    size_t probs_cap_ = 0, score_scratch_cap_ = 0;       // scratch (floats; they only grow)
    bool want_fused_mlp_ = true, mlp_fused_ = false;  // Tuning::fused_mlp; whether decode uses it (set at load)
    std::vector<wtype*> down_t_;                  // fused MLP: down_proj transposed, [I, H] a layer
    unsigned long long* mlp_acc_ = nullptr;       // fused MLP: output accumulator [H], 2^-32 fixed point,
                                                  // then (delta_out_) the DeltaNet mixers' two: [n_acc() * H]
    int n_acc() const { return delta_out_ ? 3 : 1; }
    bool quant_ = false;           // some matrix keeps GGUF blocks (set at load): the unfused decode sequence
    std::string quant_types_;      // their element types, for weight_dtype()
    uint64_t embed_bytes_ = 0;     // the embedding table as stored
    bool want_delta_out_ = true, delta_out_ = false;  // Tuning::delta_out; whether decode uses it (set at load)
    unsigned* delta_counters_ = nullptr;              // delta_out: [n_layers, hv] state-use counters
    int last_next_ = 0;
    bool have_next_ = false;
    static constexpr int kInFlight = 2;  // decode(): graph steps queued ahead of the token being read
    gpuEvent_t step_ev_[kInFlight] = {};
    static constexpr int kRing = 64;     // host_ring_ slots (a power of two)
    int* host_ring_ = nullptr;           // pinned: decode_finish writes step p's token to [p % kRing]
    int* host_commit_ = nullptr;         // pinned: commit's new length, then its path
    gpuEvent_t commit_ev_;               // recorded after commit's uploads from host_commit_
    size_t host_commit_cap_ = 0;
    gpuEvent_t stop_event_ = nullptr;    // decode() stopped early: timer_stop_ms() ends here
    gpuGraphExec_t graph_exec_[2] = {};  // the decode step's graph: [0] flash-decoding attention, [1] short context
    int attn_short_ctx_ = 0;             // contexts up to this take graph_exec_[1] (gpu::attn_decode_short_ctx)
    Qwen35Config cfg_;
    Qwen35Weights w_;
    std::vector<void*> allocations_;
    uint64_t allocated_ = 0, matrix_bytes_ = 0, weight_bytes_ = 0;
    gpu::VerifyWorkspace vws_;               // the verify forward's rows and what commit reads
    float* feat_ = nullptr;                  // verify: feature layers' rows, [slots, n, hidden]
    size_t feat_cap_ = 0;                    // floats
    int pending_n_ = 0;                      // rows of the last verify, until commit or another forward
    std::vector<int> pending_parent_, pending_positions_;
    int max_ctx_ = 0, len_ = 0;
    DType kt_ = DType::BF16, vt_ = DType::BF16;
    std::vector<void*> kc_, vc_;
    std::vector<float*> ssm_, conv_;
};

}  // namespace

std::unique_ptr<Qwen35Backend> make_gpu_backend(int device) { return std::make_unique<GpuBackend>(device); }

}  // namespace lb
