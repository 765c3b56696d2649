// What every engine executable shares around its backend: the timed generation of one request
// (prefill, then the engine's own decode loop), the protocol reply built from it, the ready line, and
// load failures turned into one protocol error line, and the backend choice. The engine mains use it.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend.h"
#include "json.h"
#include "model.h"
#include "server.h"

namespace lb {

bool is_eos(const GenerateRequest& req, int token);

// One request's outcome, as the protocol reports it.
struct Generation {
    std::vector<int> out;  // generated ids, the first one from prefill
    std::string stop = "length";
    int decode_steps = 0;
    double prefill_ms = 0, decode_ms = 0;  // device-timed
    uint64_t t_prefill_start = 0, t_prefill_end = 0, t_decode_end = 0;  // CLOCK_MONOTONIC ns
    std::vector<float> logits;  // the prefill's last-position logits when asked for
};

// Prefill then `decode(out)`, which appends decode tokens to `out` and stops at EOS when the request
// allows it. `Backend` provides synchronize, reset, timer_start, timer_stop_ms and forward.
template <class Backend, class Decode>
Generation run_generation(Backend& be, const GenerateRequest& req, Decode&& decode) {
    Generation g;
    be.synchronize();
    be.reset();
    g.t_prefill_start = monotonic_ns();
    be.timer_start();
    g.out.push_back(be.forward(req.prompt_ids.data(), int(req.prompt_ids.size()),
                               req.return_logits ? &g.logits : nullptr));
    g.prefill_ms = be.timer_stop_ms();
    g.t_prefill_end = g.t_decode_end = monotonic_ns();
    if (!req.ignore_eos && is_eos(req, g.out.back())) {
        g.stop = "eos";
    } else if (req.n_gen > 1) {
        be.timer_start();
        decode(g.out);
        g.decode_ms = be.timer_stop_ms();
        g.t_decode_end = monotonic_ns();
        g.decode_steps = int(g.out.size()) - 1;
        if (!req.ignore_eos && is_eos(req, g.out.back())) g.stop = "eos";
    }
    return g;
}

// The "result" object of docs/protocol.md (type and id are added by serve()).
Json generation_reply(const GenerateRequest& req, const Generation& g, uint64_t bytes_per_token,
                      uint64_t peak_mem_bytes);

// Context at which to count the bytes of a mean decode step: step i runs at context n_prompt + i.
inline int mean_decode_ctx(const GenerateRequest& req, const Generation& g) {
    return int(req.prompt_ids.size()) + g.decode_steps / 2;
}

// The ready line. `options` holds the engine's settings in effect (kv_k, kv_v, compute_dtype, ...);
// `memory`, when given, becomes model.memory (what the backend holds for this model).
Json ready_line(const std::string& engine, const std::string& backend, Json options, const ModelConfig& cfg,
                const LoadStats& stats, const DeviceInfo& device, int max_ctx, const MemoryReport* memory = nullptr);
// {"weights_bytes", "kv_cache_bytes", "recurrent_state_bytes", "verify_bytes_per_node", "max_verify_rows"}.
Json memory_json(const MemoryReport& m);

// {"kv_k", "kv_v", "compute_dtype"}: the options every Qwen3.5 engine reports.
Json kv_options(const EngineOptions& opt, const std::string& compute_dtype);

// The common flags (parse_engine_flags); a bad flag becomes one protocol error line (load or unsupported).
// False on failure: the engine then exits with status 2.
bool parse_flags_or_report(int argc, char** argv, EngineOptions* opt);

// The backend --backend names, the build's own (LB_DEFAULT_BACKEND) when the flag is absent.
std::string backend_name(const EngineOptions& opt);

// A fresh backend called `name` on GPU `device`: "cpu" (always built) or the GPU backend this binary was built
// for. Throws EngineError("unsupported") for any other name.
std::unique_ptr<Backend> make_backend(const std::string& name, int device);

// Runs `load`; an exception becomes one protocol error line (load, unsupported or oom). False on failure.
bool load_or_report(const std::function<void()>& load);

}  // namespace lb
