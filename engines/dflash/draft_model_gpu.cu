// The DFlash draft on the GPU (draft_model_gpu.h): DraftModelCpu::add_context / forward_block / logits
// (draft_model.cpp) step for step, with the core's GPU ops. Per layer the block runs one fused q/k/v
// projection ([q_proj; k_proj; v_proj]); the context rows run its k/v rows only. The block's K/V go to the
// cache rows after the context (attn_prep_tree writes them there), where draft_attention reads context and
// block rows as one range; they are overwritten by the next block or by new context rows, never kept. A layer
// without a sliding window at a long context takes the split form instead (gpu::attention_split: key ranges
// of the context over the GPU, then the block's own rows under the layer's mask), as the target's verify does.
#include "dflash/draft_model_gpu.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "core/cuda/draft_ops.h"
#include "core/cuda/gpu_ops.h"
#include "core/cuda/verify_ops.h"

namespace lb::dflash {

using gpu::wtype;

struct DraftModelGpu::Impl {
    struct Layer {
        float *input_norm, *post_norm, *q_norm, *k_norm;
        wtype *wqkv, *wo, *gate_up, *down;  // wqkv = [q; k; v] rows, its k/v part starts at q rows
    };
    DeviceHead head;
    gpuStream_t s;
    gpu::DeviceContext ctx;
    DraftConfig cfg;
    std::vector<Layer> layers;
    wtype* fc = nullptr;
    float *hidden_norm = nullptr, *final_norm = nullptr;
    std::vector<void*> allocations;
    uint64_t weight_bytes = 0, cache_bytes = 0, buffer_bytes = 0;
    int max_ctx = 0, max_rows = 0, vocab = 0, n_ctx = 0;
    DType cache_type = DType::F32;
    std::vector<void*> kc, vc;  // per layer [max_ctx + block_size, nkv, hd] of cache_type
    int* positions = nullptr;    // 0, 1, 2, ...: rows' positions, and the identity row list
    int *block_tokens = nullptr, *rows = nullptr, *top_ids = nullptr;
    float *x = nullptr, *h = nullptr, *qkv = nullptr, *att = nullptr, *gu = nullptr, *act = nullptr, *feats = nullptr,
          *block_embed = nullptr, *hidden = nullptr, *logits = nullptr, *top_lp = nullptr;
    int* host_ids = nullptr;  // pinned
    float* host_lp = nullptr;
    int* host_rows = nullptr;  // pinned: add_verify_rows's row list [max_rows]
    gpuEvent_t rows_ev;        // recorded after the upload from host_rows
    gpu::AttnScratch attn;                // the split form's partials
    unsigned char* block_all = nullptr;   // [block_size, block_size] ones: a non-causal layer's block mask

