#include "qwen35_forward.h"

#include <algorithm>

#include "../tuning.h"

namespace lb::gpu {
namespace {
const float* F(const Mat& m) { return (const float*)m.ptr; }
}  // namespace

void matmul(const float* x, int n, const Mat& W, float* y, bool accumulate, gpuStream_t s) {
    const int in = int(W.cols), out = int(W.rows);
    if (W.parts.empty() && !quant_type_ok(W.dtype)) return matmul(x, n, in, (const wtype*)W.ptr, out, y, accumulate, s);
    if (W.parts.empty()) return matmul_quant(x, n, in, W.ptr, W.dtype, out, y, out, accumulate, s);
    int64_t row0 = 0;
    for (const Mat& p : W.parts) {
        matmul_quant(x, n, in, p.ptr, p.dtype, int(p.rows), y + row0, out, accumulate, s);
        row0 += p.rows;
    }
}

void embed(const int* d_tokens, int n, const Mat& E, float* x, gpuStream_t s) {
    if (quant_type_ok(E.dtype)) return embed_quant(d_tokens, n, E.ptr, E.dtype, int(E.cols), x, s);
    embed(d_tokens, n, (const wtype*)E.ptr, int(E.cols), x, s);
}

void out_proj(const ModelConfig& cfg, const float* o, int n, const Mat& W, float* x_tmp, float* y, gpuStream_t s) {
    if (W.tiled_cols) {
        heads_to_tiled(o, n, cfg.lin_k_heads, cfg.lin_v_heads, cfg.lin_v_dim, x_tmp, s);
        o = x_tmp;
    }
    matmul(o, n, W, y, true, s);
}

namespace {
// y = rmsnorm(x, gain) W^T for n rows of H. One token of a matrix in q4_K / q6_K runs (a decode step of a GGUF
// model): the norm is computed in the GEMV (matmul_quant_rmsnorm, bitwise the same output), one launch fewer
// a norm (a decode step's 129 norms: its critical path is a chain of ~700 launches); else rmsnorm into h, then
// matmul.
void normed_matmul(const float* x, const float* gain, float eps, int n, int H, const Mat& W, float* h, float* y,
                   gpuStream_t s) {
    const Mat* parts = W.parts.empty() ? &W : W.parts.data();
    const size_t np = W.parts.empty() ? 1 : W.parts.size();
    bool fold = n == 1;
    int64_t row0 = 0;
    // a part it refuses ends the fold; the unfused path below then rewrites every row
    for (size_t i = 0; fold && i < np; row0 += parts[i].rows, ++i)
        fold = matmul_quant_rmsnorm(x, gain, eps, H, parts[i].ptr, parts[i].dtype, int(parts[i].rows), y + row0,
                                    int(W.rows), false, s);
    if (fold) return;
    rmsnorm(x, gain, h, n, H, eps, s);
    matmul(h, n, W, y, false, s);
}

// act = silu(gate) * up of rmsnorm(x, gain) W^T (W: the MLP's gate rows, then its up rows, I each). One token
// of a gate_up of one q4_K / q6_K run: one launch (matmul_quant_rmsnorm with swiglu, bitwise the unfused
// output); else normed_matmul into big, then silu_mul.
void normed_swiglu(const float* x, const float* gain, float eps, int n, int H, int I, const Mat& W, float* h,
                   float* big, float* act, gpuStream_t s) {
    if (n == 1 && W.parts.empty() && W.rows == 2 * int64_t(I) &&
        matmul_quant_rmsnorm(x, gain, eps, H, W.ptr, W.dtype, int(W.rows), act, I, false, s, true))
        return;
    normed_matmul(x, gain, eps, n, H, W, h, big, s);
    silu_mul(big, n, I, act, s);
}
}  // namespace

bool ForwardWorkspace::ensure(const Qwen35Config& cfg, int n, const std::function<void*(size_t)>& alloc) {
    if (n <= cap) return false;
    const size_t H = size_t(cfg.hidden);
    const size_t wide = std::max({size_t(cfg.lin_in_rows()), size_t(cfg.attn_qkv_rows()), 2 * size_t(cfg.intermediate)});
    const size_t N = size_t(n);
    cap = n;
    tokens = (int*)alloc(sizeof(int) * N);
    x = (float*)alloc(4 * N * H);
    h = (float*)alloc(4 * N * H);
    big = (float*)alloc(4 * N * wide);
    conv = (float*)alloc(4 * N * size_t(cfg.conv_dim()));
    g = (float*)alloc(4 * N * size_t(cfg.lin_v_heads));
    beta = (float*)alloc(4 * N * size_t(cfg.lin_v_heads));
    o = (float*)alloc(4 * N * std::max(size_t(cfg.lin_value_dim()), size_t(cfg.n_heads) * cfg.head_dim));
    normed = (float*)alloc(4 * N * size_t(cfg.lin_value_dim()));
    act = (float*)alloc(4 * N * size_t(cfg.intermediate));
    if (!logits) logits = (float*)alloc(4 * size_t(cfg.vocab));
    if (!attn.part && cfg.n_full_layers() > 0) attn = attention_scratch(cfg, alloc);
    return true;
}

AttnScratch attention_scratch(const ModelConfig& cfg, const std::function<void*(size_t)>& alloc) {
    AttnScratch a;
    a.floats = attention_scratch_floats(cfg.n_heads, cfg.n_kv_heads, cfg.head_dim);
    a.part = (float*)alloc(sizeof(float) * a.floats);
    a.counters = (int*)alloc(sizeof(int) * size_t(cfg.n_kv_heads));
    GPU_CHECK(gpuMemset(a.counters, 0, sizeof(int) * size_t(cfg.n_kv_heads)));
    a.decode_blocks = attention_decode_blocks(cfg.n_kv_heads, 0);
    return a;
}

void forward_layers(const Qwen35Config& cfg, const Qwen35Weights& w, ForwardWorkspace& ws, const ForwardCaches& c,
                    const int* d_tokens, int n, int* d_next, gpuStream_t s) {
    const int H = cfg.hidden, I = cfg.intermediate;
    embed(d_tokens, n, w.embed, ws.x, s);
    for (int l = 0; l < cfg.n_layers; ++l) {
        const Qwen35Layer& L = w.layers[size_t(l)];
        const size_t li = size_t(l);
        if (L.full) {
            const int nh = cfg.n_heads, nkv = cfg.n_kv_heads, hd = cfg.head_dim, rows = cfg.attn_qkv_rows(l);
            const bool gated = cfg.gated(l);
            normed_matmul(ws.x, F(L.input_norm), cfg.eps, n, H, L.attn_qkv, ws.h, ws.big, s);
            attn_prep(ws.big, rows, n, nh, nkv, hd, cfg.rope_dims, cfg.rope_theta, F(L.q_norm), F(L.k_norm), cfg.eps,
                      c.d_pos, c.k[li], c.kt, c.v[li], c.vt, s, gated);
            if (c.score) c.score(l, ws.big, rows, n);
            const bool sparse =
                c.sparse && block_sparse_select(ws.big, rows, n, nh, nkv, hd, gated, c.pos0, c.k[li], c.kt, *c.sparse, s);
            attention(ws.big, rows, n, nh, nkv, hd, c.d_pos, c.k[li], c.kt, c.v[li], c.vt, ws.o, s, gated,
                      sparse ? c.sparse : nullptr, &ws.attn, c.pos0);
            matmul(ws.o, n, L.o_proj, ws.x, true, s);
        } else {
            const int rows = cfg.lin_in_rows(), cd = cfg.conv_dim(), vd = cfg.lin_value_dim();
            const int hk = cfg.lin_k_heads, hv = cfg.lin_v_heads, dk = cfg.lin_k_dim, dv = cfg.lin_v_dim;
            normed_matmul(ws.x, F(L.input_norm), cfg.eps, n, H, L.lin_in, ws.h, ws.big, s);
            conv1d_silu(ws.big, rows, n, cd, cfg.conv_kernel, F(L.conv_w), c.conv[li], ws.conv, s);
            if (n == 1 && tuning().fused_delta && delta_decode_ok(dk, dv)) {
                // one token (a decode step of a model with GGUF blocks): the fused decode graph's one-kernel step;
                // the chunked delta_rule costs two launches and ~20 us a layer at n = 1
                delta_decode(ws.conv, ws.big, cd + vd, F(L.neg_A), F(L.dt_bias), hk, hv, dk, dv, c.ssm[li], ws.o, s);
            } else {
                deltanet_prep(ws.conv, cd, ws.big, rows, cd + vd, F(L.neg_A), F(L.dt_bias), n, hk, dk, hv, ws.g,
                              ws.beta, s);
                delta_rule(ws.conv, cd, n, hk, hv, dk, dv, ws.g, ws.beta, c.ssm[li], ws.o, s);
            }
            gated_rmsnorm(ws.o, ws.big + cd, rows, F(L.ssm_norm), ws.normed, n, hv, dv, cfg.eps, s);
            out_proj(cfg, ws.normed, n, L.out_proj, ws.conv, ws.x, s);  // ws.conv: read by the delta rule, free now
        }
        normed_swiglu(ws.x, F(L.post_norm), cfg.eps, n, H, I, L.gate_up, ws.h, ws.big, ws.act, s);
        matmul(ws.act, n, L.down, ws.x, true, s);
    }
    normed_matmul(ws.x + size_t(n - 1) * H, F(w.final_norm), cfg.eps, 1, H, w.lm_head, ws.h, ws.logits, s);
    argmax(ws.logits, cfg.vocab, d_next, s);
    add_pos(c.d_pos, n, s, d_next, c.host_ring, c.ring_mask);
}

}  // namespace lb::gpu
