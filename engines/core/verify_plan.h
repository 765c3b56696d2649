// The backend-independent half of a verify forward (backend.h): the request checked and resolved into
// the rows' parents, their ancestor mask and the rows whose outputs are returned; the top-k log-probs of a
// row's logits; and the check that a commit path is a root-to-node chain of the last verify's rows. Every
// backend uses these, so a request means the same thing and fails with the same message on each.
#pragma once
#include <cstdint>
#include <vector>

#include "backend.h"

namespace lb {

struct VerifyPlan {
    int n = 0;
    std::vector<int> parent;        // [n]: parent row, or -1 for a row hung on the committed sequence
    std::vector<uint8_t> visible;   // [n, n]: visible[t * n + s] = 1 when row s is row t or an ancestor of it
    std::vector<int> out_rows;      // the request's out rows, or every row when it names none
};

// Throws EngineError("bad_request") for a malformed request, ("context_overflow") when `length` + n rows
// exceed `max_ctx`.
VerifyPlan plan_verify(const VerifyRequest& req, const ModelConfig& cfg, int length, int max_ctx);

// Appends the k largest log-probabilities of logits[vocab] and their ids (largest first, lower id on ties).
void append_top_k(const float* logits, int vocab, int k, std::vector<int>* ids, std::vector<float>* logprobs);

// Checks that `path` names rows of the last verify (n rows; 0: none pending), starts at a row with parent
// -1, that each next row is a child of the previous one and that row i of the path sits at position
// length + i. Throws EngineError("bad_request").
void check_commit_path(const std::vector<int>& path, int n, const std::vector<int>& parent,
                       const std::vector<int>& positions, int length);

}  // namespace lb
