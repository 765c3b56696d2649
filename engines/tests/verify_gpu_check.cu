// The GPU backend's verify forward (core/cuda/qwen35_gpu.cu: verify, commit, export_state over
// core/cuda/verify_forward.cu), end to end on the device, through make_gpu_backend as the engines use it:
//  1. exactness (KV bf16; q8_0 and q4_0 on the tiny model): on random Qwen3.5 models the AR run (the
//     backend's decode path: the fused decode graph) and
//     the scripted trees of spec_check.h on a second backend: the committed tokens must be the AR greedy
//     tokens up to the first near-tie, the states after commit the AR states (to bf16 rounding), and decode
//     after the last commit the AR tokens again;
//  2. outputs: a verify's argmax, logits, top-k log-probs and features at chosen rows against the CPU
//     backend's on the same model and tree;
//  3. two models in one process: two different random models on one GPU, their generations interleaved
//     (prefill, decode steps, greedy decode loops), each equal to its own run alone;
//  4. Qwen3 dense (`--qwen3` runs only these): exactness and outputs on a random Qwen3 model, and a scored
//     forward (PFlash's importance, backend.h TailScores) against the CPU backend's on a 700-token prompt
//     (run it with LB_GPU_PREFILL_CHUNK=256 so that the prompt takes three chunks);
//  5. cost (`--time`; `--time-model PATH` for only this, on a checkpoint file such as a GGUF): one verify
//     forward of B + 1 rows (B in 1, 8, 16, 22, 32, 64; a DDTree-like tree: the
//     top-1 chain to depth 15, further nodes as siblings) through Backend::verify, against one decode step of
//     the same backend (its fused decode graph) and beside it the append forward of as many tokens, on
//     full-shape synthetic Qwen3.5-0.8B weights at a 512-token context; then one DeltaNet layer's delta_tree
//     alone; medians (CUDA events). `--time-verify PATH CTX[,CTX...] [B]`: the verify forward of B + 1 rows and
//     the decode step at long contexts (time_verify).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/tuning.h"
#include "core/cuda/gpu_ops.h"
#include "core/cuda/verify_ops.h"
#include "mem_checkpoint.h"
#include "spec_check.h"

using namespace lb;
using namespace spec_check;

namespace {

std::unique_ptr<Backend> gpu_backend(const TensorSource& src, const ModelConfig& cfg, int max_ctx,
                                     DType kv = DType::BF16) {
    auto be = make_gpu_backend(0);
    be->load(src, cfg, nullptr);
    be->allocate(max_ctx, kv, kv);
    return be;
}

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

const char* kQwen3 = R"({"model_type": "qwen3", "vocab_size": 257, "hidden_size": 40, "intermediate_size": 72,
  "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 12, "rms_norm_eps": 1e-6,
  "tie_word_embeddings": false, "rope_theta": 1000000.0})";
// Qwen3-0.6B's head layout (16 / 8 heads of 128), two layers: the tensor-core prefill kernel and the tail scores
const char* kQwen3Heads = R"({"model_type": "qwen3", "vocab_size": 300, "hidden_size": 256, "intermediate_size": 384,
  "num_hidden_layers": 2, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
  "tie_word_embeddings": true, "rope_theta": 1000000.0})";

// Five prompts per model: a random model's bf16 logits have near-ties (a flip there ends the comparison),
// so the rounds compared are summed over the runs.
void exactness(const char* name, const char* config, uint32_t seed, DType kv = DType::BF16) {
    lbtest::MemCheckpoint src(config, seed);
    const ModelConfig cfg = config_from_source(src);
    auto ar_be = gpu_backend(src, cfg, 320, kv), spec_be = gpu_backend(src, cfg, 320, kv);
    int total = 0, most = 0;
    double worst = 0;
    for (uint32_t p = 0; p < 5; ++p) {
        const ArRun ar = ar_run(*ar_be, random_prompt(9, cfg.vocab, 7 + p), 200);
        int rounds = 0;
        // bf16 weights and KV; the verify's GEMM (more than 8 rows) rounds activations differently from the
        // decode GEMV, so flips are allowed below a 2e-2 relative margin and states agree to bf16 rounding
        // A quantised cache may put a verify row's K/V one quantisation step from the AR row's (q4_0: 1/8 of
        // the block's largest value), which the state tolerance allows.
        const double tol = kv == DType::Q4_0 ? 0.15 : 5e-2;
        spec_run(name, cfg.vocab, *spec_be, ar, 11 + p, &worst, &rounds, 2e-2f, tol);
        total += rounds;
        most = std::max(most, rounds);
    }
    printf("%s, KV %s: %d verify rounds on the GPU backend == AR greedy over 5 prompts (longest run %d, each to its "
           "first near-tie), worst state difference %.2e\n", name, dtype_name(kv), total, most, worst);
    CHECK(total >= 16, "%s: only %d rounds compared", name, total);
}

