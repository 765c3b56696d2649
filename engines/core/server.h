// The engine side of docs/protocol.md (lucebench.engine/v1): command-line flags common to the bundled
// engines, the JSON-lines request loop on stdin/stdout, and monotonic timestamps. Every engine
// executable is a small main() that builds a RequestHandler and calls serve().
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "json.h"
#include "quant.h"

namespace lb {

// The flags only speculative engines use. An engine names those it takes (a bit mask) when it parses its
// command line; any other of them is refused as "unsupported", so that `ar --budget 22` says it has no
// budget instead of silently running without one.
enum SpecFlag : unsigned {
    kFlagDraft = 1u << 0,      // --draft PATH: the DFlash draft (z-lab safetensors folder or GGUF)
    kFlagDrafter = 1u << 1,    // --drafter PATH: the PFlash drafter (a Qwen3 checkpoint)
    kFlagBudget = 1u << 2,     // --budget N: DDTree node budget, N >= 1 (the root is not counted)
    kFlagKeepRatio = 1u << 3,  // --keep-ratio R: share of the prompt PFlash keeps, 0 < R <= 1
    kFlagChain = 1u << 4,      // --chain: verify the draft's top-1 chain instead of a tree
    kFlagMinPromptTokens = 1u << 5,  // --min-prompt-tokens N: PFlash compresses prompts of >= N tokens only
};

struct EngineOptions {
    std::string model;
    std::string backend;  // empty: what the binary was built for
    int device = 0;
    int max_ctx = 4096;
    DType kv_k = DType::BF16, kv_v = DType::BF16;
    // Speculative engines (set only where the engine accepts the flag; empty / 0 / false when not given).
    std::string draft;
    std::string drafter;
    int budget = 0;
    double keep_ratio = 0.0;
    int min_prompt_tokens = -1;  // -1: not given (the engine's default applies)
    bool chain = false;
};

// Parses the common flags (--model --backend --device --max-ctx --kv-k --kv-v, also --flag=value) and the
// speculative flags in `accepted` (SpecFlag bits; --chain takes no value, or --chain=true|false).
// Throws EngineError: "bad_request" for malformed flags or values, "unsupported" for unknown KV types and
// for a speculative flag this engine does not take (the message names the flag).
EngineOptions parse_engine_flags(int argc, char** argv, unsigned accepted = 0);
// An engine's own flags, taken out of argv before parse_engine_flags sees it: each of `names` given as
// "--flag VALUE" or "--flag=VALUE" goes to take(flag, value) (which checks the value); the other arguments,
// argv[0] first, are returned in order.
std::vector<char*> take_own_flags(int argc, char** argv, std::initializer_list<const char*> names,
                                  const std::function<void(const std::string&, const std::string&)>& take);

struct GenerateRequest {
    std::string id;
    std::vector<int> prompt_ids;
    int n_gen = 0;
    bool ignore_eos = true;
    std::vector<int> eos_ids;
    bool return_logits = false;  // debug: include the prefill's last-position logits ("last_logits")
    // Compressed prefill (pflash; other engines ignore them): the prompt in the drafter's tokens and the
    // character span of every token of both tokenisations, flat [start0, end0, start1, end1, ...] over the
    // prompt's text (docs/protocol.md). Checked here for shape only (pairs, one per id, start <= end).
    std::vector<int> drafter_ids, drafter_offsets, target_offsets;
    bool return_importance = false;  // debug (pflash): include the drafter's per-token importance
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
