// lucebench-dflash: greedy speculative decoding with a DFlash draft and DDTree verification, speaking
// docs/protocol.md. One round (speculative.md §1-§3):
//   draft   the draft's block [bonus, MASK x (block_size - 1)] conditioned on the target features of every
//           committed position (its cache holds their K/V rows) -> per-depth top-K log-probabilities
//   tree    build_ddtree: the budget's most probable prefixes (or the top-1 chain with --chain)
//   verify  one target forward over the tree's slots (ancestor-only attention), argmax and the feature
//           layers' hidden states at every slot
//   walk    the longest path whose tokens the target's argmax confirms, plus the bonus token after it
//   commit  the accepted slots become the sequence (KV compacted, DeltaNet state of the last accepted
//           node); their features enter the draft cache
// Greedy verification makes the output autoregressive greedy decoding's, token for token. Prefill is a
// verify + commit of the prompt as a chain, so the prompt's features come from the same forward.
// Logs go to stderr; stdout carries only protocol lines.
//
// LB_DFLASH_TRACE=FILE appends one JSON line per round to FILE: the bonus token's position ("start"), the
// draft's top-1 token at each depth ("proposal") and the draft tokens accepted ("accepted"). The tests
// compare it with a reference loop round by round.
#include <chrono>
#include <cstdlib>
#include <string>
#include <vector>
#include <cstdio>
#include <deque>
#include <memory>

#include "core/backend.h"
#include "core/engine_main.h"
#include "core/errors.h"
#include "core/server.h"
#include "core/tuning.h"
#include "dflash/ddtree.h"
#include "dflash/draft_model.h"
#include "dflash/walk.h"

namespace lb {
namespace {

using dflash::AcceptanceStats;
using dflash::DDTree;
using dflash::DDTreeOptions;
using dflash::DraftConfig;
using dflash::DraftModelCpu;

double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The target's embedding table and LM head in fp32, which the draft borrows. The backend keeps its own
// copy: this one is read again from the checkpoint, keeping only those two matrices.
struct TargetHead {
    std::deque<std::vector<float>> storage;
    const float* embed = nullptr;
    const float* lm_head = nullptr;

    void load(const TensorSource& src, const ModelConfig& cfg) {
        Uploader keep = [&](std::vector<float>&& data, int64_t rows, int64_t cols, bool) {
            if (rows != cfg.vocab || cols != cfg.hidden) return Mat{nullptr, rows, cols};
            storage.push_back(std::move(data));
            return Mat{storage.back().data(), rows, cols};
        };
        ModelWeights w = load_weights(src, cfg, keep, nullptr);
        embed = (const float*)w.embed.ptr;
        lm_head = (const float*)w.lm_head.ptr;
        if (!embed || !lm_head) fail("internal", "the target's embedding or LM head was not found while loading");
    }
};

class DFlashHandler : public RequestHandler {
public:
    DFlashHandler(Backend& be, const ModelConfig& cfg, DraftModelCpu& draft, const TargetHead& head,
                  const DDTreeOptions& tree_opt, int max_ctx)
        : be_(be), cfg_(cfg), draft_(draft), head_(head), tree_opt_(tree_opt), max_ctx_(max_ctx) {
        if (const std::string& path = tuning().dflash_trace; !path.empty()) trace_ = fopen(path.c_str(), "a");
    }
    ~DFlashHandler() override {
        if (trace_) fclose(trace_);
    }
    int vocab_size() const override { return cfg_.vocab; }
    int max_ctx() const override { return max_ctx_; }

