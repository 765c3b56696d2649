// The engine side of docs/protocol.md (lucebench.engine/v1): command-line flags common to the bundled
// engines, the JSON-lines request loop on stdin/stdout, and monotonic timestamps. Every engine
// executable is a small main() that builds a RequestHandler and calls serve().
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "json.h"
#include "quant.h"

namespace lb {

struct EngineOptions {
    std::string model;
    std::string backend;  // empty: what the binary was built for
    int device = 0;
    int max_ctx = 4096;
    DType kv_k = DType::BF16, kv_v = DType::BF16;
};

// Parses the common flags (--model --backend --device --max-ctx --kv-k --kv-v, also --flag=value).
// Throws EngineError: "bad_request" for malformed flags, "unsupported" for unknown KV types.
EngineOptions parse_engine_flags(int argc, char** argv);

struct GenerateRequest {
    std::string id;
    std::vector<int> prompt_ids;
    int n_gen = 0;
    bool ignore_eos = true;
    std::vector<int> eos_ids;
    bool return_logits = false;  // debug: include the prefill's last-position logits ("last_logits")
};

class RequestHandler {
public:
    virtual ~RequestHandler() = default;
    virtual int vocab_size() const = 0;
    virtual int max_ctx() const = 0;
    // Runs one validated request; returns the "result" object (type and id are filled in by serve()).
    // Throws EngineError for per-request failures.
    virtual Json generate(const GenerateRequest& req) = 0;
};

// Build description baked in by CMake: compiler, flags, arch, source hash.
Json build_info();

uint64_t monotonic_ns();  // CLOCK_MONOTONIC, the clock the harness's time.monotonic_ns() reads

// Writes one JSON object as one line on stdout and flushes.
void emit(const Json& line);
// One error line (id omitted when empty).
void emit_error(const std::string& id, const std::string& kind, const std::string& message);

// Reads requests until shutdown or end of input. Returns the process exit status.
int serve(RequestHandler& handler);

}  // namespace lb
