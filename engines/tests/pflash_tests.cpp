// Unit checks of PFlash's compressor on scripted inputs (engines/pflash/compress.h): the importance
// reduction, the average pool, the chunk selection (budget, forced head / tail / anchor chunks, order) and
// the character-offset bridge. The scoring forward itself is checked against a numpy reference in
// tests/engines/test_pflash.py. Exit status 0 when all pass.
#include <cmath>
#include <cstdio>
#include <algorithm>
#include <numeric>
#include <vector>

#include "pflash/compress.h"

static int failures = 0;
#define CHECK(cond, ...) do { if (!(cond)) { ++failures; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); } } while (0)

using lb::pflash::Rule;

static void test_importance_and_pool() {
    lb::TailScores s;
    s.n_tail = 2;
    s.ctx = 3;
    s.layers = {0, 2};
    // [layer, row, ctx]
    s.probs = {0.1f, 0.5f, 0.4f,   0.2f, 0.2f, 0.6f,     // layer 0
               0.3f, 0.1f, 0.6f,   0.1f, 0.7f, 0.2f};    // layer 2
    auto imp = lb::pflash::importance(s);
    // max over layers per row: row0 {0.3, 0.5, 0.6}, row1 {0.2, 0.7, 0.6}; mean over rows
    CHECK(std::fabs(imp[0] - 0.25f) < 1e-6f && std::fabs(imp[1] - 0.6f) < 1e-6f && std::fabs(imp[2] - 0.6f) < 1e-6f,
          "importance %g %g %g", imp[0], imp[1], imp[2]);
    std::vector<float> x = {3, 0, 0, 6};
    auto p = lb::pflash::smooth(x, 3);  // zero padded, always divided by 3
    CHECK(std::fabs(p[0] - 1.f) < 1e-6f && std::fabs(p[1] - 1.f) < 1e-6f && std::fabs(p[2] - 2.f) < 1e-6f &&
          std::fabs(p[3] - 2.f) < 1e-6f, "pool %g %g %g %g", p[0], p[1], p[2], p[3]);
}

// Distinct token ids so that no anchor fires unless a test plants one.
static std::vector<int> distinct(int n) { std::vector<int> t(static_cast<size_t>(n)); std::iota(t.begin(), t.end(), 1000); return t; }

static void test_selection_budget_and_forced() {
    Rule r;
    const int n = 100 * 32 - 5;  // 100 chunks, the last one short
    std::vector<float> score(size_t(n), 0.f);
    // chunks 40 and 60 score highest, then 50
    for (int i = 0; i < 32; ++i) { score[size_t(40 * 32 + i)] = 3; score[size_t(60 * 32 + i)] = 2; score[size_t(50 * 32 + i)] = 1; }
    auto sel = lb::pflash::select_chunks(score, distinct(n), 0.35, r);
    CHECK(sel.n_chunks == 100 && sel.budget == 35, "chunks %d budget %d", sel.n_chunks, sel.budget);
    CHECK(sel.forced.size() == 32, "forced head 8 + tail 24, got %zu", sel.forced.size());
    CHECK(int(sel.kept.size()) == 35, "kept %zu", sel.kept.size());
    auto has = [&](int c) { for (int k : sel.kept) if (k == c) return true; return false; };
    CHECK(has(0) && has(7) && has(76) && has(99) && !has(8) && !has(75), "head and tail forced");
    CHECK(has(40) && has(60) && has(50), "the three free slots go to the three best chunks");
    CHECK(std::is_sorted(sel.kept.begin(), sel.kept.end()), "kept ascending");
    // a small budget never drops forced chunks; at least one chunk
    auto tiny = lb::pflash::select_chunks(score, distinct(n), 0.001, r);
    CHECK(tiny.budget == 1 && tiny.kept.size() == 32, "forced beyond the budget: %zu", tiny.kept.size());
    auto one = lb::pflash::select_chunks(std::vector<float>(5, 0.f), distinct(5), 0.05, r);
    CHECK(one.n_chunks == 1 && one.kept.size() == 1, "one chunk");
    auto all = lb::pflash::select_chunks(score, distinct(n), 1.0, r);
    CHECK(all.kept.size() == 100, "keep 1.0 keeps every chunk");
}

static void test_anchors() {
    Rule r;
    const int n = 80 * 32;
    std::vector<int> tok = distinct(n);
    // a 4-gram of the last 96 tokens that occurs twice earlier (chunks 20 and 30), one that occurs 9 times
    const int q = n - 50;
    const int gram[4] = {7, 8, 9, 10}, many[4] = {11, 12, 13, 14};
    for (int j = 0; j < 4; ++j) {
        tok[size_t(q + j)] = gram[j];
        tok[size_t(20 * 32 + 5 + j)] = gram[j];
        tok[size_t(30 * 32 + 30 + j)] = gram[j];  // straddles chunks 30 and 31: the chunk of its start
        tok[size_t(q + 10 + j)] = many[j];
        for (int k = 0; k < 9; ++k) tok[size_t((10 + k * 2) * 32 + 1 + j)] = many[j];
    }
    std::vector<float> score(size_t(n), 0.f);
    auto sel = lb::pflash::select_chunks(score, tok, 0.0125, r);  // budget 1: only forced chunks
    std::vector<int> want;
    for (int c = 0; c < 8; ++c) want.push_back(c);
    for (int c = 18; c <= 22; ++c) want.push_back(c);
    for (int c = 28; c <= 32; ++c) want.push_back(c);
    for (int c = 56; c < 80; ++c) want.push_back(c);
    CHECK(sel.kept == want, "anchors: got %zu chunks, want %zu", sel.kept.size(), want.size());
}

static void test_bridge() {
    // text "aaaa bbbb cccc dddd" (19 chars); drafter: one token per word (chunk 1 for the test),
    // target: pieces that straddle the drafter's boundaries
    const std::vector<int> d = {0, 4, 4, 9, 9, 14, 14, 19};
    const std::vector<int> t = {0, 2, 2, 6, 6, 11, 11, 12, 12, 19, 19, 19};
    auto b = lb::pflash::bridge({1, 3}, 1, d, t);
    CHECK(b.char_spans.size() == 2 && b.char_spans[0] == std::make_pair(4, 9) && b.char_spans[1] == std::make_pair(14, 19),
          "char spans");
    // kept: [2,6) overlaps [4,9); [6,11) overlaps; [11,12) no; [12,19) overlaps [14,19); empty at 19: at a
    // kept span's end, so kept
    CHECK((b.target_positions == std::vector<int>{1, 2, 4, 5}), "target positions");
    CHECK(b.kept_drafter == 2, "kept drafter tokens %d", b.kept_drafter);
    auto all = lb::pflash::bridge({0, 1, 2, 3}, 1, d, t);
    CHECK(all.char_spans.size() == 1 && all.target_positions.size() == 6, "everything kept covers every token");
    auto runs = lb::pflash::runs({1, 2, 4, 5, 6, 9});
    CHECK((runs == std::vector<std::pair<int, int>>{{1, 3}, {4, 7}, {9, 10}}), "runs");
}

int main() {
    test_importance_and_pool();
    test_selection_budget_and_forced();
    test_anchors();
    test_bridge();
    if (failures) { fprintf(stderr, "%d pflash check(s) failed\n", failures); return 1; }
    fprintf(stderr, "pflash checks passed\n");
    return 0;
}
