#include "engine_main.h"

#include <new>

#include "errors.h"
#include "tuning.h"

namespace lb {

bool is_eos(const GenerateRequest& req, int token) {
    for (int e : req.eos_ids)
        if (e == token) return true;
    return false;
}

Json generation_reply(const GenerateRequest& req, const Generation& g, uint64_t bytes_per_token,
                      uint64_t peak_mem_bytes) {
    Json r = Json::object();
    Json ids = Json::array();
    for (int t : g.out) ids.push_back(Json(t));
    r["output_ids"] = ids;
    r["n_prompt"] = int(req.prompt_ids.size());
    r["n_gen"] = int(g.out.size());
    r["stop"] = g.stop;
    Json timing = Json::object();
    timing["prefill_ms"] = g.prefill_ms;
    timing["decode_ms"] = g.decode_ms;
    timing["t_prefill_start_ns"] = Json(g.t_prefill_start);
    timing["t_prefill_end_ns"] = Json(g.t_prefill_end);
    timing["t_decode_start_ns"] = Json(g.t_prefill_end);
    timing["t_decode_end_ns"] = Json(g.t_decode_end);
    r["timing"] = timing;
    r["decode_steps"] = g.decode_steps;
    r["bytes_per_token"] = Json(bytes_per_token);
    r["peak_mem_bytes"] = Json(peak_mem_bytes);
    if (req.return_logits) {
        Json l = Json::array();
        for (float v : g.logits) l.push_back(Json(double(v)));
        r["last_logits"] = l;
    }
    return r;
}

Json kv_options(const EngineOptions& opt, const std::string& compute_dtype) {
    Json options = Json::object();
    options["kv_k"] = dtype_name(opt.kv_k);
    options["kv_v"] = dtype_name(opt.kv_v);
    options["compute_dtype"] = compute_dtype;
    return options;
}

Json memory_json(const MemoryReport& m) {
    Json j = Json::object();
    j["weights_bytes"] = Json(m.weights);
    j["kv_cache_bytes"] = Json(m.kv_cache);
    j["recurrent_state_bytes"] = Json(m.recurrent_state);
    j["verify_bytes_per_node"] = Json(m.verify_bytes_per_node);
    j["max_verify_rows"] = m.max_verify_rows;
    return j;
}

Json ready_line(const std::string& engine_name, const std::string& backend, Json options, const ModelConfig& cfg,
                const LoadStats& stats, const DeviceInfo& device, int max_ctx, const MemoryReport* memory) {
    Json ready = Json::object();
    ready["type"] = "ready";
    ready["protocol"] = "lucebench.engine/v1";
    Json engine = Json::object();
    engine["name"] = engine_name;
    engine["version"] = "0.1.0";
    engine["backend"] = backend;
    engine["build"] = build_info();
    engine["options"] = options;
    // the knobs in effect (core/tuning.h), and what the environment set that changes nothing
    engine["tuning"] = tuning().to_json();
    if (!tuning().warnings.empty()) {
        Json w = Json::array();
        for (const std::string& s : tuning().warnings) w.push_back(s);
        engine["warnings"] = w;
    }
    ready["engine"] = engine;
    Json model = Json::object();
    model["arch"] = arch_name(cfg.arch);
    model["n_layers"] = cfg.n_layers;
    model["hidden_size"] = cfg.hidden;
    model["vocab_size"] = cfg.vocab;
    model["dtype"] = stats.dtype;
    model["n_params"] = Json(stats.n_params);
    model["weight_bytes"] = Json(stats.weight_bytes);
    if (memory) model["memory"] = memory_json(*memory);
    ready["model"] = model;
    Json dev = Json::object();
    dev["name"] = device.name;
    dev["index"] = device.index;
    dev["memory_bytes"] = Json(device.memory_bytes);
    ready["device"] = dev;
    Json limits = Json::object();
    limits["max_ctx"] = max_ctx;
    ready["limits"] = limits;
    return ready;
}

bool parse_flags_or_report(int argc, char** argv, EngineOptions* opt) {
    try {
        *opt = parse_engine_flags(argc, argv);
        return true;
    } catch (const EngineError& e) {
        emit_error("", e.kind == "unsupported" ? "unsupported" : "load", e.what());
        return false;
    }
}

#ifndef LB_DEFAULT_BACKEND
#define LB_DEFAULT_BACKEND "cpu"
#endif

std::string backend_name(const EngineOptions& opt) { return opt.backend.empty() ? LB_DEFAULT_BACKEND : opt.backend; }

std::unique_ptr<Backend> make_backend(const std::string& name, int device) {
    if (name == "cpu") return make_cpu_backend();
#if defined(LB_HAVE_GPU)
    if (name != LB_DEFAULT_BACKEND)
        fail("unsupported", "this binary was built for " + std::string(LB_DEFAULT_BACKEND) + ", not " + name);
    return make_gpu_backend(device);
#else
    fail("unsupported", "this binary was built for the cpu backend only; rebuild with --backend " + name);
#endif
}

bool load_or_report(const std::function<void()>& load) {
    try {
        load();
        return true;
    } catch (const EngineError& e) {
        emit_error("", e.kind == "unsupported" || e.kind == "oom" ? e.kind : "load", e.what());
    } catch (const std::bad_alloc&) {
        emit_error("", "oom", "out of host memory while loading");
    } catch (const std::exception& e) {
        emit_error("", "load", e.what());
    }
    return false;
}

}  // namespace lb
