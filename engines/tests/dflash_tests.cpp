// Unit checks of the DFlash engine's pieces that do not need the target: DDTree construction against a
// brute-force enumeration, chain / chain-seed shapes and ties, the greedy walk on scripted trees, the
// acceptance statistics, and z-lab's default target layers. Exit status 0 when all pass.
//
//   lucebench-dflash-tests                               the unit checks (CTest)
//   lucebench-dflash-tests draft-forward DRAFT IO OUT    runs the CPU draft over the rounds stored in IO
//       (a safetensors folder: features.R [n_R, feature_width], embed.R [block_size, hidden], lm_head
//       [vocab, hidden], R = 0..rounds-1, config.json {"rounds": N}) and writes, per round, the block's
//       hidden rows [block_size - 1, hidden] then their logits [block_size - 1, vocab] as raw fp32 to OUT.
//       tests/engines/test_dflash.py compares them with a PyTorch reference of the same forward.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "core/errors.h"
#include "core/tensor_source.h"
#include "dflash/ddtree.h"
#include "dflash/draft_model.h"
#include "dflash/walk.h"

using namespace lb::dflash;

static int failures = 0;
#define CHECK(cond, ...) do { if (!(cond)) { ++failures; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); } } while (0)

// Per-depth candidates from random distributions: each depth's log-probabilities are a log_softmax of
// random logits over `vocab` tokens, top `k` kept.
static std::vector<DepthCandidates> random_depths(std::mt19937& rng, int D, int vocab, int k, float sharpness) {
    std::normal_distribution<float> nd(0.f, sharpness);
    std::vector<DepthCandidates> depths;
    std::vector<float> logits(static_cast<size_t>(vocab));
    for (int d = 0; d < D; ++d) {
        for (auto& l : logits) l = nd(rng);
        depths.push_back(top_k_logprobs(logits.data(), vocab, k));
    }
    return depths;
}

// Every rank tuple up to depth D with ranks < K, scored the way build_ddtree scores them (the parent's
// cumulative sum plus the last log-probability, in float).
struct Prefix { std::vector<int> ranks; float score; };
static void enumerate(const std::vector<DepthCandidates>& depths, int K, std::vector<int>& ranks, float score,
                      std::vector<Prefix>* out) {
    const int d = int(ranks.size());  // depth of the prefix so far
    if (d == int(depths.size())) return;
    const int w = std::min<int>(K, int(depths[size_t(d)].tokens.size()));
    for (int r = 0; r < w; ++r) {
        ranks.push_back(r);
        const float s = score + depths[size_t(d)].logprobs[size_t(r)];
        out->push_back({ranks, s});
        enumerate(depths, K, ranks, s, out);
        ranks.pop_back();
    }
}

static std::vector<int> ranks_of(const DDTree& t, int slot) {
    std::vector<int> r;
    for (; slot > 0; slot = t.parent[size_t(slot)]) r.push_back(t.rank[size_t(slot)]);
    std::reverse(r.begin(), r.end());
    return r;
}

// Structure every tree must have: root at slot 0, parents before children, depth = parent's + 1, the
// token is the candidate of its rank at its depth, the cumulative log-probability adds up, siblings
// hold distinct tokens.
static void check_structure(const DDTree& t, const std::vector<DepthCandidates>& depths, int root, const char* what) {
    CHECK(t.size() >= 1 && t.tokens[0] == root && t.parent[0] == -1 && t.depth[0] == 0, "%s: root slot", what);
    for (int s = 1; s < t.size(); ++s) {
        const int p = t.parent[size_t(s)], d = t.depth[size_t(s)], r = t.rank[size_t(s)];
        CHECK(p >= 0 && p < s, "%s: slot %d parent %d not before it", what, s, p);
        if (p < 0 || p >= s) continue;
        CHECK(d == t.depth[size_t(p)] + 1, "%s: slot %d depth %d, parent depth %d", what, s, d, t.depth[size_t(p)]);
        CHECK(t.tokens[size_t(s)] == depths[size_t(d - 1)].tokens[size_t(r)], "%s: slot %d token", what, s);
        CHECK(t.logprob[size_t(s)] == t.logprob[size_t(p)] + depths[size_t(d - 1)].logprobs[size_t(r)], "%s: slot %d logprob", what, s);
    }
    auto ch = t.children();
    for (auto& c : ch)
        for (size_t i = 0; i < c.size(); ++i)
            for (size_t j = i + 1; j < c.size(); ++j)
                CHECK(t.tokens[size_t(c[i])] != t.tokens[size_t(c[j])], "%s: siblings with one token", what);
}

