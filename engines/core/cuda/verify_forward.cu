#include "verify_forward.h"

#include <algorithm>

#include "qwen35_forward.h"

namespace lb::gpu {
namespace {
const float* F(const Mat& m) { return (const float*)m.ptr; }
}  // namespace

size_t VerifyWorkspace::commit_bytes_per_row(const ModelConfig& cfg) {
    size_t per_layer = size_t(cfg.lin_key_dim() + cfg.lin_value_dim() + cfg.lin_v_heads + cfg.conv_dim()) * 4;
    size_t n = 0;
    for (auto k : cfg.kinds) n += k == LayerKind::DeltaNet;
    return n * per_layer;
}

bool VerifyWorkspace::ensure(const ModelConfig& cfg, int n, const std::function<void*(size_t)>& alloc) {
    if (n <= cap) return false;
    const size_t H = size_t(cfg.hidden), N = size_t(n);
    size_t qkv_rows = 0;
    for (int l = 0; l < cfg.n_layers; ++l) if (cfg.is_attention(l)) qkv_rows = std::max(qkv_rows, size_t(cfg.attn_qkv_rows(l)));
    const size_t wide = std::max({size_t(cfg.lin_in_rows()), qkv_rows, 2 * size_t(cfg.intermediate)});
    cap = n;
    tokens = (int*)alloc(sizeof(int) * N);
    positions = (int*)alloc(sizeof(int) * N);
    parent = (int*)alloc(sizeof(int) * N);
    path = (int*)alloc(sizeof(int) * N);
    argmax = (int*)alloc(sizeof(int) * N);
    visible = (unsigned char*)alloc(N * N);
    x = (float*)alloc(4 * N * H);
    h = (float*)alloc(4 * N * H);
    big = (float*)alloc(4 * N * wide);
    conv = (float*)alloc(4 * N * size_t(std::max(1, cfg.conv_dim())));
    g = (float*)alloc(4 * N * size_t(std::max(1, cfg.lin_v_heads)));
    beta = (float*)alloc(4 * N * size_t(std::max(1, cfg.lin_v_heads)));
    o = (float*)alloc(4 * N * std::max(size_t(cfg.lin_value_dim()), size_t(cfg.n_heads) * cfg.head_dim));
    normed = (float*)alloc(4 * N * size_t(std::max(1, cfg.lin_value_dim())));
    act = (float*)alloc(4 * N * size_t(cfg.intermediate));
    logits = (float*)alloc(4 * N * size_t(cfg.vocab));
    scratch = (float*)alloc(4 * delta_tree_scratch(n, std::max(1, cfg.lin_v_heads)));
    if (!attn.part && cfg.n_full_layers() > 0) attn = attention_scratch(cfg, alloc);
    keep_k.assign(size_t(cfg.n_layers), nullptr);
    keep_u.assign(size_t(cfg.n_layers), nullptr);
    keep_gamma.assign(size_t(cfg.n_layers), nullptr);
    keep_conv.assign(size_t(cfg.n_layers), nullptr);
    for (int l = 0; l < cfg.n_layers; ++l) {
        if (cfg.is_attention(l)) continue;
        keep_k[size_t(l)] = (float*)alloc(4 * N * size_t(cfg.lin_key_dim()));
        keep_u[size_t(l)] = (float*)alloc(4 * N * size_t(cfg.lin_value_dim()));
        keep_gamma[size_t(l)] = (float*)alloc(4 * N * size_t(cfg.lin_v_heads));
        keep_conv[size_t(l)] = (float*)alloc(4 * N * size_t(cfg.conv_dim()));
    }
    return true;
}

void verify_layers(const ModelConfig& cfg, const ModelWeights& w, VerifyWorkspace& ws, const VerifyCaches& c, int len,
                   int n, gpuStream_t s, const std::vector<float*>& features) {
    const int H = cfg.hidden, I = cfg.intermediate;
    embed(ws.tokens, n, w.embed, ws.x, s);
    for (int l = 0; l < cfg.n_layers; ++l) {
        const LayerWeights& L = w.layers[size_t(l)];
        const size_t li = size_t(l);
        rmsnorm(ws.x, F(L.input_norm), ws.h, n, H, cfg.eps, s);
        if (L.full) {
            const int nh = cfg.n_heads, nkv = cfg.n_kv_heads, hd = cfg.head_dim, rows = cfg.attn_qkv_rows(l);
            const bool gated = L.kind == LayerKind::GatedAttention;
            matmul(ws.h, n, L.attn_qkv, ws.big, false, s);
            attn_prep_tree(ws.big, rows, n, nh, nkv, hd, gated, cfg.rope_dims, cfg.rope_theta, F(L.q_norm), F(L.k_norm),
                           cfg.eps, ws.positions, len, c.k[li], c.kt, c.v[li], c.vt, s);
            // the committed keys in ranges over the GPU (attention_split; one range at a short context), the
            // merge applying the tree mask to the rows' own keys; tree_attention (a block a row and head, each
            // walking every key: 13 ms a 27B verify of 23 rows at 1K keys) only where the split form is absent
            // (HIP, fp16 builds, other head_dims) or its scratch cannot hold the rows (a very large tree)
            const int splits = attention_splits(n, nh, nkv, hd, rows, len);
            if (splits >= 1 && attention_split_scratch(n, nh, hd, splits) <= ws.attn.floats)
                attention_split(ws.big, rows, n, nh, nkv, hd, nullptr, len, c.k[li], c.kt, c.v[li], c.vt, ws.visible,
                                splits, ws.attn, ws.o, s, gated);
            else
                tree_attention(ws.big, rows, n, nh, nkv, hd, gated, len, c.k[li], c.kt, c.v[li], c.vt, ws.visible, ws.o, s);
            matmul(ws.o, n, L.o_proj, ws.x, true, s);
        } else {
            const int rows = cfg.lin_in_rows(), cd = cfg.conv_dim(), vd = cfg.lin_value_dim();
            const int hk = cfg.lin_k_heads, hv = cfg.lin_v_heads, dk = cfg.lin_k_dim, dv = cfg.lin_v_dim;
            matmul(ws.h, n, L.lin_in, ws.big, false, s);
            conv_tree_prep(ws.big, rows, n, cfg.conv_kernel, F(L.conv_w), c.conv[li], ws.parent, ws.conv, ws.keep_conv[li],
                           hk, dk, hv, dv, cd + vd, F(L.neg_A), F(L.dt_bias), ws.g, ws.beta, s);
            delta_tree(ws.conv, cd, n, hk, hv, dk, dv, ws.g, ws.beta, ws.parent, ws.visible, c.ssm[li], ws.o, ws.keep_u[li],
                       ws.keep_gamma[li], ws.keep_k[li], ws.scratch, s);
            // a tiled out_proj (GGUF) takes the normed heads in its order, written so by the norm: no reorder
            gated_rmsnorm(ws.o, ws.big + cd, rows, F(L.ssm_norm), ws.normed, n, hv, dv, cfg.eps, s,
                          L.out_proj.tiled_cols ? hk : 0);
            matmul(ws.normed, n, L.out_proj, ws.x, true, s);
        }
        rmsnorm(ws.x, F(L.post_norm), ws.h, n, H, cfg.eps, s);
        matmul(ws.h, n, L.gate_up, ws.big, false, s);
        silu_mul(ws.big, n, I, ws.act, s);
        matmul(ws.act, n, L.down, ws.x, true, s);
        if (li < features.size() && features[li])
            GPU_CHECK(gpuMemcpyAsync(features[li], ws.x, sizeof(float) * size_t(n) * H, gpuMemcpyDeviceToDevice, s));
    }
    rmsnorm(ws.x, F(w.final_norm), ws.h, n, H, cfg.eps, s);
    matmul(ws.h, n, w.lm_head, ws.logits, false, s);
    argmax_rows(ws.logits, n, cfg.vocab, ws.argmax, s);
}

void commit_path(const ModelConfig& cfg, VerifyWorkspace& ws, const VerifyCaches& c, int len, int m, gpuStream_t s) {
    // every layer's commit in two launches (verify_ops.h: delta_conv_commit, kv_compact over layer tables),
    // kCommitLayers layers at a time
    KvCompactLayers kv;
    DeltaCommitLayers dn;
    auto flush_kv = [&] {
        kv_compact(kv, len, ws.path, m, s);
        kv.count = 0;
    };
    auto flush_dn = [&] {
        delta_conv_commit(dn, cfg.lin_k_heads, cfg.lin_v_heads, cfg.lin_k_dim, cfg.lin_v_dim, cfg.conv_dim(),
                          cfg.conv_kernel, ws.path, m, s);
        dn.count = 0;
    };
    const size_t krow = size_t(cfg.n_kv_heads) * dtype_row_bytes(c.kt, size_t(cfg.head_dim));
    const size_t vrow = size_t(cfg.n_kv_heads) * dtype_row_bytes(c.vt, size_t(cfg.head_dim));
    for (int l = 0; l < cfg.n_layers; ++l) {
        const size_t li = size_t(l);
        if (cfg.is_attention(l)) {
            if (kv.count + 2 > kCommitLayers) flush_kv();
            kv.cache[kv.count] = c.k[li];
            kv.row_bytes[kv.count++] = krow;
            kv.cache[kv.count] = c.v[li];
            kv.row_bytes[kv.count++] = vrow;
        } else {
            if (dn.count == kCommitLayers) flush_dn();
            const int i = dn.count++;
            dn.k[i] = ws.keep_k[li];
            dn.u[i] = ws.keep_u[li];
            dn.gamma[i] = ws.keep_gamma[li];
            dn.state[i] = c.ssm[li];
            dn.conv_keep[i] = ws.keep_conv[li];
            dn.conv_state[i] = c.conv[li];
        }
    }
    if (kv.count) flush_kv();
    if (dn.count) flush_dn();
}

}  // namespace lb::gpu