    Json generate(const GenerateRequest& req) override {
        const DraftConfig& dc = draft_.config();
        const int n_prompt = int(req.prompt_ids.size());
        const int D = dc.block_size - 1;
        if (n_prompt + req.n_gen > max_ctx_)
            fail("context_overflow", "prompt " + std::to_string(n_prompt) + " + n_gen " + std::to_string(req.n_gen) +
                                         " exceeds max_ctx " + std::to_string(max_ctx_));
        auto stop_at = [&](int tok) { return !req.ignore_eos && is_eos(req, tok); };
        Generation g;
        AcceptanceStats stats(D);
        be_.synchronize();
        be_.reset();
        draft_.reset();

        // Prefill: the prompt as a chain, features of every position for the draft's context. The logits
        // asked for by return_logits come from a second, one-row verify of the last token, so the first
        // never holds [n_prompt, vocab] logits.
        g.t_prefill_start = monotonic_ns();
        be_.timer_start();
        const int n_first = req.return_logits && n_prompt > 1 ? n_prompt - 1 : n_prompt;
        int next = -1;
        for (int begin = 0; begin < n_prompt;) {
            const int n = begin == 0 ? n_first : n_prompt - begin;
            VerifyRequest pre;
            pre.tokens.assign(req.prompt_ids.begin() + begin, req.prompt_ids.begin() + begin + n);
            for (int i = 0; i < n; ++i) pre.positions.push_back(begin + i);
            pre.feature_layers = dc.target_layer_ids;
            pre.want_logits = req.return_logits && begin + n == n_prompt;
            if (pre.want_logits) pre.out_rows = {n - 1};
            VerifyResult pr;
            be_.verify(pre, &pr);
            std::vector<int> path(static_cast<size_t>(n));
            for (int i = 0; i < n; ++i) path[size_t(i)] = i;
            be_.commit(path);
            if (pre.want_logits) g.logits = std::move(pr.logits);  // out_rows {n - 1} = the whole of n = 1
            draft_.add_context(pr.features.data(), n);
            next = pr.argmax.back();
            begin += n;
        }
        g.out.push_back(next);
        g.prefill_ms = be_.timer_stop_ms();
        g.t_prefill_end = g.t_decode_end = monotonic_ns();

        bool stopped = stop_at(g.out.back());
        if (stopped) g.stop = "eos";
        if (!stopped && req.n_gen > 1) {
            be_.timer_start();
            const int H = cfg_.hidden, V = cfg_.vocab;
            std::vector<float> block(size_t(dc.block_size) * H), hidden(size_t(D) * H), logits(size_t(D) * V);
            const int K = tree_opt_.chain ? 1 : std::min(tree_opt_.budget, tree_opt_.top_k);
            while (!stopped && int(g.out.size()) < req.n_gen) {
                const int bonus = g.out.back();
                const int length = be_.length();
                // Draft.
                auto t0 = std::chrono::steady_clock::now();
                for (int i = 0; i < dc.block_size; ++i) {
                    const int tok = i == 0 ? bonus : dc.mask_token_id;
                    std::copy(head_.embed + int64_t(tok) * H, head_.embed + int64_t(tok + 1) * H, &block[size_t(i) * H]);
                }
                draft_.forward_block(block.data(), hidden.data());
                draft_.logits(hidden.data(), D, head_.lm_head, V, logits.data());
                std::vector<dflash::DepthCandidates> depths;
                for (int d = 0; d < D; ++d) depths.push_back(dflash::top_k_logprobs(&logits[size_t(d) * V], V, K));
                stats.draft_ms += ms_since(t0);
                Json trace = Json::object();
                if (trace_) {
                    Json proposal = Json::array();
                    for (auto& c : depths) proposal.push_back(Json(c.tokens.empty() ? -1 : c.tokens[0]));
                    trace["start"] = length;
                    trace["proposal"] = proposal;
                }
                // Tree.
                t0 = std::chrono::steady_clock::now();
                DDTree tree = dflash::build_ddtree(bonus, depths, tree_opt_);
                stats.tree_ms += ms_since(t0);
                // Verify.
                t0 = std::chrono::steady_clock::now();
                VerifyRequest vr;
                vr.tokens = tree.tokens;
                for (int d : tree.depth) vr.positions.push_back(length + d);
                vr.parents = tree.parent;
                vr.feature_layers = dc.target_layer_ids;
                VerifyResult res;
                be_.verify(vr, &res);
                stats.verify_ms += ms_since(t0);
                // Walk, commit, feature rows of the accepted path.
                t0 = std::chrono::steady_clock::now();
                dflash::WalkResult w = dflash::walk_tree(tree, res.argmax.data());
                be_.commit(w.path);
                const size_t fw = size_t(dc.feature_width());
                std::vector<float> feats(w.path.size() * fw);
                for (size_t i = 0; i < w.path.size(); ++i)
                    std::copy(&res.features[size_t(w.path[i]) * fw], &res.features[size_t(w.path[i]) * fw] + fw, &feats[i * fw]);
                draft_.add_context(feats.data(), int(w.path.size()));
                stats.commit_ms += ms_since(t0);
                // Output: cut at n_gen and at the first stop token.
                int committed = 0;
                for (int tok : w.committed_tokens(tree)) {
                    if (int(g.out.size()) >= req.n_gen || stopped) break;
                    g.out.push_back(tok);
                    ++committed;
                    if (stop_at(tok)) { stopped = true; g.stop = "eos"; }
                }
                stats.add(w.accepted(), committed);
                if (trace_) {
                    trace["accepted"] = w.accepted();
                    fprintf(trace_, "%s\n", trace.dump().c_str());
                    fflush(trace_);
                }
            }
            g.decode_ms = be_.timer_stop_ms();
            g.t_decode_end = monotonic_ns();
        }
        g.decode_steps = int(stats.rounds);
        Json reply = generation_reply(req, g, 0, be_.peak_mem_bytes());
        // bytes_per_token is an autoregressive step's traffic; a round commits several tokens, so the
        // field is left out rather than misread as this engine's roofline.
        Json out = Json::object();
        for (auto& [k, v] : reply.members())
            if (k != "bytes_per_token") out[k] = v;
        out["spec"] = stats.to_json();
        return out;
    }

private:
    Backend& be_;
    const ModelConfig& cfg_;
    DraftModelCpu& draft_;
    const TargetHead& head_;
    DDTreeOptions tree_opt_;
    int max_ctx_;
    FILE* trace_ = nullptr;
};

#ifndef LB_DEFAULT_BACKEND
#define LB_DEFAULT_BACKEND "cpu"
#endif

// This engine's own tree flags, taken out of argv before the common parser sees it:
//   --top-k N            candidates per depth, N >= 1 (default 8; the tree uses min(budget, N))
//   --chain-seed on|off  insert the top-1 chain before growing best-first (default on)
std::vector<char*> take_tree_flags(int argc, char** argv, DDTreeOptions* tree) {
    std::vector<char*> rest;
    for (int i = 0; i < argc; ++i) {
        std::string a = argv[i], value;
        const bool top_k = a == "--top-k" || a.rfind("--top-k=", 0) == 0;
        const bool seed = a == "--chain-seed" || a.rfind("--chain-seed=", 0) == 0;
        if (i == 0 || (!top_k && !seed)) { rest.push_back(argv[i]); continue; }
        const std::string flag = top_k ? "--top-k" : "--chain-seed";
        if (a.size() > flag.size()) value = a.substr(flag.size() + 1);
        else if (i + 1 < argc) value = argv[++i];
        else fail("bad_request", flag + " needs a value");
        if (top_k) {
            char* end = nullptr;
            const long k = std::strtol(value.c_str(), &end, 10);
            if (value.empty() || *end || k < 1 || k > 1 << 20)
                fail("bad_request", "--top-k must be an integer >= 1, got '" + value + "'");
            tree->top_k = int(k);
        } else {
            if (value != "on" && value != "off") fail("bad_request", "--chain-seed must be on or off, got '" + value + "'");
            tree->chain_seed = value == "on";
        }
    }
    return rest;
}

int run(int argc, char** argv) {
    EngineOptions opt;
    DDTreeOptions tree_opt;
    try {
        std::vector<char*> rest = take_tree_flags(argc, argv, &tree_opt);
        opt = parse_engine_flags(int(rest.size()), rest.data(), kFlagDraft | kFlagBudget | kFlagChain);
        if (opt.draft.empty()) fail("bad_request", "lucebench-dflash needs --draft PATH (a DFlash draft checkpoint)");
    } catch (const EngineError& e) {
        emit_error("", e.kind == "unsupported" ? "unsupported" : "load", e.what());
        return 2;
    }
    const std::string backend = opt.backend.empty() ? LB_DEFAULT_BACKEND : opt.backend;
    std::unique_ptr<Backend> be;
    ModelConfig cfg;
    LoadStats stats;
    DraftModelCpu draft;
    TargetHead head;
    const bool loaded = load_or_report([&] {
        if (backend != "cpu")
            fail("unsupported", "lucebench-dflash runs on the cpu backend so far (the GPU draft is not written yet)");
        be = make_cpu_backend();
        fprintf(stderr, "[dflash] loading %s and draft %s on %s\n", opt.model.c_str(), opt.draft.c_str(), backend.c_str());
        auto src = open_checkpoint(opt.model);
        cfg = config_from_source(*src);
        auto dsrc = open_checkpoint(opt.draft);
        DraftConfig dc = dflash::draft_config_from_source(*dsrc);
        if (dc.hidden != cfg.hidden || dc.target_hidden != cfg.hidden)
            fail("load", "draft " + opt.draft + ": hidden size " + std::to_string(dc.hidden) + " (features of " +
                             std::to_string(dc.target_hidden) + ") does not match the target's " + std::to_string(cfg.hidden));
        for (int id : dc.target_layer_ids)
            if (id < 0 || id >= cfg.n_layers)
                fail("load", "draft " + opt.draft + ": target layer " + std::to_string(id) + " outside the target's " +
                                 std::to_string(cfg.n_layers) + " layers");
        if (dc.mask_token_id < 0 || dc.mask_token_id >= cfg.vocab)
            fail("load", "draft " + opt.draft + ": mask_token_id " + std::to_string(dc.mask_token_id) +
                             " outside the target's vocabulary of " + std::to_string(cfg.vocab));
        tree_opt.chain = opt.chain;
        tree_opt.budget = opt.budget > 0 ? opt.budget : (opt.chain ? dc.block_size - 1 : 22);
        be->load(*src, cfg, &stats);
        head.load(*src, cfg);
        draft.load(*dsrc, dc);
        // The verify rows sit after the committed sequence: room for the largest tree past max_ctx.
        be->allocate(opt.max_ctx + tree_opt.budget + 1, opt.kv_k, opt.kv_v);
        draft.allocate(opt.max_ctx + dc.block_size);
    });
    if (!loaded) return 1;
    const DraftConfig& dc = draft.config();
    fprintf(stderr, "[dflash] target %s: %d layers, hidden %d, vocab %d; draft: %d layers, block %d, features of layers",
            arch_name(cfg.arch), cfg.n_layers, cfg.hidden, cfg.vocab, dc.n_layers, dc.block_size);
    for (int id : dc.target_layer_ids) fprintf(stderr, " %d", id);
    fprintf(stderr, "\n");
    Json options = kv_options(opt, be->weight_dtype());
    options["draft"] = opt.draft;
    options["budget"] = tree_opt.budget;
    options["chain"] = tree_opt.chain;
    options["chain_seed"] = tree_opt.chain_seed;
    options["top_k"] = tree_opt.chain ? 1 : std::min(tree_opt.budget, tree_opt.top_k);
    options["block_size"] = dc.block_size;
    options["draft_dtype"] = "f32";
    const MemoryReport mem = be->memory();
    emit(ready_line("dflash", backend, options, cfg, stats, be->device(), opt.max_ctx, mem.weights ? &mem : nullptr));

    DFlashHandler handler(*be, cfg, draft, head, tree_opt, opt.max_ctx);
    return serve(handler);
}

}  // namespace
}  // namespace lb

int main(int argc, char** argv) { return lb::run(argc, argv); }