static void test_top_k() {
    std::vector<float> logits = {1.f, 3.f, 3.f, -2.f, 0.5f};
    auto c = top_k_logprobs(logits.data(), 5, 3);
    CHECK((c.tokens == std::vector<int>{1, 2, 0}), "top-k order with a tie: %d %d %d", c.tokens[0], c.tokens[1], c.tokens[2]);
    double z = 0;
    for (float l : logits) z += std::exp(double(l));
    CHECK(std::fabs(c.logprobs[0] - float(3.0 - std::log(z))) < 1e-6f, "log-prob %g", c.logprobs[0]);
    CHECK(top_k_logprobs(logits.data(), 5, 9).tokens.size() == 5, "k above vocab");
}

static void test_best_first_vs_brute_force() {
    std::mt19937 rng(7);
    int trials = 0;
    for (int D : {1, 2, 4, 6})
        for (int K : {1, 2, 3, 5})
            for (int B : {0, 1, 3, 7, 15, 22, 40})
                for (float sharp : {0.5f, 3.f}) {
                    auto depths = random_depths(rng, D, 11, 8, sharp);
                    DDTreeOptions opt;
                    opt.budget = B;
                    opt.top_k = K;
                    opt.chain_seed = false;
                    DDTree t = build_ddtree(99, depths, opt);
                    check_structure(t, depths, 99, "best-first");
                    const int Keff = std::min(B, K);
                    std::vector<Prefix> all;
                    std::vector<int> ranks;
                    enumerate(depths, Keff, ranks, 0.f, &all);
                    std::sort(all.begin(), all.end(), [](const Prefix& a, const Prefix& b) { return a.score > b.score; });
                    const int n = std::min<int>(B, int(all.size()));
                    CHECK(t.size() == n + 1, "D%d K%d B%d: %d nodes, want %d", D, K, B, t.size() - 1, n);
                    // The same nodes as the B most probable prefixes (random logits: no ties).
                    std::vector<std::vector<int>> got, want;
                    for (int s = 1; s < t.size(); ++s) got.push_back(ranks_of(t, s));
                    for (int i = 0; i < n; ++i) want.push_back(all[size_t(i)].ranks);
                    std::sort(got.begin(), got.end());
                    std::sort(want.begin(), want.end());
                    CHECK(got == want, "D%d K%d B%d sharp %g: tree differs from the %d most probable prefixes", D, K, B, sharp, n);
                    // Popped best first: cumulative log-probability never increases along the slots.
                    for (int s = 2; s < t.size(); ++s)
                        CHECK(t.logprob[size_t(s)] <= t.logprob[size_t(s - 1)], "D%d K%d B%d: slot %d out of order", D, K, B, s);
                    ++trials;
                }
    CHECK(trials == 224, "trials %d", trials);
}

static void test_chain_seed_vs_brute_force() {
    std::mt19937 rng(11);
    for (int D : {3, 5, 7})  // 4^7 prefixes at most for the enumeration
        for (int B : {2, 7, 15, 22, 40})
            for (int K : {3, 4}) {
                auto depths = random_depths(rng, D, 13, 8, 2.f);
                DDTreeOptions opt;
                opt.budget = B;
                opt.top_k = K;
                opt.chain_seed = true;
                DDTree t = build_ddtree(5, depths, opt);
                check_structure(t, depths, 5, "chain seed");
                const int L = std::min(B, D);
                // Slots 1..L are the top-1 chain.
                for (int s = 1; s <= L && s < t.size(); ++s)
                    CHECK(t.depth[size_t(s)] == s && t.rank[size_t(s)] == 0 && t.parent[size_t(s)] == s - 1,
                          "D%d B%d: slot %d is not the chain's", D, B, s);
                // The rest: the B - L most probable prefixes off the chain.
                std::vector<Prefix> all;
                std::vector<int> ranks;
                enumerate(depths, std::min(B, K), ranks, 0.f, &all);
                std::vector<Prefix> off;
                for (auto& p : all)
                    if (std::any_of(p.ranks.begin(), p.ranks.end(), [](int r) { return r != 0; })) off.push_back(p);
                std::sort(off.begin(), off.end(), [](const Prefix& a, const Prefix& b) { return a.score > b.score; });
                const int n = std::min<int>(B - L, int(off.size()));
                CHECK(t.size() == 1 + L + n, "D%d B%d K%d: %d nodes", D, B, K, t.size() - 1);
                std::vector<std::vector<int>> got, want;
                for (int s = L + 1; s < t.size(); ++s) got.push_back(ranks_of(t, s));
                for (int i = 0; i < n; ++i) want.push_back(off[size_t(i)].ranks);
                std::sort(got.begin(), got.end());
                std::sort(want.begin(), want.end());
                CHECK(got == want, "D%d B%d K%d: off-chain nodes differ from the best-first ones", D, B, K);
            }
}

