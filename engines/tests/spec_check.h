// The scripted-tree check shared by the CPU verify tests (verify_tests.cpp) and the GPU one
// (verify_gpu_check.cu): an autoregressive run of a Backend records tokens, logit margins and the sequence
// state after every token; speculative rounds on another Backend of the same model (scripted trees whose
// correct path is known from the AR run: accepted depths 0..15 then random, wrong siblings at several
// depths with children, random extra branches, rows in a random parents-first order, every fourth round a
// chain) must commit exactly the AR tokens (a flip only at a near-tie of the AR logits) and leave the AR
// state after every commit.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "core/backend.h"

namespace spec_check {

using namespace lb;

inline int& failures() { static int n = 0; return n; }
#define CHECK(cond, ...) do { if (!(cond)) { ++spec_check::failures(); fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); } } while (0)

// The margin of the greedy choice: top-1 minus top-2 logit, relative to the logits' scale.
inline float margin(const std::vector<float>& l) {
    float a = -INFINITY, b = -INFINITY, scale = 0;
    for (float v : l) {
        scale = std::fmax(scale, std::fabs(v));
        if (v > a) { b = a; a = v; } else if (v > b) b = v;
    }
    return (a - b) / std::fmax(scale, 1e-30f);
}

struct ArRun {
    std::vector<int> prompt, tokens;   // tokens[0] from the prefill
    std::vector<float> margins;        // of the logits that chose tokens[i]
    std::vector<SequenceState> states;  // states[i]: after |prompt| + i tokens
};

inline ArRun ar_run(Backend& be, const std::vector<int>& prompt, int n_gen) {
    ArRun r;
    r.prompt = prompt;
    be.reset();
    std::vector<float> logits;
    r.tokens.push_back(be.forward(prompt.data(), int(prompt.size()), &logits));
    r.margins.push_back(margin(logits));
    for (int i = 0; i + 1 < n_gen; ++i) {
        r.states.emplace_back();
        be.export_state(&r.states.back());
        r.tokens.push_back(be.forward(&r.tokens.back(), 1, &logits));
        r.margins.push_back(margin(logits));
    }
    r.states.emplace_back();
    be.export_state(&r.states.back());
    return r;
}

// Largest |a - b| relative to the largest |b| of one state array.
inline double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
    if (a.size() != b.size()) return INFINITY;
    double d = 0, s = 0;
    for (size_t i = 0; i < a.size(); ++i) { d = std::fmax(d, std::fabs(double(a[i]) - b[i])); s = std::fmax(s, std::fabs(double(b[i]))); }
    return s > 0 ? d / s : d;
}

inline double state_diff(const SequenceState& got, const SequenceState& want) {
    if (got.length != want.length) return INFINITY;
    double worst = 0;
    for (size_t l = 0; l < want.k.size(); ++l) {
        worst = std::fmax(worst, rel_diff(got.k[l], want.k[l]));
        worst = std::fmax(worst, rel_diff(got.v[l], want.v[l]));
        worst = std::fmax(worst, rel_diff(got.recurrent[l], want.recurrent[l]));
        worst = std::fmax(worst, rel_diff(got.conv[l], want.conv[l]));
    }
    return worst;
}

inline constexpr float kNearTie = 2e-4f;    // relative logit margin below which a flip is rounding, not a bug
inline constexpr double kStateTol = 2e-4;   // relative state difference after commit

// The first index where `got` leaves the AR tokens; -1 when it does not.
inline int first_divergence(const std::vector<int>& got, const ArRun& ar) {
    for (size_t i = 0; i < got.size() && i < ar.tokens.size(); ++i)
        if (got[i] != ar.tokens[i]) return int(i);
    return -1;
}

struct TreeNode { int parent; int token; int depth; };

