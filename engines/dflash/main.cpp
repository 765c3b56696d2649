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
// verify + commit of the prompt as a chain (in chunks of prefill_chunk rows on a GPU, which bounds the verify
// workspace: its logits are [rows, vocab]), so the prompt's features come from the same forward.
// On a GPU backend the draft runs on the GPU too (DraftModelGpu, on the target's stream with the target's
// embedding and LM head): the verify's feature rows stay in device memory and only the per-depth top-K
// candidates come to the host for the tree. On the cpu backend the draft is DraftModelCpu.
//
// --force-accept-length A (benchmark only, as vLLM's and llama.cpp's synthetic acceptance): instead of the
// walk, round r accepts floor((r + 1) A) - floor(r A) - 1 draft tokens along the tree's first-child path
// (its top-1 chain), so that a request's rounds commit A tokens on average whatever the weights. The output
// is then not the target's greedy decoding; the reply's spec.forced_acceptance_length marks it, and such
// results measure speed against AL only (synthetic weights), never acceptance or losslessness.
// Logs go to stderr; stdout carries only protocol lines.
//
// LB_DFLASH_TRACE=FILE appends one JSON line per round to FILE: the bonus token's position ("start"), the
// draft's top-1 token at each depth ("proposal") and the draft tokens accepted ("accepted"). The tests
// compare it with a reference loop round by round.
#include <algorithm>
#include <chrono>
#include <cmath>
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
#if defined(LB_HAVE_GPU)
#include "dflash/draft_model_gpu.h"
#endif
#include "dflash/walk.h"

