// The GPU DFlash draft against its CPU references, on random inputs:
//   draft_attention      (core/cuda/draft_ops.cu)   vs cpu::draft_attention, masks full / causal / window, fp32
//                        and bf16 caches (the reference reads the bf16-rounded values)
//   draft_top_k          (core/cuda/draft_ops.cu)   vs dflash::top_k_logprobs, with ties, multiplier, soft cap
//   gather_feature_rows  (core/cuda/draft_ops.cu)   vs the plain copy
//   DraftModelGpu        (dflash/draft_model_gpu.cu) vs DraftModelCpu: the block's final hidden states after
//                        context rows added in two calls, and propose()'s per-depth candidates (a random
//                        bf16 embedding and LM head stand in for the target's); with an fp32 and a bf16
//                        context cache (LB_DFLASH_DRAFT_BF16), each against the fp32 CPU draft
// usage: lucebench-dflash-gpu-check [DRAFT_DIR...]   (the forward check runs for each draft given)
// Exit status 0 when every check passes. Run on the device by scripts/device/check_dflash_gpu.sh.
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/cpu/ops.h"
#include "core/cuda/draft_ops.h"
#include "core/cuda/gpu_ops.h"
#include "core/half.h"
#include "dflash/ddtree.h"
#include "dflash/draft_model.h"
#include "dflash/draft_model_gpu.h"
#include "gpu_check_util.h"

using namespace lb;

static float bf16_round(float x) { return bf16_to_f32(f32_to_bf16(x)); }

static void check_attention(int n, int n_ctx, int nh, int nkv, int hd, bool causal, int window, bool bf16 = false) {
    const int qd = nh * hd, kvd = nkv * hd, ldq = qd + 8;
    auto q = randn(size_t(n) * ldq), kc = randn(size_t(n_ctx) * kvd), vc = randn(size_t(n_ctx) * kvd);
    auto kb = randn(size_t(n) * kvd), vb = randn(size_t(n) * kvd);
    if (bf16)  // the reference reads the values the bf16 cache holds
        for (auto* v : {&kc, &vc, &kb, &vb})
            for (auto& e : *v) e = bf16_round(e);
    std::vector<float> q_packed(size_t(n) * qd);
    for (int t = 0; t < n; ++t) std::copy(&q[size_t(t) * ldq], &q[size_t(t) * ldq] + qd, &q_packed[size_t(t) * qd]);
    std::vector<float> want(size_t(n) * qd);
    cpu::draft_attention(q_packed.data(), n, nh, nkv, hd, n_ctx, kc.data(), vc.data(), n_ctx, kb.data(), vb.data(),
                         causal, window, want.data());
    std::vector<float> kall(kc), vall(vc);
    kall.insert(kall.end(), kb.begin(), kb.end());
    vall.insert(vall.end(), vb.begin(), vb.end());
    float *dq = up(q), *dout = up(std::vector<float>(size_t(n) * qd, NAN));
    void *dk, *dv;
    if (bf16) {
        std::vector<uint16_t> kh(kall.size()), vh(vall.size());
        for (size_t i = 0; i < kall.size(); ++i) { kh[i] = f32_to_bf16(kall[i]); vh[i] = f32_to_bf16(vall[i]); }
        dk = up(kh);
        dv = up(vh);
    } else {
        dk = up(kall);
        dv = up(vall);
    }
    gpu::draft_attention(dq, ldq, n, nh, nkv, hd, n_ctx, dk, dv, bf16 ? DType::BF16 : DType::F32, causal, window,
                         dout, 0);
    char name[160];
    snprintf(name, sizeof name, "draft_attention n=%d ctx=%d h=%d/%d hd=%d %s window=%d %s", n, n_ctx, nh, nkv, hd,
             causal ? "causal" : "full", window, bf16 ? "bf16" : "f32");
    report(name, rel_diff(down(dout, want.size()), want), 1e-4);
    for (void* p : {(void*)dq, dk, dv, (void*)dout}) GPU_CHECK(gpuFree(p));
}