    explicit Impl(const DeviceHead& hd) : head(hd), s(gpuStream_t(hd.stream)), ctx(hd.device) {
        gpu::ContextScope bind(ctx);
        gpu::decode_setup(hd.device);
        GPU_CHECK(gpuEventCreate(&rows_ev));
        GPU_CHECK(gpuEventRecord(rows_ev, s));
    }
    ~Impl() {
        for (void* p : allocations) (void)gpuFree(p);
        if (host_ids) (void)gpuFreeHost(host_ids);
        if (host_lp) (void)gpuFreeHost(host_lp);
        if (host_rows) (void)gpuFreeHost(host_rows);
        (void)gpuEventDestroy(rows_ev);
    }
    void* alloc(size_t bytes, uint64_t* count) {
        void* p = nullptr;
        GPU_CHECK(gpuMalloc(&p, std::max<size_t>(bytes, 16)));
        allocations.push_back(p);
        *count += bytes;
        return p;
    }
    float* upload_vector(const std::vector<float>& v) {
        float* d = (float*)alloc(v.size() * sizeof(float), &weight_bytes);
        GPU_CHECK(gpuMemcpy(d, v.data(), v.size() * sizeof(float), gpuMemcpyHostToDevice));
        return d;
    }
    // Matrices stacked row-wise into one device matrix of the GPU's weight type.
    wtype* upload_matrix(std::initializer_list<const std::vector<float>*> parts) {
        size_t n = 0;
        for (auto* p : parts) n += p->size();
        std::vector<wtype> conv(n);
        size_t o = 0;
        for (auto* p : parts)
            for (float f : *p) conv[o++] = wtype(f);
        wtype* d = (wtype*)alloc(n * sizeof(wtype), &weight_bytes);
        GPU_CHECK(gpuMemcpy(d, conv.data(), n * sizeof(wtype), gpuMemcpyHostToDevice));
        return d;
    }
};

DraftModelGpu::DraftModelGpu(const DeviceHead& head) : p_(std::make_unique<Impl>(head)) {}
DraftModelGpu::~DraftModelGpu() = default;
const DraftConfig& DraftModelGpu::config() const { return p_->cfg; }
uint64_t DraftModelGpu::weight_bytes() const { return p_->weight_bytes; }
uint64_t DraftModelGpu::context_cache_bytes() const { return p_->cache_bytes; }
uint64_t DraftModelGpu::buffer_bytes() const { return p_->buffer_bytes; }
int DraftModelGpu::context_length() const { return p_->n_ctx; }
void DraftModelGpu::reset() { p_->n_ctx = 0; }

void DraftModelGpu::truncate_context(int n) {
    if (n < 0 || n > p_->n_ctx) fail("internal", "draft context truncate to " + std::to_string(n) + " of " + std::to_string(p_->n_ctx));
    p_->n_ctx = n;
}

void DraftModelGpu::load(const TensorSource& src, const DraftConfig& cfg) {
    Impl& P = *p_;
    gpu::ContextScope bind(P.ctx);
    P.cfg = cfg;
    const int64_t H = cfg.hidden, hd = cfg.head_dim, qd = int64_t(cfg.n_heads) * hd, kvd = int64_t(cfg.n_kv_heads) * hd;
    const int64_t I = cfg.intermediate;
    uint64_t file_bytes = 0;
    auto read = [&](const std::string& name, std::vector<int64_t> shape) {
        return read_draft_tensor(src, name, std::move(shape), &file_bytes);
    };
    {
        const std::vector<float> fc = read("fc.weight", {H, cfg.feature_width()});
        P.fc = P.upload_matrix({&fc});
    }
    P.hidden_norm = P.upload_vector(read("hidden_norm.weight", {H}));
    P.final_norm = P.upload_vector(read("norm.weight", {H}));
    P.layers.assign(size_t(cfg.n_layers), {});
    for (int l = 0; l < cfg.n_layers; ++l) {
        const std::string pre = "layers." + std::to_string(l) + ".";
        Impl::Layer& L = P.layers[size_t(l)];
        L.input_norm = P.upload_vector(read(pre + "input_layernorm.weight", {H}));
        L.post_norm = P.upload_vector(read(pre + "post_attention_layernorm.weight", {H}));
        L.q_norm = P.upload_vector(read(pre + "self_attn.q_norm.weight", {hd}));
        L.k_norm = P.upload_vector(read(pre + "self_attn.k_norm.weight", {hd}));
        {
            const auto wq = read(pre + "self_attn.q_proj.weight", {qd, H});
            const auto wk = read(pre + "self_attn.k_proj.weight", {kvd, H});
            const auto wv = read(pre + "self_attn.v_proj.weight", {kvd, H});
            L.wqkv = P.upload_matrix({&wq, &wk, &wv});
        }
        {
            const auto wo = read(pre + "self_attn.o_proj.weight", {H, qd});
            L.wo = P.upload_matrix({&wo});
        }
        {
            const auto g = read(pre + "mlp.gate_proj.weight", {I, H});
            const auto u = read(pre + "mlp.up_proj.weight", {I, H});
            L.gate_up = P.upload_matrix({&g, &u});
        }
        {
            const auto d = read(pre + "mlp.down_proj.weight", {H, I});
            L.down = P.upload_matrix({&d});
        }
    }
}

void DraftModelGpu::allocate(int max_ctx, int max_add_rows, int vocab, DType cache_type) {
    Impl& P = *p_;
    gpu::ContextScope bind(P.ctx);
    const DraftConfig& c = P.cfg;
    if (cache_type != DType::F32 && cache_type != DType::BF16)
        fail("unsupported", std::string("draft context cache of ") + dtype_name(cache_type) + ": f32 or bf16 only");
    P.max_ctx = max_ctx;
    P.vocab = vocab;
    P.cache_type = cache_type;
    P.max_rows = std::max(max_add_rows, c.block_size);
    const size_t R = size_t(P.max_rows), H = size_t(c.hidden), B = size_t(c.block_size);
    const size_t qd = size_t(c.n_heads) * c.head_dim, kvd = size_t(c.n_kv_heads) * c.head_dim;
    const size_t rows = size_t(max_ctx) + B;
    uint64_t& n = P.buffer_bytes;
    P.kc.assign(size_t(c.n_layers), nullptr);
    P.vc.assign(size_t(c.n_layers), nullptr);
    for (int l = 0; l < c.n_layers; ++l) {
        P.kc[size_t(l)] = P.alloc(dtype_row_bytes(cache_type, rows * kvd), &P.cache_bytes);
        P.vc[size_t(l)] = P.alloc(dtype_row_bytes(cache_type, rows * kvd), &P.cache_bytes);
    }
    P.positions = (int*)P.alloc(sizeof(int) * rows, &n);
    std::vector<int> iota(rows);
    std::iota(iota.begin(), iota.end(), 0);
    GPU_CHECK(gpuMemcpy(P.positions, iota.data(), sizeof(int) * rows, gpuMemcpyHostToDevice));
    P.block_tokens = (int*)P.alloc(sizeof(int) * B, &n);
    std::vector<int> block(B, c.mask_token_id);
    GPU_CHECK(gpuMemcpy(P.block_tokens, block.data(), sizeof(int) * B, gpuMemcpyHostToDevice));
    P.rows = (int*)P.alloc(sizeof(int) * R, &n);
    P.x = (float*)P.alloc(4 * R * H, &n);
    P.h = (float*)P.alloc(4 * R * H, &n);
    P.qkv = (float*)P.alloc(4 * R * (qd + 2 * kvd), &n);
    P.att = (float*)P.alloc(4 * R * qd, &n);
    P.gu = (float*)P.alloc(4 * R * 2 * size_t(c.intermediate), &n);
    P.act = (float*)P.alloc(4 * R * size_t(c.intermediate), &n);
    P.feats = (float*)P.alloc(4 * R * size_t(c.feature_width()), &n);
    P.block_embed = (float*)P.alloc(4 * B * H, &n);
    P.hidden = (float*)P.alloc(4 * B * H, &n);
    P.logits = (float*)P.alloc(4 * B * size_t(vocab), &n);
    P.top_ids = (int*)P.alloc(sizeof(int) * B * gpu::kDraftTopKMax, &n);
    P.top_lp = (float*)P.alloc(sizeof(float) * B * gpu::kDraftTopKMax, &n);
    GPU_CHECK(gpuMallocHost((void**)&P.host_ids, sizeof(int) * B * gpu::kDraftTopKMax));
    GPU_CHECK(gpuMallocHost((void**)&P.host_lp, sizeof(float) * B * gpu::kDraftTopKMax));
    if (P.host_rows) GPU_CHECK(gpuFreeHost(P.host_rows));
    GPU_CHECK(gpuMallocHost((void**)&P.host_rows, sizeof(int) * R));
    P.attn = gpu::AttnScratch{};
    P.attn.floats = gpu::attention_scratch_floats(c.n_heads, c.n_kv_heads, c.head_dim);
    P.attn.part = (float*)P.alloc(sizeof(float) * P.attn.floats, &n);
    P.block_all = (unsigned char*)P.alloc(B * B, &n);
    GPU_CHECK(gpuMemset(P.block_all, 1, B * B));
    P.n_ctx = 0;
}

void DraftModelGpu::add_context(const float* d_features, int n) {
    Impl& P = *p_;
    if (n <= 0) return;
    if (n > P.max_rows) fail("internal", "draft add_context of " + std::to_string(n) + " rows (at most " + std::to_string(P.max_rows) + ")");
    if (P.n_ctx + n > P.max_ctx)
        fail("context_overflow", "draft context " + std::to_string(P.n_ctx + n) + " exceeds max_ctx " + std::to_string(P.max_ctx));
    gpu::ContextScope bind(P.ctx);
    const DraftConfig& c = P.cfg;
    const int H = c.hidden, hd = c.head_dim, nkv = c.n_kv_heads, qd = c.n_heads * hd, kvd = nkv * hd;
    gpu::matmul(d_features, n, c.feature_width(), P.fc, H, P.x, false, P.s);
    gpu::rmsnorm(P.x, P.hidden_norm, P.h, n, H, c.eps, P.s);
    for (int l = 0; l < c.n_layers; ++l) {
        const Impl::Layer& L = P.layers[size_t(l)];
        // k/v rows of the fused projection; no query heads: attn_prep_tree norms, rotates and stores K, V
        gpu::matmul(P.h, n, H, L.wqkv + size_t(qd) * H, 2 * kvd, P.qkv, false, P.s);
        gpu::attn_prep_tree(P.qkv, 2 * kvd, n, 0, nkv, hd, false, hd, c.rope_theta, nullptr, L.k_norm, c.eps,
                            P.positions + P.n_ctx, P.n_ctx, P.kc[size_t(l)], P.cache_type, P.vc[size_t(l)],
                            P.cache_type, P.s);
    }
    P.n_ctx += n;
}

void DraftModelGpu::add_verify_rows(const float* d_verify_features, int n_verify_rows, const std::vector<int>& rows) {
    Impl& P = *p_;
    gpu::ContextScope bind(P.ctx);
    const DraftConfig& c = P.cfg;
    for (size_t begin = 0; begin < rows.size(); begin += size_t(P.max_rows)) {
        const int m = int(std::min(rows.size() - begin, size_t(P.max_rows)));
        // from pinned memory (an upload from pageable memory may wait for the stream: the commit before it),
        // rewritten only once the stream has passed the last upload (rows_ev; in a decode loop long since)
        GPU_CHECK(gpuEventSynchronize(P.rows_ev));
        std::copy(rows.begin() + long(begin), rows.begin() + long(begin) + m, P.host_rows);
        GPU_CHECK(gpuMemcpyAsync(P.rows, P.host_rows, sizeof(int) * size_t(m), gpuMemcpyHostToDevice, P.s));
        GPU_CHECK(gpuEventRecord(P.rows_ev, P.s));
        gpu::gather_feature_rows(d_verify_features, n_verify_rows, c.n_features(), c.target_hidden, P.rows, m, P.feats, P.s);
        add_context(P.feats, m);
    }
}

void DraftModelGpu::forward_block(const float* d_block_embed, float* d_hidden_out) {
    Impl& P = *p_;
    gpu::ContextScope bind(P.ctx);
    const DraftConfig& c = P.cfg;
    const int n = c.block_size, H = c.hidden, hd = c.head_dim, nh = c.n_heads, nkv = c.n_kv_heads;
    const int qd = nh * hd, kvd = nkv * hd, I = c.intermediate, start = P.n_ctx, ld = qd + 2 * kvd;
    if (start + n > P.max_ctx + n) fail("context_overflow", "draft block past the context cache");
    GPU_CHECK(gpuMemcpyAsync(P.x, d_block_embed, sizeof(float) * size_t(n) * H, gpuMemcpyDeviceToDevice, P.s));
    if (c.input_embedding_scale != 1.f) gpu::scale(P.x, size_t(n) * H, c.input_embedding_scale, P.s);
    for (int l = 0; l < c.n_layers; ++l) {
        const Impl::Layer& L = P.layers[size_t(l)];
        gpu::rmsnorm(P.x, L.input_norm, P.h, n, H, c.eps, P.s);
        gpu::matmul(P.h, n, H, L.wqkv, ld, P.qkv, false, P.s);
        gpu::attn_prep_tree(P.qkv, ld, n, nh, nkv, hd, false, hd, c.rope_theta, L.q_norm, L.k_norm, c.eps,
                            P.positions + start, start, P.kc[size_t(l)], P.cache_type, P.vc[size_t(l)], P.cache_type,
                            P.s);
        const int window = c.sliding[size_t(l)] ? c.sliding_window : 0;
        const int splits = window == 0 ? gpu::attention_splits(n, nh, nkv, hd, ld, start) : 1;
        if (splits > 1)
            gpu::attention_split(P.qkv, ld, n, nh, nkv, hd, nullptr, start, P.kc[size_t(l)], P.cache_type,
                                 P.vc[size_t(l)], P.cache_type, c.causal[size_t(l)] ? nullptr : P.block_all, splits,
                                 P.attn, P.att, P.s, false);
        else
            gpu::draft_attention(P.qkv, ld, n, nh, nkv, hd, start, P.kc[size_t(l)], P.vc[size_t(l)], P.cache_type,
                                 c.causal[size_t(l)], window, P.att, P.s);
        gpu::matmul(P.att, n, qd, L.wo, H, P.x, true, P.s);
        gpu::rmsnorm(P.x, L.post_norm, P.h, n, H, c.eps, P.s);
        gpu::matmul(P.h, n, H, L.gate_up, 2 * I, P.gu, false, P.s);
        gpu::silu_mul(P.gu, n, I, P.act, P.s);
        gpu::matmul(P.act, n, I, L.down, H, P.x, true, P.s);
    }
    // Position 0 (the bonus token) predicts nothing: only rows 1.. are normed and returned.
    gpu::rmsnorm(P.x + H, P.final_norm, d_hidden_out, n - 1, H, c.eps, P.s);
}

std::vector<DepthCandidates> DraftModelGpu::propose(int bonus, int k) {
    Impl& P = *p_;
    const DraftConfig& c = P.cfg;
    const int D = c.block_size - 1, V = P.vocab;
    k = std::max(1, std::min(k, V));
    GPU_CHECK(gpuMemcpyAsync(P.block_tokens, &bonus, sizeof(int), gpuMemcpyHostToDevice, P.s));
    P.head.embed(P.block_tokens, c.block_size, P.block_embed);
    forward_block(P.block_embed, P.hidden);
    P.head.lm_head(P.hidden, D, P.logits);
    std::vector<DepthCandidates> depths(static_cast<size_t>(D));
    if (k <= gpu::kDraftTopKMax) {
        {
            gpu::ContextScope bind(P.ctx);
            gpu::draft_top_k(P.logits, D, V, k, c.output_multiplier, c.logit_softcap, P.top_ids, P.top_lp, P.s);
        }
        GPU_CHECK(gpuMemcpyAsync(P.host_ids, P.top_ids, sizeof(int) * size_t(D) * k, gpuMemcpyDeviceToHost, P.s));
        GPU_CHECK(gpuMemcpyAsync(P.host_lp, P.top_lp, sizeof(float) * size_t(D) * k, gpuMemcpyDeviceToHost, P.s));
        GPU_CHECK(gpuStreamSynchronize(P.s));
        GPU_CHECK(gpuGetLastError());
        for (int d = 0; d < D; ++d) {
            depths[size_t(d)].tokens.assign(P.host_ids + size_t(d) * k, P.host_ids + size_t(d + 1) * k);
            depths[size_t(d)].logprobs.assign(P.host_lp + size_t(d) * k, P.host_lp + size_t(d + 1) * k);
        }
        return depths;
    }
    // A wide top-K: the logits come to the host (the CPU path's own arithmetic after the LM head).
    std::vector<float> logits(size_t(D) * V);
    GPU_CHECK(gpuMemcpyAsync(logits.data(), P.logits, sizeof(float) * logits.size(), gpuMemcpyDeviceToHost, P.s));
    GPU_CHECK(gpuStreamSynchronize(P.s));
    for (float& z : logits) {
        z *= c.output_multiplier;
        if (c.logit_softcap > 0.f) z = std::tanh(z / c.logit_softcap) * c.logit_softcap;
    }
    for (int d = 0; d < D; ++d) depths[size_t(d)] = top_k_logprobs(&logits[size_t(d) * V], V, k);
    return depths;
}

}  // namespace lb::dflash
