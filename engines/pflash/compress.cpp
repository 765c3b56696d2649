#include "compress.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <array>
#include <map>

#include "core/errors.h"

namespace lb::pflash {

std::vector<float> importance(const TailScores& s) {
    const size_t ctx = size_t(s.ctx), rows = size_t(s.n_tail), layers = s.layers.size();
    std::vector<float> out(ctx, 0.f);
    for (size_t t = 0; t < rows; ++t)
        for (size_t j = 0; j < ctx; ++j) {
            float mx = 0.f;  // probabilities are >= 0
            for (size_t l = 0; l < layers; ++l) mx = std::fmax(mx, s.probs[(l * rows + t) * ctx + j]);
            out[j] += mx / float(rows);
        }
    return out;
}

std::vector<float> smooth(const std::vector<float>& x, int width) {
    const int n = int(x.size()), half = width / 2;
    std::vector<double> prefix(size_t(n) + 1, 0.0);
    for (int i = 0; i < n; ++i) prefix[size_t(i) + 1] = prefix[size_t(i)] + x[size_t(i)];
    std::vector<float> out(x.size());
    for (int i = 0; i < n; ++i) {
        const int a = std::max(0, i - half), b = std::min(n, i + half + 1);
        out[size_t(i)] = float((prefix[size_t(b)] - prefix[size_t(a)]) / width);
    }
    return out;
}

Selection select_chunks(const std::vector<float>& smoothed, const std::vector<int>& tokens, double keep_ratio,
                        const Rule& rule) {
    const int n = int(tokens.size());
    if (n < 1 || smoothed.size() != tokens.size()) fail("internal", "select_chunks: one score per token needed");
    Selection sel;
    sel.n_chunks = (n + rule.chunk - 1) / rule.chunk;
    sel.budget = std::max(1, int(std::floor(double(sel.n_chunks) * keep_ratio + 1e-9)));
    std::vector<uint8_t> forced(size_t(sel.n_chunks), 0);
    for (int c = 0; c < std::min(rule.head_chunks, sel.n_chunks); ++c) forced[size_t(c)] = 1;
    for (int c = std::max(0, sel.n_chunks - rule.tail_chunks); c < sel.n_chunks; ++c) forced[size_t(c)] = 1;
    // Anchors: every n-gram of the window at the prompt's end that occurs 1..anchor_max_hits times before
    // the window keeps the chunks around those earlier occurrences (the question quotes what it asks for).
    const int g = rule.anchor_ngram, window = std::max(0, n - rule.anchor_window);
    if (n - window >= g) {
        using Gram = std::array<int, 4>;
        auto gram_at = [&](int i) { Gram k{}; for (int j = 0; j < g && j < 4; ++j) k[size_t(j)] = tokens[size_t(i + j)]; return k; };
        std::map<Gram, std::vector<int>> earlier;
        for (int i = 0; i < window && i + g <= n; ++i) earlier[gram_at(i)].push_back(i);
        std::map<Gram, bool> seen;
        for (int i = window; i + g <= n; ++i) {
            const Gram k = gram_at(i);
            if (seen[k]) continue;
            seen[k] = true;
            auto it = earlier.find(k);
            if (it == earlier.end() || int(it->second.size()) > rule.anchor_max_hits) continue;
            for (int at : it->second) {
                const int c = at / rule.chunk;
                for (int d = c - rule.anchor_radius; d <= c + rule.anchor_radius; ++d)
                    if (d >= 0 && d < sel.n_chunks) forced[size_t(d)] = 1;
            }
        }
    }
    std::vector<double> mean(size_t(sel.n_chunks), 0.0);
    for (int c = 0; c < sel.n_chunks; ++c) {
        const int a = c * rule.chunk, b = std::min(n, a + rule.chunk);
        double sum = 0;
        for (int i = a; i < b; ++i) sum += smoothed[size_t(i)];
        mean[size_t(c)] = sum / (b - a);
    }
    std::vector<uint8_t> keep = forced;
    int kept = 0;
    for (uint8_t f : forced) kept += f;
    std::vector<int> order;
    for (int c = 0; c < sel.n_chunks; ++c) if (!forced[size_t(c)]) order.push_back(c);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return mean[size_t(a)] > mean[size_t(b)]; });
    for (int c : order) {
        if (kept >= sel.budget) break;
        keep[size_t(c)] = 1;
        ++kept;
    }
    for (int c = 0; c < sel.n_chunks; ++c) {
        if (keep[size_t(c)]) sel.kept.push_back(c);
        if (forced[size_t(c)]) sel.forced.push_back(c);
    }
    return sel;
}

Bridged bridge(const std::vector<int>& kept_chunks, int chunk, const std::vector<int>& drafter_offsets,
               const std::vector<int>& target_offsets) {
    const int nd = int(drafter_offsets.size() / 2), nt = int(target_offsets.size() / 2);
    int text_end = 0;
    for (int v : drafter_offsets) text_end = std::max(text_end, v);
    for (int v : target_offsets) text_end = std::max(text_end, v);
    // Token i's boundary: its start, never before an earlier token's (offsets of tokens inside one
    // character may repeat).
    std::vector<int> start(size_t(nd) + 1);
    int prev = 0;
    for (int i = 0; i < nd; ++i) { prev = std::max(prev, drafter_offsets[size_t(2 * i)]); start[size_t(i)] = prev; }
    start[size_t(nd)] = text_end;
    start[0] = 0;
    Bridged out;
    for (size_t k = 0; k < kept_chunks.size();) {
        // a run of consecutive kept chunks
        size_t e = k;
        while (e + 1 < kept_chunks.size() && kept_chunks[e + 1] == kept_chunks[e] + 1) ++e;
        const int a = kept_chunks[k] * chunk, b = std::min(nd, (kept_chunks[e] + 1) * chunk);
        out.kept_drafter += b - a;
        if (start[size_t(b)] > start[size_t(a)] || b == nd)
            out.char_spans.emplace_back(start[size_t(a)], std::max(start[size_t(b)], start[size_t(a)]));
        k = e + 1;
    }
    size_t j = 0;
    for (int i = 0; i < nt; ++i) {
        const int s = target_offsets[size_t(2 * i)], e = target_offsets[size_t(2 * i + 1)];
        while (j < out.char_spans.size() && out.char_spans[j].second < s) ++j;
        bool kept = false;
        for (size_t m = j; m < out.char_spans.size() && out.char_spans[m].first <= std::max(s, e); ++m) {
            const auto [A, B] = out.char_spans[m];
            if (e > s ? (s < B && e > A) : (A <= s && s <= B)) { kept = true; break; }
        }
        if (kept) out.target_positions.push_back(i);
    }
    return out;
}

std::vector<std::pair<int, int>> runs(const std::vector<int>& positions) {
    std::vector<std::pair<int, int>> out;
    for (int p : positions) {
        if (!out.empty() && out.back().second == p) out.back().second = p + 1;
        else out.emplace_back(p, p + 1);
    }
    return out;
}

}  // namespace lb::pflash