static void check_top_k(int rows, int vocab, int k, float mult, float softcap, bool ties) {
    auto logits = randn(size_t(rows) * vocab, 3.f);
    if (ties)  // coarse values: many equal logits, so the lower-index-first order is exercised
        for (auto& z : logits) z = std::round(z * 2.f) / 2.f;
    std::vector<float> z(logits);
    for (auto& e : z) {
        e *= mult;
        if (softcap > 0.f) e = std::tanh(e / softcap) * softcap;
    }
    float* dl = up(logits);
    int* di = up(std::vector<int>(size_t(rows) * k, -7));
    float* dp = up(std::vector<float>(size_t(rows) * k, NAN));
    gpu::draft_top_k(dl, rows, vocab, k, mult, softcap, di, dp, 0);
    auto ids = down(di, size_t(rows) * k);
    auto lps = down(dp, size_t(rows) * k);
    std::vector<float> want_lp, got_lp;
    int id_mismatch = 0;
    for (int r = 0; r < rows; ++r) {
        dflash::DepthCandidates c = dflash::top_k_logprobs(&z[size_t(r) * vocab], vocab, k);
        for (int i = 0; i < k; ++i) {
            id_mismatch += ids[size_t(r) * k + i] != c.tokens[size_t(i)];
            want_lp.push_back(c.logprobs[size_t(i)]);
            got_lp.push_back(lps[size_t(r) * k + i]);
        }
    }
    char name[160];
    snprintf(name, sizeof name, "draft_top_k rows=%d vocab=%d k=%d mult=%.2f cap=%.1f%s ids %s", rows, vocab, k, mult,
             softcap, ties ? " ties" : "", id_mismatch ? "DIFFER" : "equal");
    if (id_mismatch) ++g_failed;
    report(name, rel_diff(got_lp, want_lp), 1e-5);
    GPU_CHECK(gpuFree(dl)); GPU_CHECK(gpuFree(di)); GPU_CHECK(gpuFree(dp));
}

static void check_gather(int n_src, int nf, int H, int m) {
    auto src = randn(size_t(nf) * n_src * H);
    std::vector<int> rows;
    for (int i = 0; i < m; ++i) rows.push_back(int(rng() % uint32_t(n_src)));
    std::vector<float> want(size_t(m) * nf * H);
    for (int i = 0; i < m; ++i)
        for (int f = 0; f < nf; ++f)
            for (int e = 0; e < H; ++e)
                want[(size_t(i) * nf + f) * H + e] = src[(size_t(f) * n_src + rows[size_t(i)]) * H + e];
    float* ds = up(src);
    int* dr = up(rows);
    float* dd = up(std::vector<float>(want.size(), NAN));
    gpu::gather_feature_rows(ds, n_src, nf, H, dr, m, dd, 0);
    char name[96];
    snprintf(name, sizeof name, "gather_feature_rows n=%d nf=%d H=%d m=%d", n_src, nf, H, m);
    report(name, rel_diff(down(dd, want.size()), want), 0.0);
    GPU_CHECK(gpuFree(ds)); GPU_CHECK(gpuFree(dr)); GPU_CHECK(gpuFree(dd));
}

// Values rounded to the GPU's matrix type, so that both sides hold the same weights.
static std::vector<float> round_to_wtype(std::vector<float> v) {
    for (auto& e : v) e = float(gpu::wtype(e));
    return v;
}

