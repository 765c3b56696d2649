// DDTree construction (see ddtree.h).
#include "ddtree.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <queue>

#include "core/errors.h"

namespace lb::dflash {

DepthCandidates top_k_logprobs(const float* logits, int vocab, int k) {
    k = std::max(0, std::min(k, vocab));
    float mx = -INFINITY;
    for (int i = 0; i < vocab; ++i) mx = std::fmax(mx, logits[i]);
    double sum = 0;
    for (int i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - mx);
    const float lse = mx + float(std::log(sum));
    std::vector<int> idx(static_cast<size_t>(vocab));
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int a, int b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    DepthCandidates c;
    for (int i = 0; i < k; ++i) {
        c.tokens.push_back(idx[size_t(i)]);
        c.logprobs.push_back(logits[idx[size_t(i)]] - lse);
    }
    return c;
}

int DDTree::max_depth() const { return depth.empty() ? 0 : *std::max_element(depth.begin(), depth.end()); }

std::vector<std::vector<int>> DDTree::children() const {
    std::vector<std::vector<int>> ch(tokens.size());
    for (int s = 1; s < size(); ++s) ch[size_t(parent[size_t(s)])].push_back(s);
    return ch;
}

namespace {

// A prefix waiting in the heap: its parent slot and the rank of its last token at `depth`.
struct Candidate {
    float score;             // cumulative log-probability
    int depth, rank, parent;
    std::vector<int> ranks;  // the whole rank tuple, for the deterministic tie order
};

// True when `a` pops before `b`.
bool pops_first(const Candidate& a, const Candidate& b) {
    if (a.score != b.score) return a.score > b.score;
    if (a.depth != b.depth) return a.depth < b.depth;
    return a.ranks < b.ranks;
}

struct PopsLater {
    bool operator()(const Candidate& a, const Candidate& b) const { return pops_first(b, a); }
};

}  // namespace

DDTree build_ddtree(int root_token, const std::vector<DepthCandidates>& depths, const DDTreeOptions& opt) {
    if (opt.budget < 0) fail("bad_request", "DDTree budget must be >= 0 (got " + std::to_string(opt.budget) + ")");
    if (opt.top_k < 1) fail("bad_request", "DDTree top-K must be >= 1 (got " + std::to_string(opt.top_k) + ")");
    const int D = int(depths.size());
    const int K = opt.chain ? 1 : std::min(opt.budget, opt.top_k);
    // Candidates usable at depth d (1-based): the first K of what the draft gave.
    auto width = [&](int d) { return std::min<int>(K, int(depths[size_t(d - 1)].tokens.size())); };

    DDTree t;
    std::vector<std::vector<int>> slot_ranks(1);  // rank tuple of each slot
    auto add = [&](int parent, int d, int r) {
        t.tokens.push_back(depths[size_t(d - 1)].tokens[size_t(r)]);
        t.parent.push_back(parent);
        t.depth.push_back(d);
        t.rank.push_back(r);
        t.logprob.push_back(t.logprob[size_t(parent)] + depths[size_t(d - 1)].logprobs[size_t(r)]);
        std::vector<int> ranks = slot_ranks[size_t(parent)];
        ranks.push_back(r);
        slot_ranks.push_back(std::move(ranks));
        return t.size() - 1;
    };
    t.tokens = {root_token};
    t.parent = {-1};
    t.depth = {0};
    t.rank = {-1};
    t.logprob = {0.f};
    const int target_size = 1 + opt.budget;

    std::priority_queue<Candidate, std::vector<Candidate>, PopsLater> heap;
    auto push = [&](int parent, int d, int r) {
        if (d > D || r >= width(d)) return;
        std::vector<int> ranks = slot_ranks[size_t(parent)];
        ranks.push_back(r);
        heap.push({t.logprob[size_t(parent)] + depths[size_t(d - 1)].logprobs[size_t(r)], d, r, parent, std::move(ranks)});
    };

    if (opt.chain || opt.chain_seed) {
        // The top-1 chain, as deep as the budget allows.
        int slot = 0;
        for (int d = 1; d <= D && t.size() < target_size && width(d) > 0; ++d) slot = add(slot, d, 0);
        if (opt.chain) return t;
        // The best-first frontier as if the chain had been popped: each chain node's next sibling and the
        // last chain node's first child.
        for (int s = 1; s < t.size(); ++s) push(t.parent[size_t(s)], t.depth[size_t(s)], 1);
        push(t.size() - 1, t.depth.back() + 1, 0);
    } else {
        push(0, 1, 0);
    }
    while (t.size() < target_size && !heap.empty()) {
        Candidate c = heap.top();
        heap.pop();
        const int slot = add(c.parent, c.depth, c.rank);
        push(c.parent, c.depth, c.rank + 1);  // next sibling
        push(slot, c.depth + 1, 0);           // first child
    }
    return t;
}

}  // namespace lb::dflash