// Speculative rounds on `be` against the AR run: returns false (and reports) at a real mismatch.
// near_tie: relative AR logit margin below which a flipped token is rounding (the CPU's fp32 paths agree
// to ~1e-6; a GPU verify's batched bf16 GEMM rounds activations differently from the decode GEMV).
// state_tol: relative difference allowed between the committed and the AR state.
inline void spec_run(const std::string& name, int vocab, Backend& be, const ArRun& ar, uint32_t seed, double* worst_state,
                     int* rounds_done, float near_tie = kNearTie, double state_tol = kStateTol) {
    std::mt19937 rng(seed);
    const int V = vocab, n_gen = int(ar.tokens.size());
    auto other_token = [&](int not_this) { int t; do t = int(rng() % uint32_t(V)); while (t == not_this); return t; };
    be.reset();
    std::vector<int> out{be.forward(ar.prompt.data(), int(ar.prompt.size()), nullptr)};
    CHECK(out[0] == ar.tokens[0], "%s: prefill token", name.c_str());
    const int P = int(ar.prompt.size());
    int round = 0;
    while (true) {
        const int idx = int(out.size()) - 1;  // out.back() = ar.tokens[idx], the bonus not yet forwarded
        int a = round < 16 ? round : int(rng() % 12);
        if (idx + a + 1 >= n_gen) break;
        const bool chain = round % 4 == 3;
        // Nodes: 0 = root (the bonus), then the correct path, then wrong ones.
        std::vector<TreeNode> nodes{{-1, ar.tokens[size_t(idx)], 0}};
        std::vector<int> path_node{0};
        for (int d = 1; d <= a; ++d) {
            nodes.push_back({path_node.back(), ar.tokens[size_t(idx + d)], d});
            path_node.push_back(int(nodes.size()) - 1);
        }
        if (rng() % 10 < 7) nodes.push_back({path_node.back(), other_token(ar.tokens[size_t(idx + a + 1)]), a + 1});
        if (!chain) {
            // wrong siblings of the path at several depths, some with children of their own
            const int n_sib = 1 + int(rng() % 4);
            for (int s = 0; s < n_sib; ++s) {
                const int d = 1 + int(rng() % uint32_t(a + 1));
                nodes.push_back({path_node[size_t(d - 1)], other_token(ar.tokens[size_t(idx + d)]), d});
                const int sib = int(nodes.size()) - 1;
                for (int c = int(rng() % 3); c > 0; --c) nodes.push_back({sib, int(rng() % uint32_t(V)), d + 1});
            }
            // random branches off the wrong nodes
            for (int e = int(rng() % 6); e > 0 && nodes.size() > path_node.size(); --e) {
                const int at = int(path_node.size()) + int(rng() % uint32_t(nodes.size() - path_node.size()));
                nodes.push_back({at, int(rng() % uint32_t(V)), nodes[size_t(at)].depth + 1});
            }
        }
        // Rows: a random topological order (parents before children); a chain keeps node order.
        std::vector<int> row_of(nodes.size(), -1), order;
        if (chain) {
            for (size_t i = 0; i < nodes.size(); ++i) order.push_back(int(i));
        } else {
            std::vector<int> ready{0};
            while (!ready.empty()) {
                const size_t pick = rng() % ready.size();
                const int node = ready[pick];
                ready.erase(ready.begin() + long(pick));
                row_of[size_t(node)] = int(order.size());
                order.push_back(node);
                for (size_t c = 0; c < nodes.size(); ++c) if (nodes[c].parent == node) ready.push_back(int(c));
            }
        }
        for (size_t r = 0; r < order.size(); ++r) row_of[size_t(order[r])] = int(r);
        VerifyRequest req;
        for (int node : order) {
            req.tokens.push_back(nodes[size_t(node)].token);
            req.positions.push_back(be.length() + nodes[size_t(node)].depth);
            if (!chain) req.parents.push_back(nodes[size_t(node)].parent < 0 ? -1 : row_of[size_t(nodes[size_t(node)].parent)]);
        }
        VerifyResult res;
        be.verify(req, &res);
        // Walk from the root along the target's argmax.
        std::vector<int> path{0};
        const int n = int(order.size());
        while (true) {
            const int row = path.back(), want = res.argmax[size_t(row)];
            int next = -1;
            for (int c = 0; c < n && next < 0; ++c) {
                const int parent = chain ? c - 1 : req.parents[size_t(c)];
                if (parent == row && req.tokens[size_t(c)] == want) next = c;
            }
            if (next < 0) break;
            path.push_back(next);
        }
        be.commit(path);
        for (size_t i = 1; i < path.size(); ++i) out.push_back(req.tokens[size_t(path[i])]);
        out.push_back(res.argmax[size_t(path.back())]);
        const int div = first_divergence(out, ar);
        if (div >= 0) {
            if (ar.margins[size_t(div)] < near_tie) {
                printf("  %s: near-tie at token %d (margin %.2e): stop comparing there\n", name.c_str(), div, ar.margins[size_t(div)]);
                break;
            }
            CHECK(false, "%s round %d: token %d is %d, AR gives %d (margin %.2e)", name.c_str(), round, div, out[size_t(div)],
                  ar.tokens[size_t(div)], ar.margins[size_t(div)]);
            return;
        }
        CHECK(int(path.size()) == a + 1, "%s round %d: accepted %d rows, scripted %d", name.c_str(), round, int(path.size()), a + 1);
        SequenceState st;
        be.export_state(&st);
        const double diff = state_diff(st, ar.states[size_t(st.length - P)]);
        *worst_state = std::fmax(*worst_state, diff);
        CHECK(diff < state_tol, "%s round %d: state after commit differs from AR by %.2e (length %d)", name.c_str(), round, diff, st.length);
        ++round;
    }
    *rounds_done = round;
    // Continue autoregressively after the last commit: the AR tokens again.
    for (int step = 0; step < 8 && int(out.size()) < n_gen; ++step) out.push_back(be.forward(&out.back(), 1, nullptr));
    const int div = first_divergence(out, ar);
    CHECK(div < 0 || ar.margins[size_t(div)] < near_tie, "%s: decode after the last commit diverges at token %d", name.c_str(), div);
}

inline std::vector<int> random_prompt(int n, int vocab, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int> p;
    for (int i = 0; i < n; ++i) p.push_back(int(rng() % uint32_t(vocab)));
    return p;
}


}  // namespace spec_check
