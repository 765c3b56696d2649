// lucebench-megakernel: greedy decoding of Qwen3.5 hybrid models where each decode step is ONE persistent
// CUDA kernel (see decode_kernel.cuh), speaking docs/protocol.md. Prefill runs the core's CUDA operations;
// decode launches the kernel once per token back to back, the token staying on the device, and reads the
// tokens back once at the end. Logs go to stderr; stdout carries only protocol lines.
#include <cstdio>
#include <memory>
#include <string>

#include "core/errors.h"
#include "core/server.h"
#include "core/tensor_source.h"

#if defined(LB_HAVE_GPU) && !defined(LB_USE_HIP) && !defined(__HIPCC__)
#define LB_MEGAKERNEL 1
#include "megakernel/megakernel.h"
#endif

#ifndef LB_DEFAULT_BACKEND
#define LB_DEFAULT_BACKEND "cpu"
#endif

namespace lb {
namespace {

#if defined(LB_MEGAKERNEL)
class MegaHandler : public RequestHandler {
public:
    MegaHandler(mk::MegaBackend& be, const Qwen35Config& cfg, int max_ctx) : be_(be), cfg_(cfg), max_ctx_(max_ctx) {}
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
        const int first = be_.forward(req.prompt_ids.data(), int(req.prompt_ids.size()), req.return_logits ? &logits : nullptr);
        const double prefill_ms = be_.timer_stop_ms();
        const uint64_t t_prefill_end = monotonic_ns();
        std::vector<int> out{first};
        std::string stop = "length";
        int steps = 0;
        double decode_ms = 0;
        uint64_t t_decode_end = t_prefill_end;
        if (!req.ignore_eos && is_eos(first)) stop = "eos";
        else if (req.n_gen > 1) {
            be_.timer_start();
            be_.decode_chain(req.n_gen - 1, req.ignore_eos ? std::vector<int>{} : req.eos_ids, &out);
            decode_ms = be_.timer_stop_ms();
            t_decode_end = monotonic_ns();
            steps = int(out.size()) - 1;
            if (!req.ignore_eos && is_eos(out.back())) stop = "eos";
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
        const int mean_ctx = int(req.prompt_ids.size()) + steps / 2;  // step i runs at context n_prompt + i
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
    mk::MegaBackend& be_;
    const Qwen35Config& cfg_;
    int max_ctx_;
};
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
#if !defined(LB_MEGAKERNEL)
    emit_error("", "unsupported", "the megakernel engine is CUDA only: this binary was built for the " +
                                      std::string(LB_DEFAULT_BACKEND) + " backend (rebuild with --backend cuda)");
    return 1;
#else
    if (backend != "cuda") {
        emit_error("", "unsupported", "the megakernel engine runs on the cuda backend only (asked for " + backend + ")");
        return 1;
    }
    std::unique_ptr<mk::MegaBackend> be;
    Qwen35Config cfg;
    LoadStats stats;
    try {
        fprintf(stderr, "[megakernel] loading %s\n", opt.model.c_str());
        be = mk::make_megakernel_backend(opt.device);
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
    const mk::LaunchInfo li = be->launch_info();
    Json ready = Json::object();
    ready["type"] = "ready";
    ready["protocol"] = "lucebench.engine/v1";
    Json engine = Json::object();
    engine["name"] = "megakernel";
    engine["version"] = "0.1.0";
    engine["backend"] = backend;
    engine["build"] = build_info();
    Json options = Json::object();
    options["kv_k"] = dtype_name(opt.kv_k);
    options["kv_v"] = dtype_name(opt.kv_v);
    options["compute_dtype"] = be->weight_dtype();
    options["blocks"] = li.blocks;
    options["blocks_per_sm"] = li.blocks_per_sm;
    options["threads_per_block"] = li.threads;
    options["smem_bytes"] = li.smem_bytes;
    options["prefetch"] = li.prefetch;
    options["staging_slots"] = li.slots;
    if (li.diag) options["diag"] = li.diag;
    options["grid_barriers_per_token"] = li.barriers_per_token;
    options["decode_bytes_ctx1"] = Json(be->decode_bytes(1));
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

    MegaHandler handler(*be, cfg, opt.max_ctx);
    return serve(handler);
#endif
}

}  // namespace
}  // namespace lb

int main(int argc, char** argv) { return lb::run(argc, argv); }