// The outputs of one verify (argmax, logits, top-k, features at chosen rows) on the GPU against the CPU
// backend's: same model, prompt and tree.
void outputs(const char* name, const char* config, uint32_t seed) {
    lbtest::MemCheckpoint src(config, seed);
    const ModelConfig cfg = config_from_source(src);
    auto gpu = gpu_backend(src, cfg, 128);
    auto cpu = make_cpu_backend();
    cpu->load(src, cfg, nullptr);
    cpu->allocate(128, DType::BF16, DType::BF16);
    const std::vector<int> prompt = random_prompt(17, cfg.vocab, seed + 3);
    VerifyRequest req;
    std::mt19937 rng(seed);
    for (int t = 0; t < 13; ++t) {
        req.tokens.push_back(int(rng() % uint32_t(cfg.vocab)));
        req.parents.push_back(t == 0 ? -1 : int(rng() % uint32_t(t)));
    }
    for (int t = 0; t < 13; ++t) {
        int d = 0;
        for (int s = t; req.parents[size_t(s)] >= 0; s = req.parents[size_t(s)]) ++d;
        req.positions.push_back(int(prompt.size()) + d);
    }
    req.out_rows = {12, 0, 5, 7};
    req.want_logits = true;
    req.top_k = 4;
    req.feature_layers = {cfg.n_layers - 1, 0, 2, 0};
    VerifyResult g, c;
    for (Backend* be : {gpu.get(), cpu.get()}) {
        be->reset();
        be->forward(prompt.data(), int(prompt.size()), nullptr);
        be->verify(req, be == gpu.get() ? &g : &c);
    }
    const size_t R = req.out_rows.size(), V = size_t(cfg.vocab);
    CHECK(g.argmax.size() == R && g.logits.size() == R * V && g.top_ids.size() == R * 4 && g.top_logprobs.size() == R * 4 &&
              g.features.size() == R * req.feature_layers.size() * size_t(cfg.hidden),
          "%s: verify output sizes", name);
    if (spec_check::failures()) return;
    const double logit_err = rel_diff(g.logits, c.logits), feat_err = rel_diff(g.features, c.features);
    int argmax_same = 0, top_same = 0, top_cmp = 0;
    double lp_err = 0;
    for (size_t i = 0; i < R; ++i) {
        std::vector<float> row(c.logits.begin() + long(i * V), c.logits.begin() + long((i + 1) * V));
        const bool clear = margin(row) > 2e-2f;
        argmax_same += g.argmax[i] == c.argmax[i];
        CHECK(!clear || g.argmax[i] == c.argmax[i], "%s: out row %zu argmax %d, CPU %d", name, i, g.argmax[i], c.argmax[i]);
        CHECK(g.argmax[i] == g.top_ids[i * 4], "%s: out row %zu: argmax %d is not the top-1 id %d", name, i, g.argmax[i], g.top_ids[i * 4]);
        for (int k = 0; k < 4; ++k) {
            lp_err = std::max(lp_err, double(std::fabs(g.top_logprobs[i * 4 + k] - c.top_logprobs[i * 4 + k])));
            if (k == 0 || !clear) continue;
            ++top_cmp;
            top_same += g.top_ids[i * 4 + k] == c.top_ids[i * 4 + k];
        }
    }
    printf("%s: verify outputs vs the CPU backend at %zu rows: argmax %d/%zu equal, logits rel. error %.2e, "
           "features rel. error %.2e, top-4 ids %d/%d equal, log-prob max abs. error %.2e\n",
           name, R, argmax_same, R, logit_err, feat_err, top_same, top_cmp, lp_err);
    // The GPU holds bf16 weights, the CPU backend fp32 ones: the rows differ by that rounding (measured up to
    // 3.1e-2 of the logits' scale on the odd shape), while a wrong row or layer differs by the whole scale. A
    // log-prob (logit - log-sum-exp) moves by at most twice the largest logit difference.
    double logit_abs = 0;
    for (size_t i = 0; i < g.logits.size(); ++i) logit_abs = std::max(logit_abs, double(std::fabs(g.logits[i] - c.logits[i])));
    CHECK(logit_err < 6e-2 && feat_err < 6e-2, "%s: logits/features differ from the CPU backend", name);
    CHECK(lp_err <= 2 * logit_abs + 1e-3, "%s: top-k log-probs differ from the CPU backend by %.2e (logits by %.2e)", name,
          lp_err, logit_abs);
}