static void test_chain_mode_and_caps() {
    std::mt19937 rng(3);
    auto depths = random_depths(rng, 15, 50, 8, 2.f);
    for (int B : {1, 8, 15, 22, 40}) {
        DDTreeOptions opt;
        opt.budget = B;
        opt.chain = true;
        DDTree t = build_ddtree(1, depths, opt);
        check_structure(t, depths, 1, "chain");
        CHECK(t.size() == 1 + std::min(B, 15), "chain B%d: %d nodes", B, t.size() - 1);
        for (int s = 1; s < t.size(); ++s)
            CHECK(t.parent[size_t(s)] == s - 1 && t.rank[size_t(s)] == 0 && t.depth[size_t(s)] == s, "chain slot %d", s);
    }
    // The top-K cap: no rank at or above it, for either growth.
    for (bool seed : {false, true}) {
        DDTreeOptions opt;
        opt.budget = 40;
        opt.top_k = 3;
        opt.chain_seed = seed;
        DDTree t = build_ddtree(1, depths, opt);
        CHECK(t.size() == 41, "budget 40: %d nodes", t.size() - 1);
        for (int s = 1; s < t.size(); ++s) CHECK(t.rank[size_t(s)] < 3, "rank %d above the cap", t.rank[size_t(s)]);
    }
    // K = min(B, top_k): a budget of 2 never uses the third candidate.
    DDTreeOptions small;
    small.budget = 2;
    small.chain_seed = false;
    DDTree t = build_ddtree(1, depths, small);
    for (int s = 1; s < t.size(); ++s) CHECK(t.rank[size_t(s)] < 2, "budget 2 used rank %d", t.rank[size_t(s)]);
    // A draft that gave fewer candidates than K.
    std::vector<DepthCandidates> thin = {{{4}, {-0.1f}}, {{6, 7}, {-0.2f, -1.f}}};
    DDTreeOptions o;
    o.budget = 10;
    o.chain_seed = false;
    DDTree th = build_ddtree(3, thin, o);
    CHECK(th.size() == 1 + 3, "thin candidates: %d nodes", th.size() - 1);
    // Budget 0: the root alone.
    o.budget = 0;
    CHECK(build_ddtree(3, thin, o).size() == 1, "budget 0");
}

static void test_ties() {
    // Four equally likely tokens at each of three depths.
    const float lp = std::log(0.25f);
    std::vector<DepthCandidates> depths(3, DepthCandidates{{10, 11, 12, 13}, {lp, lp, lp, lp}});
    for (int d = 0; d < 3; ++d)
        for (auto& tok : depths[size_t(d)].tokens) tok += 10 * d;
    DDTreeOptions opt;
    opt.budget = 7;
    opt.top_k = 4;
    opt.chain_seed = false;
    DDTree t = build_ddtree(0, depths, opt);
    // Equal scores within a depth pop in rank-tuple order: depth 1's four, then (0,0), (0,1), (0,2).
    std::vector<std::vector<int>> want = {{0}, {1}, {2}, {3}, {0, 0}, {0, 1}, {0, 2}};
    for (int s = 1; s < t.size(); ++s) CHECK(ranks_of(t, s) == want[size_t(s - 1)], "tie order at slot %d", s);
    DDTree again = build_ddtree(0, depths, opt);
    CHECK(again.tokens == t.tokens && again.parent == t.parent, "ties: not deterministic");
    // Equal scores across depths pop the shallower first: (1) and (0,0) both score -2.
    std::vector<DepthCandidates> cross = {{{1, 2}, {-1.f, -2.f}}, {{3, 4}, {-1.f, -3.f}}};
    opt.budget = 3;
    DDTree x = build_ddtree(0, cross, opt);
    CHECK(x.size() == 4 && ranks_of(x, 2) == std::vector<int>{1} && ranks_of(x, 3) == (std::vector<int>{0, 0}),
          "cross-depth tie order");
    // Probability 1 at every depth: a child scores as much as its parent and still comes after it.
    std::vector<DepthCandidates> sure(4, DepthCandidates{{1, 2}, {0.f, -INFINITY}});
    opt.budget = 4;
    DDTree c = build_ddtree(0, sure, opt);
    CHECK(c.size() == 5, "certain chain: %d nodes", c.size() - 1);
    for (int s = 1; s < c.size(); ++s) CHECK(c.parent[size_t(s)] == s - 1 && c.rank[size_t(s)] == 0, "certain chain slot %d", s);
}

