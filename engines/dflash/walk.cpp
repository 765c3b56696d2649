// The greedy tree walk and acceptance statistics (see walk.h).
#include "walk.h"

#include <string>

#include "core/errors.h"

namespace lb::dflash {

std::vector<int> WalkResult::committed_tokens(const DDTree& tree) const {
    std::vector<int> out;
    for (size_t i = 1; i < path.size(); ++i) out.push_back(tree.tokens[size_t(path[i])]);
    out.push_back(bonus);
    return out;
}

WalkResult walk_tree(const DDTree& tree, const int* target_argmax) {
    const auto children = tree.children();
    WalkResult w;
    int slot = 0;
    w.path.push_back(slot);
    for (;;) {
        const int want = target_argmax[slot];
        int next = -1;
        for (int c : children[size_t(slot)])
            if (tree.tokens[size_t(c)] == want) { next = c; break; }  // siblings hold distinct tokens
        if (next < 0) break;
        slot = next;
        w.path.push_back(slot);
    }
    w.bonus = target_argmax[slot];
    return w;
}

AcceptanceStats::AcceptanceStats(int max_depth_)
    : max_depth(max_depth_), accepted_at_depth(size_t(max_depth_) + 1, 0), al_histogram(size_t(max_depth_) + 2, 0) {}

void AcceptanceStats::add(int accepted, int committed_) {
    if (accepted < 0 || accepted > max_depth || committed_ < 1 || committed_ > accepted + 1)
        fail("internal", "acceptance: accepted " + std::to_string(accepted) + ", committed " +
                             std::to_string(committed_) + " with max depth " + std::to_string(max_depth));
    ++rounds;
    committed += committed_;
    for (int d = 1; d < committed_; ++d) ++accepted_at_depth[size_t(d)];
    ++al_histogram[size_t(committed_)];
}

Json AcceptanceStats::to_json() const {
    Json j = Json::object();
    j["draft_steps"] = Json(rounds);
    j["accepted_tokens"] = Json(committed);
    j["acceptance_length"] = Json(acceptance_length());
    Json per_depth = Json::array(), hist = Json::array();
    for (int d = 1; d <= max_depth; ++d) per_depth.push_back(Json(accepted_at_depth[size_t(d)]));
    for (int k = 0; k <= max_depth + 1; ++k) hist.push_back(Json(al_histogram[size_t(k)]));
    j["accepted_per_depth"] = per_depth;
    j["al_histogram"] = hist;
    Json t = Json::object();
    t["draft"] = Json(draft_ms);
    t["tree"] = Json(tree_ms);
    t["verify"] = Json(verify_ms);
    t["commit"] = Json(commit_ms);
    j["time_ms"] = t;
    return j;
}

}  // namespace lb::dflash
