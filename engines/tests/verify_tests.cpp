// Verify forward + commit against autoregressive decoding, on the CPU backend and random-weight models
// (Qwen3.5 hybrids and Qwen3 dense): scripted trees whose correct path is known from an AR run
// (accepted depths 0..15, wrong siblings at several depths, random extra branches, chains), committed
// and continued, must give exactly the AR greedy tokens (up to the first near-tie of the AR logits), and
// after every commit the KV rows, DeltaNet and conv states must equal the AR states at that length.
// Also: two models in one process, truncate, out rows / top-k / features. Exit status 0 when all pass.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/errors.h"
#include "core/json.h"
#include "mem_checkpoint.h"
#include "spec_check.h"

using namespace lb;

using namespace spec_check;

struct Model {
    std::string name;
    std::unique_ptr<lbtest::MemCheckpoint> src;
    ModelConfig cfg;
};

static Model make_model(const std::string& name, const std::string& config, uint32_t seed) {
    Model m;
    m.name = name;
    m.src = std::make_unique<lbtest::MemCheckpoint>(config, seed);
    m.cfg = config_from_source(*m.src);
    return m;
}

static std::unique_ptr<Backend> start(const Model& m, int max_ctx) {
    auto be = make_cpu_backend();
    be->load(*m.src, m.cfg, nullptr);
    be->allocate(max_ctx, DType::F32, DType::F32);
    return be;
}

static void test_verify_exact(const Model& m) {
    const int n_gen = 200, max_ctx = 320;
    auto ar_be = start(m, max_ctx);
    const ArRun ar = ar_run(*ar_be, random_prompt(9, m.cfg.vocab, 7), n_gen);
    std::vector<int> distinct = ar.tokens;
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    CHECK(distinct.size() > 20, "%s: the AR run uses only %zu distinct tokens (weights not varied enough)", m.name.c_str(), distinct.size());
    auto spec_be = start(m, max_ctx);
    double worst = 0;
    int rounds = 0;
    spec_run(m.name, m.cfg.vocab, *spec_be, ar, 11, &worst, &rounds);
    CHECK(rounds >= 16, "%s: only %d rounds compared (every depth 0..15 must be)", m.name.c_str(), rounds);
    printf("  %s: %d verify rounds == AR greedy, worst state difference after commit %.2e\n", m.name.c_str(), rounds, worst);
}

// Outputs of one verify: chosen rows only, logits, top-k log-probabilities and features agree with the
// all-rows verify and with an append forward of the same chain.
static void test_verify_outputs(const Model& m) {
    auto be = start(m, 64);
    const std::vector<int> prompt = random_prompt(12, m.cfg.vocab, 3);
    std::vector<float> fwd_logits;
    const int fwd = be->forward(prompt.data(), int(prompt.size()), &fwd_logits);
    be->reset();
    VerifyRequest req;
    req.tokens = prompt;
    for (int i = 0; i < int(prompt.size()); ++i) req.positions.push_back(i);
    req.want_logits = true;
    req.top_k = 5;
    req.feature_layers = {0, m.cfg.n_layers / 2};
    VerifyResult all;
    be->verify(req, &all);
    const int last = int(prompt.size()) - 1, V = m.cfg.vocab, H = m.cfg.hidden;
    CHECK(all.argmax[size_t(last)] == fwd, "%s: verify's last-row argmax vs forward", m.name.c_str());
    std::vector<float> vl(all.logits.begin() + long(last) * V, all.logits.begin() + long(last + 1) * V);
    CHECK(rel_diff(vl, fwd_logits) < 1e-4, "%s: verify logits vs forward: %.2e", m.name.c_str(), rel_diff(vl, fwd_logits));
    for (int r = 0; r <= last; ++r) {
        const float* lg = &all.logits[size_t(r) * V];
        double lse = 0, mx = *std::max_element(lg, lg + V);
        for (int i = 0; i < V; ++i) lse += std::exp(double(lg[i]) - mx);
        lse = mx + std::log(lse);
        CHECK(all.top_ids[size_t(r) * 5] == all.argmax[size_t(r)], "%s: top-1 is the argmax", m.name.c_str());
        for (int j = 0; j < 5; ++j) {
            const int id = all.top_ids[size_t(r) * 5 + j];
            CHECK(std::fabs(all.top_logprobs[size_t(r) * 5 + j] - (lg[id] - lse)) < 1e-4, "%s: top-k log-prob", m.name.c_str());
            if (j) CHECK(all.top_logprobs[size_t(r) * 5 + j] <= all.top_logprobs[size_t(r) * 5 + j - 1], "%s: top-k order", m.name.c_str());
        }
    }
    req.out_rows = {last, 2};
    VerifyResult some;
    be->verify(req, &some);
    CHECK(some.argmax.size() == 2 && some.argmax[0] == all.argmax[size_t(last)] && some.argmax[1] == all.argmax[2], "%s: out rows", m.name.c_str());
    CHECK(some.features.size() == size_t(2 * 2 * H), "%s: features size", m.name.c_str());
    for (int f = 0; f < 2; ++f) {
        std::vector<float> a(some.features.begin() + long((0 * 2 + f) * H), some.features.begin() + long((0 * 2 + f + 1) * H));
        std::vector<float> b(all.features.begin() + long((last * 2 + f) * H), all.features.begin() + long((last * 2 + f + 1) * H));
        CHECK(a == b, "%s: features of a chosen row equal the all-rows verify's", m.name.c_str());
    }
    // A row's outputs depend only on its ancestors: a tree with an unrelated branch inserted before the
    // last row changes nothing for it.
    VerifyRequest tree;
    tree.tokens = prompt;
    tree.positions = req.positions;
    for (int i = 0; i < int(prompt.size()); ++i) tree.parents.push_back(i - 1);
    tree.tokens.insert(tree.tokens.begin() + last, {5, 6, 7});
    tree.positions.insert(tree.positions.begin() + last, {last, last + 1, last});
    tree.parents.insert(tree.parents.begin() + last, {last - 1, last, last - 1});
    tree.parents[size_t(last + 3)] = last - 1;
    tree.out_rows = {last + 3};
    tree.feature_layers = req.feature_layers;
    tree.want_logits = true;
    VerifyResult tr;
    be->verify(tree, &tr);
    std::vector<float> tl(tr.logits.begin(), tr.logits.end());
    CHECK(tr.argmax[0] == fwd && rel_diff(tl, fwd_logits) < 1e-4, "%s: extra branch changed a row's logits (%.2e)", m.name.c_str(), rel_diff(tl, fwd_logits));
}