// A scored forward (TailScores) on the GPU against the CPU backend's: the same random Qwen3 model, prompt and
// 8 tail rows. The GPU holds bf16 weights, so q and k differ by that rounding; a wrong position, mask or
// un-rotation moves probabilities by their whole scale.
void scored() {
    lbtest::MemCheckpoint src(kQwen3Heads, 31);
    const ModelConfig cfg = config_from_source(src);
    auto gpu = gpu_backend(src, cfg, 800);
    auto cpu = make_cpu_backend();
    cpu->load(src, cfg, nullptr);
    cpu->allocate(800, DType::BF16, DType::BF16);
    const std::vector<int> prompt = random_prompt(700, cfg.vocab, 41);
    TailScores g, c;
    const int ng = gpu->forward_scored(prompt.data(), 700, 8, &g);
    // the CPU backend's scored forward holds its activations for every row: 500 plain tokens first
    cpu->forward(prompt.data(), 500, nullptr);
    const int nc = cpu->forward_scored(prompt.data() + 500, 200, 8, &c);
    CHECK(g.layers == c.layers && g.n_tail == 8 && g.ctx == 700 && g.probs.size() == c.probs.size(),
          "scored forward: shapes differ from the CPU backend's");
    if (spec_check::failures()) return;
    double err = 0, scale = 0, mass = 0;
    for (size_t i = 0; i < g.probs.size(); ++i) {
        err = std::max(err, double(std::fabs(g.probs[i] - c.probs[i])));
        scale = std::max(scale, double(std::fabs(c.probs[i])));
    }
    for (int t = 0; t < 8; ++t)  // positions after a row's own are 0
        for (int s2 = 700 - 8 + t + 1; s2 < 700; ++s2) mass += g.probs[size_t(t) * 700 + size_t(s2)];
    printf("qwen3 scored forward (700 tokens, 8 tail rows, %zu layers) vs the CPU backend: probabilities max abs. "
           "error %.2e of their max %.2e (%.2e relative), next token %d (CPU %d)\n", g.layers.size(), err, scale,
           err / scale, ng, nc);
    CHECK(err / scale < 0.15, "scored forward: probabilities differ from the CPU backend's by %.2e relative", err / scale);
    CHECK(mass == 0, "scored forward: probability after a row's own position");
}

