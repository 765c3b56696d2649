// lucebench-pflash: speculative prefill (docs/engines.md, "PFlash"). A small Qwen3 drafter reads the whole
// prompt; the attention of its last prompt tokens ranks 32-token chunks; the kept chunks' text, mapped onto
// the target's tokens through character offsets sent with the request, is all the target prefills; then
// greedy autoregressive decoding. Both models on one backend: cpu, or the GPU one this binary was built
// for (two backends in one process, each with its own device context).
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/engine_main.h"
#include "core/errors.h"
#include "core/server.h"
#include "pflash/compress.h"

namespace lb {
namespace {

// Drafter tokens per plain forward before the scored tail on the CPU backend: bounds the activations of
// one forward. The GPU backend takes the whole prompt in one scored forward and chunks it itself
// (LB_GPU_PREFILL_CHUNK), with the tail rows in its last chunk.
constexpr int kCpuDrafterChunk = 2048;

// The drafter's prefill attention (docs/engines.md, "PFlash"): block-sparse (gpu::BlockSparse, and the same
// rule on the CPU) in forwards whose sequence reaches `from` tokens, dense below; from = 0: always dense.
// Defaults: upstream's (block-sparse above about 32K tokens, alpha 0.85) and the budget measured in
// docs/benchmarks.md ("CPU: the block-sparse budget and retention").
// The drafter's KV cache type is its own (--drafter-kv): --kv-k/--kv-v set the target's (a cell's `kv`, as
// llama.cpp's -ctk/-ctv). bf16 by default, as upstream's drafter runs (BF16 weights, bf16 FlashPrefill
// attention): a quantised cache halves the drafter's (Qwen3-0.6B at 128K tokens: 14 GiB bf16, 7.4 GiB q8_0)
// but sends the GPU's flash attention down its slower path (a q8_0 key or value tile is dequantised element
// by element instead of copied with cp.async).
struct DrafterOptions {
    int from = 32768;
    double alpha = 0.85;   // a key block is kept when within ln(alpha) of its query tile's best block score
    double budget = 0.10;  // of the blocks a query tile sees, the share it may keep beyond its sink and recent ones
    DType kv = DType::BF16;  // the drafter's K and V cache type (--drafter-kv)
};

// This engine's own flags, taken out of argv before the common parser sees it:
//   --drafter-sparse-from N     block-sparse drafter attention in forwards of >= N tokens, N >= 0 (0: dense)
//   --drafter-sparse-alpha A    its threshold alpha, 0 < A <= 1
//   --drafter-sparse-budget B   its budget, a fraction 0 < B <= 1 (1: no bound)
//   --drafter-kv TYPE           the drafter's K and V cache type: bf16 (default), f16, q8_0, q4_0; f32 for checks
std::vector<char*> take_drafter_flags(int argc, char** argv, DrafterOptions* att) {
    auto take = [att](const std::string& flag, const std::string& value) {
        char* end = nullptr;
        if (flag == "--drafter-kv") {
            if (!dtype_from_name(value, &att->kv))
                fail("unsupported", "KV cache type '" + value + "' for --drafter-kv (supported: f16, bf16, q8_0, "
                                    "q4_0; f32 for reference checks)");
        } else if (flag == "--drafter-sparse-from") {
            errno = 0;
            const long n = std::strtol(value.c_str(), &end, 10);
            if (value.empty() || *end || errno == ERANGE || n < 0 || n > 1 << 30)
                fail("bad_request", flag + " must be an integer >= 0 (0: dense attention), got '" + value + "'");
            att->from = int(n);
        } else {
            const double x = std::strtod(value.c_str(), &end);
            const bool alpha = flag == "--drafter-sparse-alpha";
            if (value.empty() || *end || !(x > 0.0 && x <= 1.0))
                fail("bad_request", flag + " must be a number in (0, 1] (a fraction: " +
                                        (alpha ? "0.85, not 85" : "0.1, not 10") + "), got '" + value + "'");
            (alpha ? att->alpha : att->budget) = x;
        }
    };
    return take_own_flags(argc, argv,
                          {"--drafter-sparse-from", "--drafter-sparse-alpha", "--drafter-sparse-budget", "--drafter-kv"},
                          take);
}

// A fraction as a percentage for the ready line's text: 0.85 -> "85".
std::string percent(double x) {
    char b[32];
    snprintf(b, sizeof b, "%g", x * 100.0);
    return b;
}

class PFlashHandler : public RequestHandler {
public:
    PFlashHandler(Backend& target, const ModelConfig& tcfg, Backend& drafter, const ModelConfig& dcfg,
                  const EngineOptions& opt, const DrafterOptions& att)
        : target_(target), tcfg_(tcfg), drafter_(drafter), dcfg_(dcfg), opt_(opt), att_(att),
          drafter_ctx_(opt.max_ctx) {}
    int vocab_size() const override { return tcfg_.vocab; }
    int max_ctx() const override { return opt_.max_ctx; }