// Two models (and two sequences of one model) in one process, interleaved step by step, give what each
// gives alone.
static void test_two_models(const Model& a, const Model& b) {
    auto ra = start(a, 64), rb = start(b, 64);
    const auto pa = random_prompt(6, a.cfg.vocab, 1), pb = random_prompt(5, b.cfg.vocab, 2);
    const ArRun alone_a = ar_run(*ra, pa, 20), alone_b = ar_run(*rb, pb, 20);
    auto xa = start(a, 64), xb = start(b, 64);
    std::vector<int> ta{xa->forward(pa.data(), int(pa.size()), nullptr)}, tb{xb->forward(pb.data(), int(pb.size()), nullptr)};
    for (int i = 1; i < 20; ++i) {
        ta.push_back(xa->forward(&ta.back(), 1, nullptr));
        tb.push_back(xb->forward(&tb.back(), 1, nullptr));
    }
    CHECK(ta == alone_a.tokens && tb == alone_b.tokens, "interleaved models differ from their solo runs");
}

static void test_truncate(const Model& dense, const Model& hybrid) {
    auto be = start(dense, 64);
    const auto p = random_prompt(7, dense.cfg.vocab, 4);
    const ArRun ar = ar_run(*be, p, 12);
    be->truncate(int(p.size()) + 5);  // keep the prompt and 5 generated tokens: the next input is tokens[5]
    std::vector<int> again{ar.tokens.begin(), ar.tokens.begin() + 6};
    for (int i = 6; i < 12; ++i) again.push_back(be->forward(&again.back(), 1, nullptr));
    CHECK(again == ar.tokens, "%s: decode after truncate differs", dense.name.c_str());
    SequenceState st;
    be->export_state(&st);
    CHECK(state_diff(st, ar.states.back()) < 1e-6, "%s: KV after truncate + decode", dense.name.c_str());
    auto hb = start(hybrid, 64);
    hb->forward(p.data(), int(p.size()), nullptr);
    bool threw = false;
    try { hb->truncate(3); } catch (const EngineError& e) { threw = e.kind == "unsupported"; }
    CHECK(threw, "truncating a DeltaNet model must be refused");
}

