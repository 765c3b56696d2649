// DDTree: the draft tree verified in one target forward (speculative.md §2, Ringel & Romano 2026).
//
// The DFlash draft gives, in one pass, a distribution per block position (depth 1..D, D = block_size - 1),
// not conditioned on the path. Under that factorised model the expected number of accepted tokens of a
// prefix-closed tree is the sum over its nodes of the product of their tokens' probabilities, so the best
// tree of B nodes is the B most probable prefixes. build_ddtree grows it best-first over rank tuples
// (r_1, ..., r_d) scored by the cumulative log-probability sum_i logp_i[r_i]: pop the best, add it, push
// its next sibling (r_d + 1) and its first child (r_1, ..., r_d, 0); B pops.
//
// The flattened tree: slot 0 is the root (the bonus token of the previous round, already known, not
// counted in B), slots 1..n in insertion order, so every parent comes before its children. The verify
// forward runs all n + 1 slots at positions start + depth; each slot sees the committed context, its
// ancestors and itself.
#pragma once
#include <cstdint>
#include <vector>

namespace lb::dflash {

// The candidates of one depth: token ids and their log-probabilities, best first.
struct DepthCandidates {
    std::vector<int> tokens;
    std::vector<float> logprobs;
};

// The top `k` tokens of log_softmax(logits) (fp32 logits, log-sum-exp in double), best first; equal
// logits rank the lower token id first, as argmax does.
DepthCandidates top_k_logprobs(const float* logits, int vocab, int k);

struct DDTreeOptions {
    int budget = 22;        // B: nodes besides the root; the verify batch is B + 1
    int top_k = 8;          // cap on candidates per depth: K = min(budget, top_k, candidates given)
    bool chain_seed = true; // insert the whole top-1 chain first, then grow best-first
    bool chain = false;     // chain mode: the top-1 chain only (K = 1), min(B, D) nodes
};

struct DDTree {
    // Per slot; slot 0 is the root.
    std::vector<int> tokens;
    std::vector<int> parent;        // slot index of the parent; -1 for the root
    std::vector<int> depth;         // 0 for the root; the position offset from the root's position
    std::vector<int> rank;          // the token's rank among its depth's candidates; -1 for the root
    std::vector<float> logprob;     // cumulative log-probability of the path; 0 for the root
    int size() const { return int(tokens.size()); }
    int max_depth() const;
    // Children of each slot, in slot order.
    std::vector<std::vector<int>> children() const;
};

// `depths[d - 1]` holds depth d's candidates (d = 1..D). Ties in cumulative log-probability pop the
// shallower node first, then the lexicographically smaller rank tuple, so the tree is deterministic.
DDTree build_ddtree(int root_token, const std::vector<DepthCandidates>& depths, const DDTreeOptions& opt);

}  // namespace lb::dflash