    Json generate(const GenerateRequest& req) override {
        const int nt = int(req.prompt_ids.size()), nd = int(req.drafter_ids.size());
        if (nd == 0 || req.drafter_offsets.empty() || req.target_offsets.empty())
            fail("bad_request", "lucebench-pflash needs drafter_ids, drafter_offsets and target_offsets with the prompt "
                                "(docs/protocol.md): the harness tokenises the prompt's text with both tokenizers");
        // The bridge walks both offset arrays in order: starts must not go back.
        for (const std::vector<int>* o : {&req.drafter_offsets, &req.target_offsets})
            for (size_t i = 2; i < o->size(); i += 2)
                if ((*o)[i] < (*o)[i - 2])
                    fail("bad_request", std::string(o == &req.target_offsets ? "target" : "drafter") +
                                            "_offsets must be in text order (token starts never decrease)");
        for (int t : req.drafter_ids)
            if (t >= dcfg_.vocab)
                fail("bad_request", "drafter token id " + std::to_string(t) + " outside the drafter's vocabulary [0, " +
                                        std::to_string(dcfg_.vocab) + ")");
        Generation g;
        target_.synchronize();
        g.t_prefill_start = monotonic_ns();
        Timer clock;
        std::vector<float> raw, smoothed;  // the importance, when the prompt was scored

        // Prompts shorter than the threshold are not compressed (upstream: 32,000 tokens): the target prefills
        // all of them, and the reply says so (kept = all, no drafter forward).
        const bool compress = nt >= opt_.min_prompt_tokens;
        double score_ms = 0, select_ms = 0, bridge_ms = 0, drafter_ms = 0, drafter_read = -1;
        pflash::Selection sel;
        pflash::Bridged kept;
        std::vector<int> ids;
        if (compress) {
            // Score: the drafter over the whole prompt, the tail rows' attention captured in the last forward.
            if (nd > drafter_ctx_) {
                drafter_ctx_ = nd;
                drafter_.allocate(drafter_ctx_, att_.kv, att_.kv);
            }
            drafter_.reset();
            const int n_tail = std::min(rule_.n_tail, nd);
            const int head = drafter_.name() == "cpu" ? nd - n_tail : 0;  // tokens before the scored forward
            drafter_.timer_start();
            // block-sparse: the head in one forward, whose last 256 rows are dense (as the GPU's one forward)
            const bool sparse = att_.from > 0 && nd >= att_.from;
            const int cpu_chunk = sparse ? std::max(1, head) : kCpuDrafterChunk;
            for (int a = 0; a < head; a += cpu_chunk)
                drafter_.forward(req.drafter_ids.data() + a, std::min(cpu_chunk, head - a), nullptr);
            TailScores scores;
            drafter_.forward_scored(req.drafter_ids.data() + head, nd - head, n_tail, &scores);
            drafter_ms = drafter_.timer_stop_ms();
            drafter_read = drafter_.block_sparse_read_fraction();
            raw = pflash::importance(scores);
            smoothed = pflash::smooth(raw, rule_.pool);
            score_ms = clock.lap();

            sel = pflash::select_chunks(smoothed, req.drafter_ids, opt_.keep_ratio, rule_);
            select_ms = clock.lap();

            kept = pflash::bridge(sel.kept, rule_.chunk, req.drafter_offsets, req.target_offsets);
            ids.reserve(kept.target_positions.size());
            for (int p : kept.target_positions) ids.push_back(req.prompt_ids[size_t(p)]);
            if (ids.empty()) fail("internal", "the bridge kept no target token (the offsets do not cover the same text?)");
            bridge_ms = clock.lap();
        } else {
            ids = req.prompt_ids;
            kept.kept_drafter = nd;
            kept.target_positions.resize(size_t(nt));
            for (int p = 0; p < nt; ++p) kept.target_positions[size_t(p)] = p;
            kept.char_spans.push_back({0, req.target_offsets.back()});  // the whole text, as the bridge spans it
            sel.n_chunks = (nd + rule_.chunk - 1) / rule_.chunk;
            for (int c = 0; c < sel.n_chunks; ++c) sel.kept.push_back(c);
            clock.lap();
        }

        // The target prefills the kept prompt at positions 0.. (original positions are not kept).
        target_.reset();
        target_.timer_start();
        g.out.push_back(target_.forward(ids.data(), int(ids.size()), req.return_logits ? &g.logits : nullptr));
        const double target_ms = target_.timer_stop_ms();
        g.prefill_ms = clock.lap() + score_ms + select_ms + bridge_ms;
        g.t_prefill_end = g.t_decode_end = monotonic_ns();
        if (!req.ignore_eos && is_eos(req, g.out.back())) {
            g.stop = "eos";
        } else if (req.n_gen > 1) {
            if (int(ids.size()) + req.n_gen > opt_.max_ctx)
                fail("context_overflow", "kept prompt " + std::to_string(ids.size()) + " + n_gen exceeds max_ctx");
            target_.timer_start();
            target_.decode(req.n_gen - 1, [&](int tok) { return !req.ignore_eos && is_eos(req, tok); }, &g.out);
            g.decode_ms = target_.timer_stop_ms();
            g.t_decode_end = monotonic_ns();
            g.decode_steps = int(g.out.size()) - 1;
            if (!req.ignore_eos && is_eos(req, g.out.back())) g.stop = "eos";
        }
        const int mean_ctx = int(ids.size()) + g.decode_steps / 2;
        Json r = generation_reply(req, g, target_.decode_bytes(mean_ctx),
                                  std::max(target_.peak_mem_bytes(), drafter_.peak_mem_bytes()));
        Json pf = Json::object();
        pf["compressed"] = compress;
        pf["prompt_tokens"] = nt;
        pf["drafter_prompt_tokens"] = nd;
        pf["kept_tokens_drafter"] = kept.kept_drafter;
        pf["kept_tokens_target"] = int(ids.size());
        pf["kept_ranges"] = pairs(pflash::runs(kept.target_positions));
        pf["kept_char_ranges"] = pairs(kept.char_spans);
        pf["kept_chunks"] = int(sel.kept.size());
        pf["forced_chunks"] = int(sel.forced.size());
        pf["n_chunks"] = sel.n_chunks;
        Json t = Json::object();
        t["score"] = score_ms;  // the drafter's forwards, the importance's reduction and smoothing
        t["select"] = select_ms;
        t["bridge"] = bridge_ms;
        t["target_prefill"] = target_ms;
        pf["time_ms"] = t;
        pf["drafter_forward_ms"] = drafter_ms;  // of score: the drafter's forwards (the backend's timer)
        // block-sparse drafter attention: the share of the causal key tiles it read (all layers)
        if (compress && drafter_read >= 0) pf["drafter_attention_read"] = drafter_read;
        Json mem = Json::object();  // device (or host) bytes each model holds: weights, caches, scratch
        mem["target"] = Json(int64_t(target_.peak_mem_bytes()));
        mem["drafter"] = Json(int64_t(drafter_.peak_mem_bytes()));
        pf["memory_bytes"] = mem;
        r["prefill"] = pf;
        if (req.return_importance && compress) {
            Json a = Json::array(), b = Json::array();
            for (float v : raw) a.push_back(Json(double(v)));
            for (float v : smoothed) b.push_back(Json(double(v)));
            r["importance"] = a;
            r["importance_smoothed"] = b;
        }
        return r;
    }

private:
    // Wall-clock laps of the phases (the CPU backend's own timer is wall clock too).
    struct Timer {
        uint64_t t = monotonic_ns();
        double lap() { const uint64_t now = monotonic_ns(); const double ms = double(now - t) / 1e6; t = now; return ms; }
    };
    static Json pairs(const std::vector<std::pair<int, int>>& v) {
        Json out = Json::array();
        for (auto [a, b] : v) { Json p = Json::array(); p.push_back(Json(a)); p.push_back(Json(b)); out.push_back(p); }
        return out;
    }