static DDTree scripted_tree() {
    // slot: 0 root(100) ; 1 (a=1, d1) ; 2 (b=2, d1) ; 3 (c=3, parent 1, d2) ; 4 (d=4, parent 1, d2) ;
    //       5 (e=5, parent 3, d3) ; 6 (f=6, parent 2, d2)
    DDTree t;
    t.tokens = {100, 1, 2, 3, 4, 5, 6};
    t.parent = {-1, 0, 0, 1, 1, 3, 2};
    t.depth = {0, 1, 1, 2, 2, 3, 2};
    t.rank = {-1, 0, 1, 0, 1, 0, 0};
    t.logprob = {0, -.1f, -1, -.3f, -1.2f, -.5f, -1.5f};
    return t;
}

static void test_walk() {
    DDTree t = scripted_tree();
    {  // root -> 1 -> 3 -> 5, then argmax 77 at slot 5 is the bonus
        std::vector<int> am = {1, 3, 0, 5, 0, 77, 0};
        WalkResult w = walk_tree(t, am.data());
        CHECK((w.path == std::vector<int>{0, 1, 3, 5}) && w.bonus == 77 && w.accepted() == 3, "deep path");
        CHECK((w.committed_tokens(t) == std::vector<int>{1, 3, 5, 77}), "committed tokens");
    }
    {  // root -> 2 (the second branch) -> 6, bonus 9
        std::vector<int> am = {2, 0, 6, 0, 0, 0, 9};
        WalkResult w = walk_tree(t, am.data());
        CHECK((w.path == std::vector<int>{0, 2, 6}) && w.bonus == 9, "second branch");
    }
    {  // root -> 1 -> 4 (second child), leaf: bonus is slot 4's argmax
        std::vector<int> am = {1, 4, 0, 0, 8, 0, 0};
        WalkResult w = walk_tree(t, am.data());
        CHECK((w.path == std::vector<int>{0, 1, 4}) && w.bonus == 8, "second child");
    }
    {  // nothing matches at the root: AL 1, the bonus is the root's argmax
        std::vector<int> am = {42, 3, 6, 5, 0, 0, 0};
        WalkResult w = walk_tree(t, am.data());
        CHECK((w.path == std::vector<int>{0}) && w.bonus == 42 && w.accepted() == 0, "reject at root");
        CHECK((w.committed_tokens(t) == std::vector<int>{42}), "bonus only");
    }
    {  // argmax of a slot off the walk never matters: slot 6 says 1 but the path went 0 -> 1
        std::vector<int> am = {1, 99, 6, 0, 0, 0, 1};
        WalkResult w = walk_tree(t, am.data());
        CHECK((w.path == std::vector<int>{0, 1}) && w.bonus == 99, "off-path argmax");
    }
}

