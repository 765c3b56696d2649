// PFlash's compressor (docs/engines.md, "PFlash"), apart from the models: the drafter's tail attention
// reduced to one importance per drafter token, the chunk selection at a keep ratio with the forced
// head, tail and anchor chunks, and the bridge from kept drafter tokens to kept target tokens through
// the character offsets of both tokenisations of the prompt's text.
#pragma once
#include <utility>
#include <vector>

#include "core/backend.h"

namespace lb::pflash {

// The rule's constants (Lucebox's defaults, speculative.md section 4).
struct Rule {
    int n_tail = 8;          // query rows: the prompt's last tokens
    int pool = 13;           // centred average pool width (odd)
    int chunk = 32;          // selection unit, drafter tokens
    int head_chunks = 8;     // always kept: the first chunks
    int tail_chunks = 24;    // always kept: the last chunks
    int anchor_window = 96;  // anchors: 4-grams of the prompt's last tokens ...
    int anchor_ngram = 4;
    int anchor_max_hits = 8;  // ... occurring 1..8 times before that window
    int anchor_radius = 2;    // keep each occurrence's chunk +- 2
};

// Per drafter token: max over layers of the probabilities, then the mean over the tail rows. [ctx]
std::vector<float> importance(const TailScores& s);
// Centred average pool of odd width, zero padded, divided by the width at the edges too (torch's
// avg_pool1d(padding = width / 2, count_include_pad = True)).
std::vector<float> smooth(const std::vector<float>& x, int width);

struct Selection {
    std::vector<int> kept;    // kept chunk indices, ascending
    std::vector<int> forced;  // the forced chunks (head, tail, anchors), ascending
    int n_chunks = 0, budget = 0;  // budget = max(1, floor(n_chunks * keep_ratio))
};
// The forced chunks, then the best remaining chunks by mean smoothed score (ties: the earlier chunk)
// until the budget is reached; never fewer than the forced ones. `tokens` are the drafter ids.
Selection select_chunks(const std::vector<float>& smoothed, const std::vector<int>& tokens, double keep_ratio,
                        const Rule& rule = Rule());

struct Bridged {
    std::vector<std::pair<int, int>> char_spans;  // kept text, half-open character spans, ascending
    std::vector<int> target_positions;            // kept target positions, ascending
    int kept_drafter = 0;                         // drafter tokens in the kept chunks
};
// Kept chunks -> character spans -> target tokens. A run of kept drafter tokens [a, b) covers the text
// from token a's start (0 for the first token) to token b's start (the text's end after the last token),
// so keeping every chunk covers the whole text. A target token is kept when any of its characters lies in
// a kept span (a token of no text: when its position lies in a kept span or at its end). Offsets are flat [start, end] pairs.
Bridged bridge(const std::vector<int>& kept_chunks, int chunk, const std::vector<int>& drafter_offsets,
               const std::vector<int>& target_offsets);

// Half-open [start, end) runs of consecutive positions.
std::vector<std::pair<int, int>> runs(const std::vector<int>& positions);

}  // namespace lb::pflash
