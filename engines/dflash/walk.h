// Greedy tree verification: the walk along the target's argmax, and the acceptance statistics.
//
// The verify forward gives the target's argmax at every tree slot: its greedy next token after the path
// root..slot. From the root, while that argmax is the token of one of the slot's children, descend to
// that child; at the first slot where no child matches, the argmax is the bonus token. The accepted
// path's tokens (root excluded: it was committed by the previous round) plus the bonus are what the round
// commits; the output then equals autoregressive greedy decoding token for token.
#pragma once
#include <cstdint>
#include <vector>

#include "core/json.h"
#include "ddtree.h"

namespace lb::dflash {

struct WalkResult {
    std::vector<int> path;  // slot indices from the root (slot 0) to the deepest accepted node
    int bonus = -1;         // the target's argmax at the last path slot
    int accepted() const { return int(path.size()) - 1; }  // draft tokens accepted
    // The tokens the round commits: the accepted nodes' tokens, then the bonus.
    std::vector<int> committed_tokens(const DDTree& tree) const;
};

// `target_argmax[s]` is the target's argmax at slot s, for every slot of `tree`.
WalkResult walk_tree(const DDTree& tree, const int* target_argmax);

// Acceptance over the rounds of one generation (or of many), counted as docs/protocol.md's `spec` object
// defines it: tokens committed to the output (after a cut at n_gen or a stop token), bonus included, so
// that sum(al_histogram) = rounds, sum(k * al_histogram[k]) = committed and accepted_at_depth[d] =
// sum over k >= d + 1 of al_histogram[k].
struct AcceptanceStats {
    explicit AcceptanceStats(int max_depth = 15);
    int max_depth;                          // D = block_size - 1
    int64_t rounds = 0;                     // draft + verify iterations
    int64_t committed = 0;                  // tokens committed by them (bonus included)
    std::vector<int64_t> accepted_at_depth; // [d]: rounds that committed the draft token at depth d (d = 1..D)
    std::vector<int64_t> al_histogram;      // [k]: rounds that committed k tokens (k = 0..D + 1; [0] stays 0)
    double draft_ms = 0, tree_ms = 0, verify_ms = 0, commit_ms = 0;  // summed over the rounds

    // One round that accepted `accepted` draft tokens and committed `committed` of the accepted + 1
    // (fewer when a stop token or n_gen cut the round short; the draft tokens past the cut do not count).
    void add(int accepted, int committed);
    void add(int accepted) { add(accepted, accepted + 1); }
    double acceptance_length() const { return rounds ? double(committed) / double(rounds) : 0.0; }
    // {"draft_steps", "accepted_tokens", "acceptance_length", "accepted_per_depth": [d = 1..D],
    //  "al_histogram": [k = 0..D + 1], "time_ms": {"draft", "tree", "verify", "commit"}}.
    Json to_json() const;
};

}  // namespace lb::dflash