static void test_stats() {
    AcceptanceStats s(4);
    s.add(0);
    s.add(4);
    s.add(2);
    s.add(4, 3);  // cut short by a stop token
    CHECK(s.rounds == 4 && s.committed == 1 + 5 + 3 + 3, "rounds %lld committed %lld", (long long)s.rounds, (long long)s.committed);
    // The cut round counts depths 1 and 2 only: the three views agree as protocol.md requires.
    CHECK((s.accepted_at_depth == std::vector<int64_t>{0, 3, 3, 1, 1}), "per depth");
    CHECK((s.al_histogram == std::vector<int64_t>{0, 1, 0, 2, 0, 1}), "histogram");
    for (int d = 1; d <= 4; ++d) {
        int64_t tail = 0;
        for (int k = d + 1; k <= 5; ++k) tail += s.al_histogram[size_t(k)];
        CHECK(s.accepted_at_depth[size_t(d)] == tail, "depth %d: %lld vs histogram tail %lld", d,
              (long long)s.accepted_at_depth[size_t(d)], (long long)tail);
    }
    lb::Json j = s.to_json();
    CHECK(j.get("acceptance_length")->as_number() == 3.0, "AL %g", j.get("acceptance_length")->as_number());
    CHECK(j.get("accepted_per_depth")->size() == 4 && j.get("al_histogram")->size() == 6, "json arrays");
    CHECK(j.get("al_histogram")->items()[0].as_int() == 0 && j.get("time_ms")->get("verify"), "histogram entry 0, time_ms");
    bool threw = false;
    try { s.add(5); } catch (const lb::EngineError&) { threw = true; }
    CHECK(threw, "accepted beyond max depth must throw");
}

static void test_default_layer_ids() {
    CHECK((default_target_layer_ids(64, 5) == std::vector<int>{1, 16, 31, 46, 61}), "27B");
    CHECK((default_target_layer_ids(32, 5) == std::vector<int>{1, 8, 15, 22, 29}), "4B");
    CHECK((default_target_layer_ids(36, 5) == std::vector<int>{1, 9, 17, 25, 33}), "8B");
    CHECK((default_target_layer_ids(10, 5) == std::vector<int>{1, 2, 4, 6, 7}), "halves round to even");
    CHECK((default_target_layer_ids(24, 1) == std::vector<int>{12}), "one layer");
}

static int draft_forward(const char* draft_dir, const char* io_dir, const char* out_path) {
    try {
        auto src = lb::open_checkpoint(draft_dir);
        DraftConfig cfg = draft_config_from_source(*src);
        DraftModelCpu draft;
        draft.load(*src, cfg);
        auto io = lb::open_checkpoint(io_dir);
        const int rounds = int(io->metadata().get("rounds")->as_int());
        const lb::TensorInfo* head = io->find("lm_head");
        const int vocab = int(head->shape[0]);
        std::vector<float> lm_head = io->read_f32(*head);
        int total = 0;
        for (int r = 0; r < rounds; ++r) total += int(io->find("features." + std::to_string(r))->shape[0]);
        draft.allocate(total);
        FILE* out = fopen(out_path, "wb");
        if (!out) { fprintf(stderr, "cannot write %s\n", out_path); return 1; }
        const int n = cfg.block_size - 1;
        std::vector<float> hidden(size_t(n) * cfg.hidden), logits(size_t(n) * vocab);
        for (int r = 0; r < rounds; ++r) {
            const lb::TensorInfo& f = *io->find("features." + std::to_string(r));
            draft.add_context(io->read_f32(f).data(), int(f.shape[0]));
            draft.forward_block(io->read_f32(*io->find("embed." + std::to_string(r))).data(), hidden.data());
            draft.logits(hidden.data(), n, lm_head.data(), vocab, logits.data());
            fwrite(hidden.data(), sizeof(float), hidden.size(), out);
            fwrite(logits.data(), sizeof(float), logits.size(), out);
        }
        fclose(out);
        fprintf(stderr, "draft: %d layers, hidden %d, %d/%d heads x %d, block %d, %d features of %d, context %d\n",
                cfg.n_layers, cfg.hidden, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.block_size, cfg.n_features(),
                cfg.target_hidden, draft.context_length());
        return 0;
    } catch (const lb::EngineError& e) {
        fprintf(stderr, "error (%s): %s\n", e.kind.c_str(), e.what());
        return 2;
    }
}

int main(int argc, char** argv) {
    if (argc == 5 && std::strcmp(argv[1], "draft-forward") == 0) return draft_forward(argv[2], argv[3], argv[4]);
    if (argc != 1) {
        fprintf(stderr, "usage: %s [draft-forward DRAFT_DIR IO_DIR OUT_FILE]\n", argv[0]);
        return 2;
    }
    test_top_k();
    test_best_first_vs_brute_force();
    test_chain_seed_vs_brute_force();
    test_chain_mode_and_caps();
    test_ties();
    test_walk();
    test_stats();
    test_default_layer_ids();
    if (failures) fprintf(stderr, "%d check(s) failed\n", failures);
    else fprintf(stderr, "dflash tests: all passed\n");
    return failures ? 1 : 0;
}
