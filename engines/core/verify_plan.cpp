#include "verify_plan.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "errors.h"

namespace lb {

VerifyPlan plan_verify(const VerifyRequest& req, const ModelConfig& cfg, int length, int max_ctx) {
    const int n = int(req.tokens.size());
    if (n < 1) fail("bad_request", "verify needs at least one token");
    if (length + n > max_ctx)
        fail("context_overflow", "verify of " + std::to_string(n) + " rows at length " + std::to_string(length) +
                                     " exceeds max_ctx " + std::to_string(max_ctx));
    if (int(req.positions.size()) != n) fail("bad_request", "verify: one position per token");
    if (!req.parents.empty() && int(req.parents.size()) != n) fail("bad_request", "verify: one parent per token (or none)");
    VerifyPlan plan;
    plan.n = n;
    plan.parent.resize(size_t(n));
    for (int t = 0; t < n; ++t) {
        const int p = req.parents.empty() ? t - 1 : req.parents[size_t(t)];
        if (p < -1 || p >= t)
            fail("bad_request", "verify: row " + std::to_string(t) + " has parent " + std::to_string(p) +
                                    " (must be -1 or an earlier row)");
        if (req.tokens[size_t(t)] < 0 || req.tokens[size_t(t)] >= cfg.vocab) fail("bad_request", "verify: token outside the vocabulary");
        plan.parent[size_t(t)] = p;
    }
    plan.visible.assign(size_t(n) * n, 0);
    for (int t = 0; t < n; ++t)
        for (int s = t; s >= 0; s = plan.parent[size_t(s)]) plan.visible[size_t(t) * n + s] = 1;
    plan.out_rows = req.out_rows;
    if (plan.out_rows.empty()) {
        plan.out_rows.resize(size_t(n));
        std::iota(plan.out_rows.begin(), plan.out_rows.end(), 0);
    }
    for (int r : plan.out_rows)
        if (r < 0 || r >= n) fail("bad_request", "verify: out row " + std::to_string(r) + " outside [0, n)");
    for (int l : req.feature_layers)
        if (l < 0 || l >= cfg.n_layers) fail("bad_request", "verify: feature layer " + std::to_string(l) + " outside the model");
    if (req.top_k < 0 || req.top_k > cfg.vocab) fail("bad_request", "verify: top_k outside [0, vocab]");
    return plan;
}

void append_top_k(const float* logits, int vocab, int k, std::vector<int>* ids, std::vector<float>* logprobs) {
    const float mx = *std::max_element(logits, logits + vocab);
    double sum = 0;
    for (int j = 0; j < vocab; ++j) sum += std::exp(double(logits[j]) - mx);
    const float lse = mx + float(std::log(sum));
    std::vector<int> idx(static_cast<size_t>(vocab));
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [&](int a, int b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
    for (int i = 0; i < k; ++i) {
        ids->push_back(idx[size_t(i)]);
        logprobs->push_back(logits[idx[size_t(i)]] - lse);
    }
}

void check_commit_path(const std::vector<int>& path, int n, const std::vector<int>& parent,
                       const std::vector<int>& positions, int length) {
    if (n == 0) fail("bad_request", "commit without a verify before it (or after a forward that discarded it)");
    for (size_t i = 0; i < path.size(); ++i) {
        const int r = path[i];
        if (r < 0 || r >= n) fail("bad_request", "commit: row " + std::to_string(r) + " outside the verify's rows");
        const int want_parent = i == 0 ? -1 : path[i - 1];
        if (parent[size_t(r)] != want_parent)
            fail("bad_request", "commit: row " + std::to_string(r) + " is not the child of the previous row of the path");
        if (positions[size_t(r)] != length + int(i))
            fail("bad_request", "commit: row " + std::to_string(r) + " has position " +
                                    std::to_string(positions[size_t(r)]) + ", not " + std::to_string(length + int(i)));
    }
}

}  // namespace lb