// Two different models in one process on one GPU, generations interleaved: each must give the tokens of its
// own run alone (the backends share no buffer, graph or counter: a device context each).
void two_models() {
    lbtest::MemCheckpoint src_a(kTiny, 21), src_b(kOdd, 22);
    const ModelConfig ca = config_from_source(src_a), cb = config_from_source(src_b);
    const std::vector<int> pa = random_prompt(11, ca.vocab, 5), pb = random_prompt(29, cb.vocab, 6);
    const int steps = 48;
    // greedy: prefill, then steps one forward() each, then a decode() loop of as many steps
    auto alone = [&](const lbtest::MemCheckpoint& src, const ModelConfig& cfg, const std::vector<int>& prompt) {
        auto be = gpu_backend(src, cfg, 256);
        std::vector<int> out{be->forward(prompt.data(), int(prompt.size()), nullptr)};
        for (int i = 0; i < steps; ++i) out.push_back(be->forward(&out.back(), 1, nullptr));
        be->decode(steps, [](int) { return false; }, &out);
        return out;
    };
    const std::vector<int> want_a = alone(src_a, ca, pa), want_b = alone(src_b, cb, pb);
    auto a = gpu_backend(src_a, ca, 256), b = gpu_backend(src_b, cb, 256);
    std::vector<int> got_a{a->forward(pa.data(), int(pa.size()), nullptr)};
    std::vector<int> got_b{b->forward(pb.data(), int(pb.size()), nullptr)};
    for (int i = 0; i < steps; ++i) {
        got_a.push_back(a->forward(&got_a.back(), 1, nullptr));
        got_b.push_back(b->forward(&got_b.back(), 1, nullptr));
    }
    for (int i = 0; i < steps; i += 8) {
        a->decode(8, [](int) { return false; }, &got_a);
        b->decode(8, [](int) { return false; }, &got_b);
    }
    CHECK(got_a == want_a, "two models: model A's interleaved tokens differ from its run alone (first at %d)",
          int(std::mismatch(got_a.begin(), got_a.end(), want_a.begin()).first - got_a.begin()));
    CHECK(got_b == want_b, "two models: model B's interleaved tokens differ from its run alone (first at %d)",
          int(std::mismatch(got_b.begin(), got_b.end(), want_b.begin()).first - got_b.begin()));
    printf("two models in one process (%d and %d layers), generations interleaved: %zu and %zu tokens, each equal to "
           "its run alone: %s\n", ca.n_layers, cb.n_layers, got_a.size(), got_b.size(),
           got_a == want_a && got_b == want_b ? "yes" : "NO");
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

// One DeltaNet layer's delta_tree alone on the 0.8B shape (16 value heads, dk = dv = 128), random inputs.
double delta_tree_ms(int n, const std::vector<int>& parents) {
    const int hk = 16, hv = 16, dk = 128, dv = 128, ld = 2 * hk * dk + hv * dv;
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-0.1f, 0.1f);
    auto upload = [&](std::vector<float> h) {
        float* d = nullptr;
        GPU_CHECK(gpuMalloc(&d, sizeof(float) * std::max<size_t>(1, h.size())));
        GPU_CHECK(gpuMemcpy(d, h.data(), sizeof(float) * h.size(), gpuMemcpyHostToDevice));
        return d;
    };
    auto rnd = [&](size_t k) { std::vector<float> v(k); for (float& x : v) x = u(rng); return v; };
    std::vector<float> gh(size_t(n) * hv), bh(size_t(n) * hv);
    for (float& x : gh) x = -0.05f - std::fabs(u(rng));
    for (float& x : bh) x = 0.5f + u(rng);
    float *qkv = upload(rnd(size_t(n) * ld)), *g = upload(gh), *beta = upload(bh), *state = upload(rnd(size_t(hv) * dk * dv));
    float *out = upload(std::vector<float>(size_t(n) * hv * dv)), *uu = upload(std::vector<float>(size_t(n) * hv * dv));
    float *gamma = upload(std::vector<float>(size_t(n) * hv)), *kk = upload(std::vector<float>(size_t(n) * hk * dk));
    float* scratch = upload(std::vector<float>(gpu::delta_tree_scratch(n, hv)));
    std::vector<unsigned char> vis(size_t(n) * n, 0);
    for (int t = 0; t < n; ++t) for (int s = t; s >= 0; s = parents[size_t(s)]) vis[size_t(t) * n + s] = 1;
    int* par = nullptr;
    unsigned char* dvis = nullptr;
    GPU_CHECK(gpuMalloc(&par, sizeof(int) * size_t(n)));
    GPU_CHECK(gpuMalloc(&dvis, vis.size()));
    GPU_CHECK(gpuMemcpy(par, parents.data(), sizeof(int) * size_t(n), gpuMemcpyHostToDevice));
    GPU_CHECK(gpuMemcpy(dvis, vis.data(), vis.size(), gpuMemcpyHostToDevice));
    gpuStream_t s;
    gpuEvent_t e0, e1;
    GPU_CHECK(gpuStreamCreate(&s));
    GPU_CHECK(gpuEventCreate(&e0));
    GPU_CHECK(gpuEventCreate(&e1));
    std::vector<double> ts;
    for (int r = 0; r < 23; ++r) {
        GPU_CHECK(gpuEventRecord(e0, s));
        gpu::delta_tree(qkv, ld, n, hk, hv, dk, dv, g, beta, par, dvis, state, out, uu, gamma, kk, scratch, s);
        GPU_CHECK(gpuEventRecord(e1, s));
        GPU_CHECK(gpuEventSynchronize(e1));
        float ms = 0;
        GPU_CHECK(gpuEventElapsedTime(&ms, e0, e1));
        if (r >= 3) ts.push_back(ms);
    }
    GPU_CHECK(gpuGetLastError());
    for (void* p : {(void*)qkv, (void*)g, (void*)beta, (void*)state, (void*)out, (void*)uu, (void*)gamma, (void*)kk,
                    (void*)scratch, (void*)par, (void*)dvis})
        GPU_CHECK(gpuFree(p));
    (void)gpuEventDestroy(e0);
    (void)gpuEventDestroy(e1);
    (void)gpuStreamDestroy(s);
    return median(ts);
}

