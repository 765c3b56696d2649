// lucebench-ar: autoregressive greedy decoding of Qwen3.5 hybrid models, speaking docs/protocol.md.
// Prefill runs the whole prompt through one forward (parallel over tokens), then decode runs one
// forward per generated token. Logs go to stderr; stdout carries only protocol lines.
#include <cstdio>
#include <memory>

#include "core/backend.h"
#include "core/errors.h"
#include "core/server.h"

namespace lb {
namespace {

class ArHandler : public RequestHandler {
public:
    ArHandler(Qwen35Backend& be, const Qwen35Config& cfg, int max_ctx) : be_(be), cfg_(cfg), max_ctx_(max_ctx) {}
    int vocab_size() const override { return cfg_.vocab; }
    int max_ctx() const override { return max_ctx_; }

    Json generate(const GenerateRequest& req) override {
        auto is_eos = [&](int t) {
            for (int e : req.eos_ids) if (e == t) return true;
            return false;
        };
        be_.synchronize();
        be_.reset();
        std::vector<float> logits;
        const uint64_t t_prefill_start = monotonic_ns();
        be_.timer_start();
        int tok = be_.forward(req.prompt_ids.data(), int(req.prompt_ids.size()), req.return_logits ? &logits : nullptr);
        const double prefill_ms = be_.timer_stop_ms();
        const uint64_t t_prefill_end = monotonic_ns();
        std::vector<int> out{tok};
        std::string stop = "length";
        int steps = 0;
        double decode_ms = 0;
        uint64_t t_decode_end = t_prefill_end;
        if (!req.ignore_eos && is_eos(tok)) stop = "eos";
        else if (req.n_gen > 1) {
            be_.timer_start();
            while (int(out.size()) < req.n_gen) {
                tok = be_.forward(&out.back(), 1, nullptr);
                ++steps;
                out.push_back(tok);
                if (!req.ignore_eos && is_eos(tok)) { stop = "eos"; break; }
            }
            decode_ms = be_.timer_stop_ms();
            t_decode_end = monotonic_ns();
        }
        Json r = Json::object();
        Json ids = Json::array();
        for (int t : out) ids.push_back(Json(t));
        r["output_ids"] = ids;
        r["n_prompt"] = int(req.prompt_ids.size());
        r["n_gen"] = int(out.size());
        r["stop"] = stop;
        Json timing = Json::object();
        timing["prefill_ms"] = prefill_ms;
        timing["decode_ms"] = decode_ms;
        timing["t_prefill_start_ns"] = Json(t_prefill_start);
        timing["t_prefill_end_ns"] = Json(t_prefill_end);
        timing["t_decode_start_ns"] = Json(t_prefill_end);
        timing["t_decode_end_ns"] = Json(t_decode_end);
        r["timing"] = timing;
        r["decode_steps"] = steps;
        // Mean context over the decode steps: step i runs at context n_prompt + i.
        const int mean_ctx = int(req.prompt_ids.size()) + steps / 2;
        r["bytes_per_token"] = Json(be_.decode_bytes(mean_ctx));
        r["peak_mem_bytes"] = Json(be_.peak_mem_bytes());
        if (req.return_logits) {
            Json l = Json::array();
            for (float v : logits) l.push_back(Json(double(v)));
            r["last_logits"] = l;
        }
        return r;
    }

private:
    Qwen35Backend& be_;
    const Qwen35Config& cfg_;
    int max_ctx_;
};

#ifndef LB_DEFAULT_BACKEND
#define LB_DEFAULT_BACKEND "cpu"
#endif

int run(int argc, char** argv) {
    EngineOptions opt;
    try {
        opt = parse_engine_flags(argc, argv);
    } catch (const EngineError& e) {
        emit_error("", e.kind == "unsupported" ? "unsupported" : "load", e.what());
        return 2;
    }
    const std::string backend = opt.backend.empty() ? LB_DEFAULT_BACKEND : opt.backend;
    std::unique_ptr<Qwen35Backend> be;
    Qwen35Config cfg;
    LoadStats stats;
    try {
        if (backend == "cpu") be = make_cpu_backend();
        else {
#if defined(LB_HAVE_GPU)
            if (backend != LB_DEFAULT_BACKEND)
                fail("unsupported", "this binary was built for " + std::string(LB_DEFAULT_BACKEND) + ", not " + backend);
            be = make_gpu_backend(opt.device);
#else
            fail("unsupported", "this binary was built for the cpu backend only; rebuild with --backend " + backend);
#endif
        }
        fprintf(stderr, "[ar] loading %s on %s\n", opt.model.c_str(), backend.c_str());
        auto src = open_checkpoint(opt.model);
        cfg = config_from_source(*src);
        be->load(*src, cfg, &stats);
        be->allocate(opt.max_ctx, opt.kv_k, opt.kv_v);
    } catch (const EngineError& e) {
        emit_error("", e.kind == "unsupported" || e.kind == "oom" ? e.kind : "load", e.what());
        return 1;
    } catch (const std::bad_alloc&) {
        emit_error("", "oom", "out of host memory while loading");
        return 1;
    } catch (const std::exception& e) {
        emit_error("", "load", e.what());
        return 1;
    }
    fprintf(stderr, "[ar] loaded: %d layers (%d full attention), hidden %d, vocab %d, %lld params\n", cfg.n_layers,
            cfg.n_full_layers(), cfg.hidden, cfg.vocab, (long long)stats.n_params);

    Json ready = Json::object();
    ready["type"] = "ready";
    ready["protocol"] = "lucebench.engine/v1";
    Json engine = Json::object();
    engine["name"] = "ar";
    engine["version"] = "0.1.0";
    engine["backend"] = backend;
    engine["build"] = build_info();
    Json options = Json::object();
    options["kv_k"] = dtype_name(opt.kv_k);
    options["kv_v"] = dtype_name(opt.kv_v);
    options["compute_dtype"] = be->weight_dtype();
    engine["options"] = options;
    ready["engine"] = engine;
    Json model = Json::object();
    model["arch"] = "qwen3_5";
    model["n_layers"] = cfg.n_layers;
    model["hidden_size"] = cfg.hidden;
    model["vocab_size"] = cfg.vocab;
    model["dtype"] = stats.dtype;
    model["n_params"] = Json(stats.n_params);
    model["weight_bytes"] = Json(stats.weight_bytes);
    ready["model"] = model;
    DeviceInfo d = be->device();
    Json dev = Json::object();
    dev["name"] = d.name;
    dev["index"] = d.index;
    dev["memory_bytes"] = Json(d.memory_bytes);
    ready["device"] = dev;
    Json limits = Json::object();
    limits["max_ctx"] = opt.max_ctx;
    ready["limits"] = limits;
    emit(ready);

    ArHandler handler(*be, cfg, opt.max_ctx);
    return serve(handler);
}

}  // namespace
}  // namespace lb

int main(int argc, char** argv) { return lb::run(argc, argv); }
