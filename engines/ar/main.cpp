// lucebench-ar: autoregressive greedy decoding (Qwen3.5 hybrid models on every backend, Qwen3 dense models
// on the cpu backend), speaking docs/protocol.md.
// Prefill runs the whole prompt through one forward (parallel over tokens), then decode runs one
// forward per generated token (Backend::decode). Logs go to stderr; stdout carries only protocol lines.
#include <cstdio>
#include <memory>

#include "core/backend.h"
#include "core/engine_main.h"
#include "core/errors.h"
#include "core/server.h"

namespace lb {
namespace {

class ArHandler : public RequestHandler {
public:
    ArHandler(Backend& be, const ModelConfig& cfg, int max_ctx) : be_(be), cfg_(cfg), max_ctx_(max_ctx) {}
    int vocab_size() const override { return cfg_.vocab; }
    int max_ctx() const override { return max_ctx_; }

    Json generate(const GenerateRequest& req) override {
        // Decode: one forward of the last token per step (the backend's decode loop; the GPU backend keeps
        // two steps in flight).
        Generation g = run_generation(be_, req, [&](std::vector<int>& out) {
            be_.decode(req.n_gen - int(out.size()), [&](int tok) { return !req.ignore_eos && is_eos(req, tok); },
                       &out);
        });
        return generation_reply(req, g, be_.decode_bytes(mean_decode_ctx(req, g)), be_.peak_mem_bytes());
    }

private:
    Backend& be_;
    const ModelConfig& cfg_;
    int max_ctx_;
};

int run(int argc, char** argv) {
    EngineOptions opt;
    if (!parse_flags_or_report(argc, argv, &opt)) return 2;
    const std::string backend = backend_name(opt);
    std::unique_ptr<Backend> be;
    ModelConfig cfg;
    LoadStats stats;
    const bool loaded = load_or_report([&] {
        be = make_backend(backend, opt.device);
        fprintf(stderr, "[ar] loading %s on %s\n", opt.model.c_str(), backend.c_str());
        auto src = open_checkpoint(opt.model);
        cfg = config_from_source(*src);
        be->load(*src, cfg, &stats);
        be->allocate(opt.max_ctx, opt.kv_k, opt.kv_v);
    });
    if (!loaded) return 1;
    fprintf(stderr, "[ar] loaded %s: %d layers (%d attention), hidden %d, vocab %d, %lld params\n", arch_name(cfg.arch),
            cfg.n_layers, cfg.n_full_layers(), cfg.hidden, cfg.vocab, (long long)stats.n_params);
    const MemoryReport mem = be->memory();
    emit(ready_line("ar", backend, kv_options(opt, be->weight_dtype()), cfg, stats, be->device(), opt.max_ctx,
                    mem.weights ? &mem : nullptr));

    ArHandler handler(*be, cfg, opt.max_ctx);
    return serve(handler);
}

}  // namespace
}  // namespace lb

int main(int argc, char** argv) { return lb::run(argc, argv); }