void timing(const TensorSource& src, const char* what) {
    const ModelConfig cfg = config_from_source(src);
    printf("timing on %s\n", what);
    const int ctx = 512, max_ctx = 1024, reps = 20;
    const std::vector<int> prompt = random_prompt(ctx, cfg.vocab, 3);
    auto be = gpu_backend(src, cfg, max_ctx);
    printf("weights on the GPU: %s\n", be->weight_dtype().c_str());
    const MemoryReport mem = be->memory();
    printf("memory: weights %.1f MiB, KV cache %.1f MiB (%d tokens), recurrent state %.2f MiB, verify state %llu bytes "
           "a row\n", mem.weights / 1048576.0, mem.kv_cache / 1048576.0, max_ctx, mem.recurrent_state / 1048576.0,
           (unsigned long long)mem.verify_bytes_per_node);
    // The decode step: the backend's fused decode graph, timed over 64 steps after the prompt.
    std::vector<double> per_step;
    for (int r = 0; r < 5; ++r) {
        be->reset();
        std::vector<int> out{be->forward(prompt.data(), ctx, nullptr)};
        be->synchronize();
        be->timer_start();
        be->decode(64, [](int) { return false; }, &out);
        per_step.push_back(be->timer_stop_ms() / 64);
    }
    const double step_ms = median(per_step);
    printf("context %d: decode step (%s graph) %.3f ms (median of 5 runs of 64 steps)\n", ctx,
           be->weight_dtype().rfind("gguf", 0) == 0 ? "unfused" : "fused", step_ms);
    printf("| B | rows | verify ms | / decode step | append forward of as many tokens, ms |\n|---|---|---|---|---|\n");
    be->reset();
    be->forward(prompt.data(), ctx, nullptr);
    for (int B : {1, 8, 16, 22, 32, 64}) {
        const VerifyRequest req = ddtree_like(B, ctx, cfg.vocab);
        const int n = int(req.tokens.size());
        // Backend::verify as an engine calls it: rows uploaded, forward, argmax of every row read back
        std::vector<double> ts;
        VerifyResult res;
        for (int r = 0; r < reps + 3; ++r) {
            be->timer_start();
            be->verify(req, &res);
            const double ms = be->timer_stop_ms();
            if (r >= 3) ts.push_back(ms);
        }
        const double v = median(ts);
        // the append (prefill) forward of as many tokens, each after the same prompt (4 reps: each needs the
        // prompt's prefill again, the bulk of this table's time on a 27B)
        std::vector<double> fs;
        for (int r = 0; r < 4; ++r) {
            be->reset();
            be->forward(prompt.data(), ctx, nullptr);
            be->synchronize();
            be->timer_start();
            be->forward(req.tokens.data(), n, nullptr);
            fs.push_back(be->timer_stop_ms());
        }
        be->reset();
        be->forward(prompt.data(), ctx, nullptr);
        printf("| %d | %d | %.3f | %.2f | %.3f |\n", B, n, v, v / step_ms, median(fs));
    }
    printf("delta_tree, one DeltaNet layer alone (medians of 20), ms: |");
    for (int B : {1, 22, 64}) printf(" B = %d: %.3f |", B, delta_tree_ms(B + 1, ddtree_like(B, 0, cfg.vocab).parents));
    printf("\n");
}