    Backend& target_;
    const ModelConfig& tcfg_;
    Backend& drafter_;
    const ModelConfig& dcfg_;
    EngineOptions opt_;
    DrafterOptions att_;
    int drafter_ctx_;
    pflash::Rule rule_;
};

int run(int argc, char** argv) {
    EngineOptions opt;
    DrafterOptions att;
    try {
        std::vector<char*> rest = take_drafter_flags(argc, argv, &att);
        opt = parse_engine_flags(int(rest.size()), rest.data(), kFlagDrafter | kFlagKeepRatio | kFlagMinPromptTokens);
        if (opt.drafter.empty()) fail("bad_request", "lucebench-pflash needs --drafter PATH (a Qwen3 checkpoint)");
    } catch (const EngineError& e) {
        emit_error("", e.kind == "unsupported" ? "unsupported" : "load", e.what());
        return 2;
    }
    if (opt.keep_ratio == 0.0) opt.keep_ratio = 0.05;  // upstream's default
    if (opt.min_prompt_tokens < 0) opt.min_prompt_tokens = 32000;  // upstream compresses above 32,000 tokens
    const std::string backend = backend_name(opt);
    std::unique_ptr<Backend> target, drafter;
    ModelConfig tcfg, dcfg;
    LoadStats tstats, dstats;
    const bool loaded = load_or_report([&] {
        target = make_backend(backend, opt.device);
        drafter = make_backend(backend, opt.device);
        fprintf(stderr, "[pflash] loading target %s and drafter %s on %s\n", opt.model.c_str(), opt.drafter.c_str(),
                backend.c_str());
        auto tsrc = open_checkpoint(opt.model);
        tcfg = config_from_source(*tsrc);
        target->load(*tsrc, tcfg, &tstats);
        target->allocate(opt.max_ctx, opt.kv_k, opt.kv_v);
        auto dsrc = open_checkpoint(opt.drafter);
        dcfg = config_from_source(*dsrc);
        if (dcfg.arch != Arch::Qwen3)
            fail("unsupported", "the drafter " + opt.drafter + " is a " + arch_name(dcfg.arch) +
                                    " model; PFlash scores with a dense Qwen3 drafter");
        drafter->load(*dsrc, dcfg, &dstats);
        drafter->allocate(opt.max_ctx, att.kv, att.kv);
        drafter->set_block_sparse(att.from, float(att.alpha), float(att.budget));
    });
    if (!loaded) return 1;
    fprintf(stderr, "[pflash] target %s %d layers, drafter %s %d layers, keep ratio %g above %d prompt tokens, "
            "drafter attention block-sparse from %d tokens (0: dense), drafter KV %s\n", arch_name(tcfg.arch),
            tcfg.n_layers, arch_name(dcfg.arch), dcfg.n_layers, opt.keep_ratio, opt.min_prompt_tokens, att.from,
            dtype_name(att.kv));
    Json options = kv_options(opt, target->weight_dtype());
    options["keep_ratio"] = opt.keep_ratio;
    options["min_prompt_tokens"] = opt.min_prompt_tokens;
    options["importance"] = "pre-RoPE attention of the last 8 prompt tokens, causal, max over layers and heads, "
                            "mean over rows, average pool 13";
    options["chunk"] = 32;
    options["bridge"] = "character offsets";
    options["drafter"] = opt.drafter;
    options["drafter_sparse_from"] = att.from;
    options["drafter_sparse_alpha"] = att.alpha;
    options["drafter_sparse_budget"] = att.budget;
    options["drafter_kv"] = dtype_name(att.kv);  // kv_k / kv_v are the target's
    options["drafter_attention"] =
        att.from > 0
            ? "block-sparse from " + std::to_string(att.from) + " tokens (dense below): 128-token key blocks, kept " +
                  "when within ln(alpha) of the query tile's best block score (mean q . mean k), alpha " +
                  percent(att.alpha) + "%, at most " + percent(att.budget) + "% of the blocks a query tile sees " +
                  "beyond 2 sink and 4 recent blocks (the best-scoring), the last 256 rows dense"
            : "dense";
    Json dm = Json::object();
    dm["arch"] = arch_name(dcfg.arch);
    dm["n_layers"] = dcfg.n_layers;
    dm["hidden_size"] = dcfg.hidden;
    dm["vocab_size"] = dcfg.vocab;
    dm["n_params"] = Json(dstats.n_params);
    options["drafter_model"] = dm;
    const MemoryReport mem = target->memory();
    emit(ready_line("pflash", backend, options, tcfg, tstats, target->device(), opt.max_ctx, &mem));

    PFlashHandler handler(*target, tcfg, *drafter, dcfg, opt, att);
    return serve(handler);
}

}  // namespace
}  // namespace lb

int main(int argc, char** argv) { return lb::run(argc, argv); }