static void check_forward(const std::string& dir, DType cache_type) {
    auto src = open_checkpoint(dir);
    const dflash::DraftConfig dc = dflash::draft_config_from_source(*src);
    const int H = dc.hidden, D = dc.block_size - 1, V = 1000, fw = dc.feature_width();
    printf("draft %s: %d layers, hidden %d, %d/%d heads x %d, block %d, %d features; GPU context cache %s\n",
           dir.c_str(), dc.n_layers, H, dc.n_heads, dc.n_kv_heads, dc.head_dim, dc.block_size, dc.n_features(),
           dtype_name(cache_type));
    dflash::DraftModelCpu cpu;
    cpu.load(*src, dc);
    cpu.allocate(256);
    // A stand-in target head: random embedding and LM head, in the GPU's matrix type on both sides.
    const auto embed = round_to_wtype(randn(size_t(V) * H, 0.5f));
    const auto lm_head = round_to_wtype(randn(size_t(V) * H, 1.f / std::sqrt(float(H))));
    std::vector<gpu::wtype> embed_w(embed.size()), lm_w(lm_head.size());
    for (size_t i = 0; i < embed.size(); ++i) { embed_w[i] = gpu::wtype(embed[i]); lm_w[i] = gpu::wtype(lm_head[i]); }
    gpu::wtype *d_embed = up(embed_w), *d_lm = up(lm_w);
    gpuStream_t s;
    GPU_CHECK(gpuStreamCreate(&s));
    gpu::DeviceContext head_ctx(0);
    {
        gpu::ContextScope bind(head_ctx);
        gpu::decode_setup(0);
    }
    DeviceHead head;
    head.stream = (void*)s;
    head.embed = [&](const int* t, int n, float* x) { gpu::ContextScope b(head_ctx); gpu::embed(t, n, d_embed, H, x, s); };
    head.lm_head = [&](const float* x, int n, float* y) {
        gpu::ContextScope b(head_ctx);
        gpu::matmul(x, n, H, d_lm, V, y, false, s);
    };
    dflash::DraftModelGpu gpu_draft(head);
    gpu_draft.load(*src, dc);
    gpu_draft.allocate(256, 64, V, cache_type);
    // Context: 37 rows, then 5 more (two add_context calls), then through add_verify_rows.
    for (int n : {37, 5}) {
        auto f = randn(size_t(n) * fw);
        cpu.add_context(f.data(), n);
        float* df = up(f);
        gpu_draft.add_context(df, n);
        GPU_CHECK(gpuStreamSynchronize(s));
        GPU_CHECK(gpuFree(df));
    }
    {
        const int n_rows = 9;
        auto f = randn(size_t(dc.n_features()) * n_rows * H);  // [nf, rows, H], a verify's device layout
        const std::vector<int> rows = {0, 3, 4, 8};
        std::vector<float> packed(rows.size() * size_t(fw));
        for (size_t i = 0; i < rows.size(); ++i)
            for (int fi = 0; fi < dc.n_features(); ++fi)
                std::copy(&f[(size_t(fi) * n_rows + rows[i]) * H], &f[(size_t(fi) * n_rows + rows[i]) * H] + H,
                          &packed[i * fw + size_t(fi) * H]);
        cpu.add_context(packed.data(), int(rows.size()));
        float* df = up(f);
        gpu_draft.add_verify_rows(df, n_rows, rows);
        GPU_CHECK(gpuStreamSynchronize(s));
        GPU_CHECK(gpuFree(df));
    }
    // The block: [bonus, MASK...] through both.
    const int bonus = 17 % V, mask = dc.mask_token_id < V ? dc.mask_token_id : V - 1;
    if (dc.mask_token_id >= V) {
        printf("  (mask id %d >= stand-in vocab %d: the block check uses embedding rows of random tokens)\n",
               dc.mask_token_id, V);
    }
    std::vector<float> block(size_t(dc.block_size) * H);
    std::vector<int> toks(static_cast<size_t>(dc.block_size), mask);
    toks[0] = bonus;
    for (int i = 0; i < dc.block_size; ++i)
        std::copy(&embed[size_t(toks[size_t(i)]) * H], &embed[size_t(toks[size_t(i)]) * H] + H, &block[size_t(i) * H]);
    std::vector<float> want(size_t(D) * H);
    cpu.forward_block(block.data(), want.data());
    float* db = up(block);
    float* dh = up(std::vector<float>(want.size(), NAN));
    gpu_draft.forward_block(db, dh);
    GPU_CHECK(gpuStreamSynchronize(s));
    // bf16 activations in the tensor-core GEMMs (16+ rows) against fp32: about 1e-2 after a few layers; a bf16
    // context cache rounds K and V once more.
    report(std::string("DraftModelGpu forward_block vs DraftModelCpu (final hidden), cache ") + dtype_name(cache_type),
           rel_diff(down(dh, want.size()), want), 5e-2);
    // propose(): top-8 per depth. The CPU side: its logits of the same block through the same LM head.
    if (dc.mask_token_id < V) {
        std::vector<float> logits(size_t(D) * V);
        cpu.logits(want.data(), D, lm_head.data(), V, logits.data());
        const auto got = gpu_draft.propose(bonus, 8);
        int agree = 0, compared = 0;
        double max_lp = 0;
        for (int d = 0; d < D; ++d) {
            const auto c = dflash::top_k_logprobs(&logits[size_t(d) * V], V, 8);
            if (c.logprobs[0] - c.logprobs[1] > 0.1f) {  // top-1 away from a near-tie
                ++compared;
                agree += got[size_t(d)].tokens[0] == c.tokens[0];
            }
            max_lp = std::fmax(max_lp, std::fabs(double(got[size_t(d)].logprobs[0]) - c.logprobs[0]));
        }
        const bool ok = agree == compared;
        if (!ok) ++g_failed;
        printf("  %-64s top-1 %d/%d depths (away from near-ties), max |dlogp| %.2e %s\n",
               "DraftModelGpu propose vs DraftModelCpu + top_k_logprobs", agree, compared, max_lp, ok ? "ok" : "FAIL");
    }
    GPU_CHECK(gpuFree(db)); GPU_CHECK(gpuFree(dh)); GPU_CHECK(gpuFree(d_embed)); GPU_CHECK(gpuFree(d_lm));
}