// `--time-verify PATH CTX[,CTX...] [B]`: at each context (a random prompt of CTX tokens, prefilled once),
// one verify forward of a DDTree-like tree of B + 1 rows (default B = 22) through Backend::verify (median of
// 8 after 2 warm-ups), then 16 decode steps of the backend's decode path (mean step); one table row a
// context, with the verify's first argmax ids (to compare two builds whose attention differs only in the
// order of the sums).
void time_verify(const TensorSource& src, const std::vector<int>& ctxs, int B) {
    const ModelConfig cfg = config_from_source(src);
    const int max_ctx = *std::max_element(ctxs.begin(), ctxs.end()) + B + 64;
    auto be = gpu_backend(src, cfg, max_ctx);
    printf("weights on the GPU: %s\n", be->weight_dtype().c_str());
    printf("| context | B | rows | prefill s | verify ms | decode step ms | verify argmax (first 8 rows) |\n"
           "|---|---|---|---|---|---|---|\n");
    for (int ctx : ctxs) {
        const std::vector<int> prompt = random_prompt(ctx, cfg.vocab, 3);
        be->reset();
        be->synchronize();
        auto t0 = std::chrono::steady_clock::now();
        std::vector<int> out{be->forward(prompt.data(), ctx, nullptr)};
        be->synchronize();
        const double prefill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const VerifyRequest req = ddtree_like(B, ctx, cfg.vocab);
        std::vector<double> ts;
        VerifyResult res;
        for (int r = 0; r < 10; ++r) {
            be->timer_start();
            be->verify(req, &res);
            const double ms = be->timer_stop_ms();
            if (r >= 2) ts.push_back(ms);
        }
        be->synchronize();
        be->timer_start();
        be->decode(16, [](int) { return false; }, &out);
        const double step_ms = be->timer_stop_ms() / 16;
        std::string ids;
        for (size_t i = 0; i < res.argmax.size() && i < 8; ++i) ids += (i ? " " : "") + std::to_string(res.argmax[i]);
        printf("| %d | %d | %d | %.2f | %.3f | %.3f | %s |\n", ctx, B, int(req.tokens.size()), prefill_s, median(ts),
               step_ms, ids.c_str());
        fflush(stdout);
    }
}

}  // namespace

int main(int argc, char** argv) {
    gpuDeviceProp p;
    GPU_CHECK(gpuGetDeviceProperties(&p, 0));
    printf("device: %s\n", p.name);
    try {
        if (argc > 1 && std::string(argv[1]) == "--qwen3") {
            exactness("qwen3 tiny", kQwen3, 5);
            outputs("qwen3 tiny", kQwen3, 6);
            scored();
            if (failures()) { printf("%d check(s) failed\n", failures()); return 1; }
            printf("GPU Qwen3 checks passed\n");
            return 0;
        }
        if (argc > 3 && std::string(argv[1]) == "--time-verify") {
            auto src = open_checkpoint(argv[2]);
            std::vector<int> ctxs;
            for (const char* c = argv[3]; *c;) {
                ctxs.push_back(std::atoi(c));
                while (*c && *c != ',') ++c;
                if (*c == ',') ++c;
            }
            if (ctxs.empty() || *std::min_element(ctxs.begin(), ctxs.end()) < 1) {
                printf("usage: --time-verify PATH CTX[,CTX...] [B]\n");
                return 2;
            }
            time_verify(*src, ctxs, argc > 4 ? std::max(1, std::atoi(argv[4])) : 22);
            return failures() ? 1 : 0;
        }
        // --time-model PATH: only the cost table, on that checkpoint (e.g. a synthetic 27B Q4_K_M GGUF)
        if (argc > 2 && std::string(argv[1]) == "--time-model") {
            auto src = open_checkpoint(argv[2]);
            timing(*src, argv[2]);
            return failures() ? 1 : 0;
        }
        exactness("qwen3.5 tiny", kTiny, 1);
        exactness("qwen3.5 odd", kOdd, 2);
        exactness("qwen3.5 tiny", kTiny, 1, DType::Q8_0);
        exactness("qwen3.5 tiny", kTiny, 1, DType::Q4_0);
        outputs("qwen3.5 tiny", kTiny, 3);
        outputs("qwen3.5 odd", kOdd, 4);
        two_models();
        exactness("qwen3 tiny", kQwen3, 5);
        outputs("qwen3 tiny", kQwen3, 6);
        if (argc > 1 && std::string(argv[1]) == "--time") {
            auto t0 = std::chrono::steady_clock::now();
            lbtest::MemCheckpoint src(k08b, 5);
            printf("synthetic Qwen3.5-0.8B (random weights, full shape) built in %.1f s\n",
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
            timing(src, "synthetic Qwen3.5-0.8B (bf16 weights)");
        }
    } catch (const EngineError& e) {
        printf("engine error %s: %s\n", e.kind.c_str(), e.what());
        return 1;
    }
    if (failures()) { printf("%d check(s) failed\n", failures()); return 1; }
    printf("GPU verify checks passed\n");
    return 0;
}