namespace lb {
namespace {

using dflash::AcceptanceStats;
using dflash::DDTree;
using dflash::DDTreeOptions;
using dflash::DraftConfig;
using dflash::DraftModelCpu;
#if defined(LB_HAVE_GPU)
using dflash::DraftModelGpu;
#endif

double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// The target's embedding table and LM head in fp32, which the CPU draft borrows. The backend keeps its own
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

// The draft as the loop sees it: context rows taken from a verify, and one round's per-depth candidates.
class Drafter {
public:
    virtual ~Drafter() = default;
    virtual const DraftConfig& config() const = 0;
    virtual void reset() = 0;
    // Whether verifies should leave their features on the device (VerifyRequest::features_on_device).
    virtual bool device_features() const = 0;
    // The features of the verify rows `rows` (every row of an n-row verify was an out row) become context.
    virtual void add_rows(const VerifyResult& r, int n_rows, const std::vector<int>& rows) = 0;
    // The candidates of depths 1..block_size - 1 after `bonus`, k per depth.
    virtual std::vector<dflash::DepthCandidates> propose(int bonus, int k) = 0;
};

class CpuDrafter : public Drafter {
public:
    CpuDrafter(DraftModelCpu& draft, const TargetHead& head, const ModelConfig& cfg)
        : draft_(draft), head_(head), H_(cfg.hidden), V_(cfg.vocab) {}
    const DraftConfig& config() const override { return draft_.config(); }
    void reset() override { draft_.reset(); }
    bool device_features() const override { return false; }
    void add_rows(const VerifyResult& r, int n_rows, const std::vector<int>& rows) override {
        const size_t fw = size_t(draft_.config().feature_width());
        std::vector<float> feats(rows.size() * fw);
        for (size_t i = 0; i < rows.size(); ++i)
            std::copy(&r.features[size_t(rows[i]) * fw], &r.features[size_t(rows[i]) * fw] + fw, &feats[i * fw]);
        draft_.add_context(feats.data(), int(rows.size()));
    }
    std::vector<dflash::DepthCandidates> propose(int bonus, int k) override {
        const DraftConfig& dc = draft_.config();
        const int D = dc.block_size - 1;
        block_.resize(size_t(dc.block_size) * H_);
        hidden_.resize(size_t(D) * H_);
        logits_.resize(size_t(D) * V_);
        for (int i = 0; i < dc.block_size; ++i) {
            const int tok = i == 0 ? bonus : dc.mask_token_id;
            std::copy(head_.embed + int64_t(tok) * H_, head_.embed + int64_t(tok + 1) * H_, &block_[size_t(i) * H_]);
        }
        draft_.forward_block(block_.data(), hidden_.data());
        draft_.logits(hidden_.data(), D, head_.lm_head, V_, logits_.data());
        std::vector<dflash::DepthCandidates> depths;
        for (int d = 0; d < D; ++d) depths.push_back(dflash::top_k_logprobs(&logits_[size_t(d) * V_], V_, k));
        return depths;
    }

private:
    DraftModelCpu& draft_;
    const TargetHead& head_;
    int H_, V_;
    std::vector<float> block_, hidden_, logits_;
};

#if defined(LB_HAVE_GPU)
class GpuDrafter : public Drafter {
public:
    explicit GpuDrafter(DraftModelGpu& draft) : draft_(draft) {}
    const DraftConfig& config() const override { return draft_.config(); }
    void reset() override { draft_.reset(); }
    bool device_features() const override { return true; }
    void add_rows(const VerifyResult& r, int n_rows, const std::vector<int>& rows) override {
        if (!r.device_features) fail("internal", "the verify left no device features");
        draft_.add_verify_rows(r.device_features, n_rows, rows);
    }
    std::vector<dflash::DepthCandidates> propose(int bonus, int k) override { return draft_.propose(bonus, k); }

private:
    DraftModelGpu& draft_;
};
#endif

// The benchmark-only forced acceptance (see the top of this file): tokens committed by round r.
int forced_commit(double accept_length, int64_t round) {
    const double eps = 1e-9;  // 8.31 * 100 is 830.9999...: count the schedule's exact multiples as reached
    return int(std::floor(double(round + 1) * accept_length + eps) - std::floor(double(round) * accept_length + eps));
}

// The forced walk: `accepted` nodes down the tree's first-child path (the first child of a slot is its best
// candidate: slots are in insertion order), fewer where the path ends; the bonus is the target's argmax there.
dflash::WalkResult forced_walk(const DDTree& tree, const int* target_argmax, int accepted) {
    const std::vector<std::vector<int>> children = tree.children();
    dflash::WalkResult w;
    w.path.push_back(0);
    while (int(w.path.size()) <= accepted && !children[size_t(w.path.back())].empty())
        w.path.push_back(children[size_t(w.path.back())].front());
    w.bonus = target_argmax[w.path.back()];
    return w;
}

struct LoopOptions {
    DDTreeOptions tree;
    double force_accept_length = 0;  // 0: the real walk
    int prefill_chunk = 0;           // rows per prefill verify; 0: the whole prompt in one
};

class DFlashHandler : public RequestHandler {
public:
    DFlashHandler(Backend& be, const ModelConfig& cfg, Drafter& draft, const LoopOptions& opt, int max_ctx)
        : be_(be), cfg_(cfg), draft_(draft), opt_(opt), tree_opt_(opt.tree), max_ctx_(max_ctx) {
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

        // Prefill: the prompt as a chain (in chunks), features of every position for the draft's context.
        // The logits asked for by return_logits come from a last, one-row verify of the last token, so no
        // verify holds [n_prompt, vocab] logits for them.
        g.t_prefill_start = monotonic_ns();
        be_.timer_start();
        const int n_split = req.return_logits && n_prompt > 1 ? n_prompt - 1 : n_prompt;
        const int chunk = opt_.prefill_chunk > 0 ? opt_.prefill_chunk : n_prompt;
        int next = -1;
        for (int begin = 0; begin < n_prompt;) {
            const int end = begin < n_split ? std::min(begin + chunk, n_split) : n_prompt;
            const int n = end - begin;
            VerifyRequest pre;
            pre.tokens.assign(req.prompt_ids.begin() + begin, req.prompt_ids.begin() + end);
            for (int i = 0; i < n; ++i) pre.positions.push_back(begin + i);
            pre.feature_layers = dc.target_layer_ids;
            pre.features_on_device = draft_.device_features();
            pre.want_logits = req.return_logits && end == n_prompt;
            if (pre.want_logits) pre.out_rows = {n - 1};
            VerifyResult pr;
            be_.verify(pre, &pr);
            std::vector<int> path(static_cast<size_t>(n));
            for (int i = 0; i < n; ++i) path[size_t(i)] = i;
            be_.commit(path);
            if (pre.want_logits) g.logits = std::move(pr.logits);  // out_rows {n - 1} = the whole of n = 1
            draft_.add_rows(pr, n, path);
            next = pr.argmax.back();
            begin = end;
        }
        g.out.push_back(next);
        g.prefill_ms = be_.timer_stop_ms();
        g.t_prefill_end = g.t_decode_end = monotonic_ns();

        bool stopped = stop_at(g.out.back());
        if (stopped) g.stop = "eos";
        if (!stopped && req.n_gen > 1) {
            be_.timer_start();
            const int K = tree_opt_.chain ? 1 : std::min(tree_opt_.budget, tree_opt_.top_k);
            while (!stopped && int(g.out.size()) < req.n_gen) {
                const int bonus = g.out.back();
                const int length = be_.length();
                // Draft.
                auto t0 = std::chrono::steady_clock::now();
                std::vector<dflash::DepthCandidates> depths = draft_.propose(bonus, K);
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
                vr.features_on_device = draft_.device_features();
                VerifyResult res;
                be_.verify(vr, &res);
                stats.verify_ms += ms_since(t0);
                // Walk, commit, feature rows of the accepted path. The device work is waited for, so that
                // the commit's time is its own, not the next draft's.
                t0 = std::chrono::steady_clock::now();
                dflash::WalkResult w =
                    opt_.force_accept_length > 0
                        ? forced_walk(tree, res.argmax.data(), forced_commit(opt_.force_accept_length, stats.rounds) - 1)
                        : dflash::walk_tree(tree, res.argmax.data());
                be_.commit(w.path);
                draft_.add_rows(res, tree.size(), w.path);
                be_.synchronize();
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
        Json spec = stats.to_json();
        if (opt_.force_accept_length > 0) spec["forced_acceptance_length"] = opt_.force_accept_length;
        out["spec"] = spec;
        return out;
    }

private:
    Backend& be_;
    const ModelConfig& cfg_;
    Drafter& draft_;
    LoopOptions opt_;
    DDTreeOptions tree_opt_;
    int max_ctx_;
    FILE* trace_ = nullptr;
};

// This engine's own flags, taken out of argv before the common parser sees it:
//   --top-k N                  candidates per depth, N >= 1 (default 8; the tree uses min(budget, N))
//   --chain-seed on|off        insert the top-1 chain before growing best-first (default on)
//   --force-accept-length A    benchmark only: commit A tokens a round on average (1 <= A <= min(budget,
//                              block_size - 1) + 1) instead of walking the target's argmax (top of this file)
//   --prefill-chunk N          prompt rows per prefill verify, N >= 1 (default: the whole prompt on the CPU,
//                              256 on a GPU, where a verify holds [rows, vocab] logits)
std::vector<char*> take_loop_flags(int argc, char** argv, LoopOptions* loop) {
    auto take = [loop](const std::string& flag, const std::string& value) {
        DDTreeOptions* tree = &loop->tree;
        if (flag == "--top-k" || flag == "--prefill-chunk") {
            char* end = nullptr;
            const long k = std::strtol(value.c_str(), &end, 10);
            if (value.empty() || *end || k < 1 || k > 1 << 20)
                fail("bad_request", flag + " must be an integer >= 1, got '" + value + "'");
            (flag == "--top-k" ? tree->top_k : loop->prefill_chunk) = int(k);
        } else if (flag == "--chain-seed") {
            if (value != "on" && value != "off") fail("bad_request", "--chain-seed must be on or off, got '" + value + "'");
            tree->chain_seed = value == "on";
        } else {
            char* end = nullptr;
            const double x = std::strtod(value.c_str(), &end);
            if (value.empty() || *end || !std::isfinite(x) || x < 1.0)
                fail("bad_request", "--force-accept-length must be a number >= 1, got '" + value + "'");
            loop->force_accept_length = x;
        }
    };
    return take_own_flags(argc, argv, {"--top-k", "--chain-seed", "--force-accept-length", "--prefill-chunk"}, take);
}

// Prompt rows per prefill verify on a GPU by default: bounds the verify's [rows, vocab] logits (254 MB at
// the 248K vocabulary).
constexpr int kGpuPrefillChunk = 256;

int run(int argc, char** argv) {
    EngineOptions opt;
    LoopOptions loop;
    DDTreeOptions& tree_opt = loop.tree;
    try {
        std::vector<char*> rest = take_loop_flags(argc, argv, &loop);
        opt = parse_engine_flags(int(rest.size()), rest.data(), kFlagDraft | kFlagBudget | kFlagChain);
        if (opt.draft.empty()) fail("bad_request", "lucebench-dflash needs --draft PATH (a DFlash draft checkpoint)");
    } catch (const EngineError& e) {
        emit_error("", e.kind == "unsupported" ? "unsupported" : "load", e.what());
        return 2;
    }
    const std::string backend = backend_name(opt);
    std::unique_ptr<Backend> be;
    ModelConfig cfg;
    LoadStats stats;
    DraftModelCpu cpu_draft;
    TargetHead head;
    std::unique_ptr<Drafter> drafter;
    uint64_t draft_weight_bytes = 0, draft_cache_bytes = 0, draft_buffer_bytes = 0;
    std::string draft_cache_dtype = "f32", draft_format;
    Json draft_types = Json::object();
#if defined(LB_HAVE_GPU)
    std::unique_ptr<DraftModelGpu> gpu_draft;
#endif
    const bool loaded = load_or_report([&] {
        be = make_backend(backend, opt.device);
        fprintf(stderr, "[dflash] loading %s and draft %s on %s\n", opt.model.c_str(), opt.draft.c_str(), backend.c_str());
        auto src = open_checkpoint(opt.model);
        cfg = config_from_source(*src);
        auto dsrc = open_checkpoint(opt.draft);
        DraftConfig dc = dflash::draft_config_from_source(*dsrc, cfg.n_layers);
        draft_format = dsrc->format();
        for (const auto& name : dsrc->names()) {  // the draft file's tensor types, e.g. {"f32": 13, "q8_0": 17}
            const char* t = dtype_name(dsrc->find(name)->dtype);
            const Json* n = draft_types.get(t);
            draft_types[t] = Json(int64_t(n ? n->as_int() : 0) + 1);
        }
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
        const int deepest = std::min(tree_opt.budget, dc.block_size - 1);
        if (loop.force_accept_length > deepest + 1)
            fail("bad_request", "--force-accept-length " + std::to_string(loop.force_accept_length) +
                                    " exceeds what a round can commit here: " + std::to_string(deepest + 1) +
                                    " (min(budget, block_size - 1) + 1)");
        be->load(*src, cfg, &stats);
        // The verify rows sit after the committed sequence: room for the largest tree past max_ctx.
        be->allocate(opt.max_ctx + tree_opt.budget + 1, opt.kv_k, opt.kv_v);
        if (backend == "cpu") {
            head.load(*src, cfg);
            cpu_draft.load(*dsrc, dc);
            cpu_draft.allocate(opt.max_ctx + dc.block_size);
            draft_weight_bytes = cpu_draft.weight_bytes();
            draft_cache_bytes = cpu_draft.context_cache_bytes();
            drafter = std::make_unique<CpuDrafter>(cpu_draft, head, cfg);
        } else {
#if defined(LB_HAVE_GPU)
            // The device features hold one slot per distinct layer; the draft reads them in its own order.
            for (size_t i = 0; i < dc.target_layer_ids.size(); ++i)
                for (size_t j = 0; j < i; ++j)
                    if (dc.target_layer_ids[i] == dc.target_layer_ids[j])
                        fail("unsupported", "draft " + opt.draft + ": target layer " + std::to_string(dc.target_layer_ids[i]) +
                                                " is listed twice in target_layer_ids (the GPU draft takes distinct layers)");
            if (loop.prefill_chunk == 0) loop.prefill_chunk = kGpuPrefillChunk;
            gpu_draft = std::make_unique<DraftModelGpu>(be->device_head());
            gpu_draft->load(*dsrc, dc);
            gpu_draft->allocate(opt.max_ctx + dc.block_size, loop.prefill_chunk, cfg.vocab,
                                tuning().dflash_draft_bf16 ? DType::BF16 : DType::F32);
            draft_weight_bytes = gpu_draft->weight_bytes();
            draft_cache_bytes = gpu_draft->context_cache_bytes();
            if (tuning().dflash_draft_bf16) draft_cache_dtype = "bf16";
            draft_buffer_bytes = gpu_draft->buffer_bytes();
            drafter = std::make_unique<GpuDrafter>(*gpu_draft);
#endif
        }
    });
    if (!loaded) return 1;
    const DraftConfig& dc = drafter->config();
    fprintf(stderr, "[dflash] target %s: %d layers, hidden %d, vocab %d; draft: %d layers, block %d, features of layers",
            arch_name(cfg.arch), cfg.n_layers, cfg.hidden, cfg.vocab, dc.n_layers, dc.block_size);
    for (int id : dc.target_layer_ids) fprintf(stderr, " %d", id);
    fprintf(stderr, "; draft weights %.1f MB, context cache %.1f MB, buffers %.1f MB\n", draft_weight_bytes / 1e6,
            draft_cache_bytes / 1e6, draft_buffer_bytes / 1e6);
    Json options = kv_options(opt, be->weight_dtype());
    options["draft"] = opt.draft;
    options["budget"] = tree_opt.budget;
    options["chain"] = tree_opt.chain;
    options["chain_seed"] = tree_opt.chain_seed;
    options["top_k"] = tree_opt.chain ? 1 : std::min(tree_opt.budget, tree_opt.top_k);
    options["block_size"] = dc.block_size;
    // The draft file's format and tensor types; whatever they are, the draft computes in fp32 on the CPU and
    // holds its matrices in the backend's matrix type on a GPU (a quantised GGUF draft is decoded at load:
    // its memory is then that type's size, model.memory.draft).
    options["draft_format"] = draft_format;
    options["draft_file_types"] = draft_types;
    options["draft_dtype"] = backend == "cpu" ? std::string("f32") : be->weight_dtype();
    options["draft_cache_dtype"] = draft_cache_dtype;  // the draft's context K/V (LB_DFLASH_DRAFT_BF16)
    options["prefill_chunk"] = loop.prefill_chunk;  // 0: the whole prompt in one verify
    options["force_accept_length"] = loop.force_accept_length > 0 ? Json(loop.force_accept_length) : Json();
    const MemoryReport mem = be->memory();
    Json ready = ready_line("dflash", backend, options, cfg, stats, be->device(), opt.max_ctx, mem.weights ? &mem : nullptr);
    // The draft's share of memory beside the target's (model.memory.draft): weights, its context K/V cache for
    // max_ctx rows and, on a GPU, its workspace (activations, the block's logits over the vocabulary).
    Json draft_mem = Json::object();
    draft_mem["weights_bytes"] = Json(draft_weight_bytes);
    draft_mem["context_cache_bytes"] = Json(draft_cache_bytes);
    draft_mem["context_cache_dtype"] = draft_cache_dtype;
    draft_mem["buffer_bytes"] = Json(draft_buffer_bytes);
    if (mem.weights) ready["model"]["memory"]["draft"] = draft_mem;
    emit(ready);

    DFlashHandler handler(*be, cfg, *drafter, loop, opt.max_ctx);
    return serve(handler);
}

}  // namespace
}  // namespace lb

int main(int argc, char** argv) { return lb::run(argc, argv); }