int main(int argc, char** argv) {
    rng.seed(4321);
    gpuDeviceProp p;
    GPU_CHECK(gpuGetDeviceProperties(&p, 0));
    printf("device: %s\n", p.name);
    printf("draft_attention (cpu::draft_attention reference):\n");
    check_attention(16, 0, 4, 2, 64, false, 0);
    check_attention(16, 37, 4, 2, 64, false, 0);
    check_attention(16, 37, 4, 2, 64, true, 0);
    check_attention(16, 300, 4, 4, 48, false, 8);
    check_attention(16, 300, 6, 2, 64, true, 20);
    check_attention(16, 1000, 32, 8, 128, false, 0);
    check_attention(16, 3000, 32, 8, 128, false, 2048);
    check_attention(5, 7, 2, 1, 32, true, 3);
    check_attention(16, 37, 4, 2, 64, true, 0, true);
    check_attention(16, 300, 6, 2, 64, true, 20, true);
    check_attention(16, 3000, 32, 8, 128, false, 2048, true);
    printf("draft_top_k (dflash::top_k_logprobs reference):\n");
    check_top_k(15, 48, 8, 1.f, 0.f, false);
    check_top_k(15, 1000, 1, 1.f, 0.f, true);
    check_top_k(15, 1000, 16, 1.f, 0.f, true);
    check_top_k(15, 248320, 8, 1.f, 0.f, false);
    check_top_k(15, 248320, 16, 1.f, 0.f, true);
    check_top_k(3, 5000, 8, 0.7f, 30.f, false);
    printf("gather_feature_rows:\n");
    check_gather(23, 5, 1024, 9);
    check_gather(1, 2, 64, 1);
    for (int i = 1; i < argc; ++i) {
        try {
            for (DType t : {DType::F32, DType::BF16}) check_forward(argv[i], t);
        } catch (const std::exception& e) {
            ++g_failed;
            printf("  forward check of %s: FAIL (%s)\n", argv[i], e.what());
        }
    }
    printf(g_failed ? "%d check(s) FAILED\n" : "all checks passed\n", g_failed);
    return g_failed ? 1 : 0;
}