static void test_bad_requests(const Model& m) {
    auto be = start(m, 16);
    auto expect = [&](const char* what, const std::string& kind, const std::function<void()>& f) {
        std::string got = "none";
        try { f(); } catch (const EngineError& e) { got = e.kind; }
        CHECK(got == kind, "%s: %s raised %s, expected %s", m.name.c_str(), what, got.c_str(), kind.c_str());
    };
    expect("commit without verify", "bad_request", [&] { be->commit({0}); });
    VerifyRequest r;
    r.tokens = {1, 2, 3};
    r.positions = {0, 1, 1};
    r.parents = {-1, 0, 2};
    expect("parent after child", "bad_request", [&] { VerifyResult o; be->verify(r, &o); });
    r.parents = {-1, 0, 0};
    VerifyResult o;
    be->verify(r, &o);
    expect("path that is not a chain", "bad_request", [&] { be->commit({0, 1, 2}); });
    r.positions = {0, 2, 1};
    be->verify(r, &o);
    expect("path at the wrong positions", "bad_request", [&] { be->commit({0, 1}); });
    r.tokens.assign(20, 1);
    r.positions.assign(20, 0);
    r.parents.clear();
    expect("verify past max_ctx", "context_overflow", [&] { be->verify(r, &o); });
}

// `lucebench-verify-tests features MODEL LAYERS TOKENS` (comma-separated lists): one chain verify of TOKENS
// from an empty sequence on the cpu backend; prints {"argmax", "logits" [rows x vocab], "features" [rows x
// layers x hidden]} as one JSON line, for tests/engines/test_verify.py to compare with transformers.
static std::vector<int> int_list(const std::string& s) {
    std::vector<int> out;
    size_t i = 0;
    while (i < s.size()) {
        size_t j = s.find(',', i);
        if (j == std::string::npos) j = s.size();
        if (j > i) out.push_back(std::stoi(s.substr(i, j - i)));
        i = j + 1;
    }
    return out;
}

static int print_features(const char* model, const char* layers, const char* tokens) {
    try {
        auto src = open_checkpoint(model);
        const ModelConfig cfg = config_from_source(*src);
        auto be = make_cpu_backend();
        be->load(*src, cfg, nullptr);
        VerifyRequest req;
        req.tokens = int_list(tokens);
        req.feature_layers = int_list(layers);
        for (int i = 0; i < int(req.tokens.size()); ++i) req.positions.push_back(i);
        req.want_logits = true;
        be->allocate(int(req.tokens.size()), DType::F32, DType::F32);
        VerifyResult res;
        be->verify(req, &res);
        Json out = Json::object(), am = Json::array(), lg = Json::array(), ft = Json::array();
        for (int v : res.argmax) am.push_back(Json(v));
        for (float v : res.logits) lg.push_back(Json(double(v)));
        for (float v : res.features) ft.push_back(Json(double(v)));
        out["argmax"] = am;
        out["logits"] = lg;
        out["features"] = ft;
        printf("%s\n", out.dump().c_str());
        return 0;
    } catch (const std::exception& e) {
        fprintf(stderr, "%s\n", e.what());
        return 1;
    }
}

int main(int argc, char** argv) {
    if (argc == 5 && std::string(argv[1]) == "features") return print_features(argv[2], argv[3], argv[4]);
    const Model hybrid = make_model("qwen3.5 tiny", R"({"model_type": "qwen3_5_text", "vocab_size": 301,
        "hidden_size": 48, "intermediate_size": 80, "num_hidden_layers": 4, "num_attention_heads": 3,
        "num_key_value_heads": 1, "head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "linear_key_head_dim": 8, "linear_value_head_dim": 12, "linear_conv_kernel_dim": 4, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": false, "layer_types": ["linear_attention", "linear_attention", "full_attention", "linear_attention"],
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25}})", 1);
    const Model odd = make_model("qwen3.5 odd", R"({"model_type": "qwen3_5_text", "vocab_size": 263,
        "hidden_size": 40, "intermediate_size": 56, "num_hidden_layers": 5, "num_attention_heads": 2,
        "num_key_value_heads": 2, "head_dim": 20, "linear_num_key_heads": 1, "linear_num_value_heads": 3,
        "linear_key_head_dim": 12, "linear_value_head_dim": 6, "linear_conv_kernel_dim": 3, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": true, "layer_types": ["full_attention", "linear_attention", "linear_attention", "full_attention", "linear_attention"],
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.5}})", 2);
    const Model dense = make_model("qwen3 tiny", R"({"model_type": "qwen3", "vocab_size": 257, "hidden_size": 40,
        "intermediate_size": 72, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 12, "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "rope_theta": 1000000.0})", 3);
    for (const Model* m : {&hybrid, &odd, &dense}) {
        test_verify_exact(*m);
        test_verify_outputs(*m);
    }
    test_two_models(hybrid, dense);
    test_truncate(dense, hybrid);
    test_bad_requests(hybrid);
    if (failures()) { fprintf(stderr, "%d check(s) failed\n", failures()); return 1; }
    printf("verify tests passed\n");
    return 0;
}
