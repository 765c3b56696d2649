#include "server.h"

#include <time.h>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "errors.h"

#ifndef LB_COMPILER
#define LB_COMPILER "unknown"
#endif
#ifndef LB_FLAGS
#define LB_FLAGS ""
#endif
#ifndef LB_ARCH
#define LB_ARCH "host"
#endif
#ifndef LB_SOURCE_HASH
#define LB_SOURCE_HASH "unknown"
#endif

namespace lb {

Json build_info() {
    Json b = Json::object();
    b["compiler"] = LB_COMPILER;
    b["flags"] = LB_FLAGS;
    b["arch"] = LB_ARCH;
    b["source_hash"] = LB_SOURCE_HASH;
    return b;
}

uint64_t monotonic_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return uint64_t(ts.tv_sec) * 1000000000ull + uint64_t(ts.tv_nsec);
}

void emit(const Json& line) {
    std::string s = line.dump();
    s += '\n';
    fwrite(s.data(), 1, s.size(), stdout);
    fflush(stdout);
}

void emit_error(const std::string& id, const std::string& kind, const std::string& message) {
    Json e = Json::object();
    e["type"] = "error";
    if (!id.empty()) e["id"] = id;
    e["kind"] = kind;
    e["message"] = message;
    emit(e);
}

namespace {

struct SpecFlagInfo {
    const char* name;
    unsigned bit;
    const char* meaning;
};

const SpecFlagInfo kSpecFlags[] = {
    {"--draft", kFlagDraft, "the DFlash draft model"},
    {"--drafter", kFlagDrafter, "the PFlash drafter model"},
    {"--budget", kFlagBudget, "the DDTree node budget"},
    {"--keep-ratio", kFlagKeepRatio, "the PFlash keep ratio"},
    {"--chain", kFlagChain, "chain verification"},
    {"--min-prompt-tokens", kFlagMinPromptTokens, "the PFlash compression threshold"},
};

std::string program_name(const char* argv0) {
    std::string p = argv0 ? argv0 : "engine";
    size_t slash = p.find_last_of('/');
    return slash == std::string::npos ? p : p.substr(slash + 1);
}

}  // namespace

std::vector<char*> take_own_flags(int argc, char** argv, std::initializer_list<const char*> names,
                                  const std::function<void(const std::string&, const std::string&)>& take) {
    std::vector<char*> rest;
    for (int i = 0; i < argc; ++i) {
        std::string a = argv[i], value, flag;
        for (const char* f : names)
            if (a == f || a.rfind(std::string(f) + "=", 0) == 0) flag = f;
        if (i == 0 || flag.empty()) { rest.push_back(argv[i]); continue; }
        if (a.size() > flag.size()) value = a.substr(flag.size() + 1);
        else if (i + 1 < argc) value = argv[++i];
        else fail("bad_request", flag + " needs a value");
        take(flag, value);
    }
    return rest;
}

EngineOptions parse_engine_flags(int argc, char** argv, unsigned accepted) {
    EngineOptions o;
    bool have_model = false;
    for (int i = 1; i < argc; ++i) {
        std::string flag = argv[i], value;
        size_t eq = flag.find('=');
        if (flag.rfind("--", 0) != 0) fail("bad_request", "unexpected argument '" + flag + "'");
        const bool inline_value = eq != std::string::npos;
        if (inline_value) { value = flag.substr(eq + 1); flag = flag.substr(0, eq); }
        // A speculative flag the engine does not take is refused before its value is looked at.
        for (const SpecFlagInfo& f : kSpecFlags)
            if (flag == f.name && !(accepted & f.bit))
                fail("unsupported", program_name(argc > 0 ? argv[0] : nullptr) + " does not take " + flag + " (" +
                                        f.meaning + "): only the speculative engines that use it do");
        if (flag == "--chain") {  // a switch: no separate value
            if (!inline_value || value == "true" || value == "1") o.chain = true;
            else if (value == "false" || value == "0") o.chain = false;
            else fail("bad_request", "--chain takes no value, or true / false, got '" + value + "'");
            continue;
        }
        if (!inline_value) {
            if (i + 1 >= argc) fail("bad_request", "flag " + flag + " needs a value");
            value = argv[++i];
        }
        auto to_int = [&](const std::string& v) {
            char* end = nullptr;
            errno = 0;
            long x = strtol(v.c_str(), &end, 10);
            if (v.empty() || *end || errno == ERANGE || x < INT_MIN || x > INT_MAX)
                fail("bad_request", "flag " + flag + " needs an integer, got '" + v + "'");
            return int(x);
        };
        auto to_double = [&](const std::string& v) {
            char* end = nullptr;
            double x = strtod(v.c_str(), &end);
            if (v.empty() || *end || !std::isfinite(x)) fail("bad_request", "flag " + flag + " needs a number, got '" + v + "'");
            return x;
        };
        if (flag == "--model") { o.model = value; have_model = true; }
        else if (flag == "--backend") {
            if (value != "cpu" && value != "cuda" && value != "hip") fail("bad_request", "--backend must be cpu, cuda or hip");
            o.backend = value;
        } else if (flag == "--device") o.device = to_int(value);
        else if (flag == "--max-ctx") {
            o.max_ctx = to_int(value);
            if (o.max_ctx < 1) fail("bad_request", "--max-ctx must be positive");
        } else if (flag == "--kv-k" || flag == "--kv-v") {
            DType t;
            if (!dtype_from_name(value, &t))
                fail("unsupported", "KV cache type '" + value + "' for " + flag + " (supported: f16, bf16, q8_0, q4_0; f32 for reference checks)");
            (flag == "--kv-k" ? o.kv_k : o.kv_v) = t;
        } else if (flag == "--draft" || flag == "--drafter") {
            if (value.empty()) fail("bad_request", flag + " needs a path");
            (flag == "--draft" ? o.draft : o.drafter) = value;
        } else if (flag == "--budget") {
            o.budget = to_int(value);
            if (o.budget < 1) fail("bad_request", "--budget must be an integer >= 1, got " + value);
        } else if (flag == "--keep-ratio") {
            o.keep_ratio = to_double(value);
            if (!(o.keep_ratio > 0.0 && o.keep_ratio <= 1.0))
                fail("bad_request", "--keep-ratio must be in (0, 1], got " + value);
        } else if (flag == "--min-prompt-tokens") {
            o.min_prompt_tokens = to_int(value);
            if (o.min_prompt_tokens < 0)
                fail("bad_request", "--min-prompt-tokens must be an integer >= 0, got " + value);
        } else fail("bad_request", "unknown flag " + flag);
    }
    if (!have_model) fail("bad_request", "--model is required");
    return o;
}

static GenerateRequest parse_generate(const Json& r, int vocab) {
    GenerateRequest g;
    if (auto* id = r.get("id")) {
        if (id->is_string()) g.id = id->as_string();
        else if (id->is_number()) g.id = Json(id->as_number()).dump();
    }
    const Json* p = r.get("prompt_ids");
    if (!p || !p->is_array() || p->size() == 0) fail("bad_request", "prompt_ids must be a non-empty array of token ids");
    for (auto& t : p->items()) {
        int64_t v;
        try { v = t.as_int(); } catch (...) { fail("bad_request", "prompt_ids must hold integers"); }
        if (v < 0 || v >= vocab) fail("bad_request", "token id " + std::to_string(v) + " outside the vocabulary [0, " + std::to_string(vocab) + ")");
        g.prompt_ids.push_back(int(v));
    }
    const Json* n = r.get("n_gen");
    int64_t ng = 0;
    try { ng = n ? n->as_int() : -1; } catch (...) { ng = -1; }
    if (ng < 1) fail("bad_request", "n_gen must be an integer >= 1");
    g.n_gen = int(ng);
    if (auto* ie = r.get("ignore_eos")) {
        if (!ie->is_bool()) fail("bad_request", "ignore_eos must be a boolean");
        g.ignore_eos = ie->as_bool();
    }
    if (auto* e = r.get("eos_ids")) {
        if (!e->is_array()) fail("bad_request", "eos_ids must be an array");
        for (auto& t : e->items()) g.eos_ids.push_back(int(t.as_int()));
    }
    if (auto* rl = r.get("return_logits")) g.return_logits = rl->is_bool() && rl->as_bool();
    if (auto* ri = r.get("return_importance")) g.return_importance = ri->is_bool() && ri->as_bool();
    if (auto* d = r.get("drafter_ids")) {
        if (!d->is_array() || d->size() == 0) fail("bad_request", "drafter_ids must be a non-empty array of token ids");
        for (auto& t : d->items()) {
            int64_t v = -1;
            try { v = t.as_int(); } catch (...) {}
            if (v < 0 || v > INT_MAX) fail("bad_request", "drafter_ids must hold token ids (integers >= 0)");
            g.drafter_ids.push_back(int(v));
        }
    }
    // Offsets: one [start, end] pair per token of the matching ids.
    auto offsets = [&](const char* key, size_t n_tokens, std::vector<int>* out) {
        const Json* o = r.get(key);
        if (!o) return;
        if (!o->is_array() || o->size() != n_tokens)
            fail("bad_request", std::string(key) + " must hold one [start, end] pair per token (" +
                                    std::to_string(n_tokens) + ")");
        for (auto& pair : o->items()) {
            int64_t a = -1, b = -1;
            try {
                if (pair.is_array() && pair.size() == 2) { a = pair.items()[0].as_int(); b = pair.items()[1].as_int(); }
            } catch (...) {}
            if (a < 0 || b < a || b > INT_MAX)
                fail("bad_request", std::string(key) + " must hold [start, end] character offsets with 0 <= start <= end");
            out->push_back(int(a));
            out->push_back(int(b));
        }
    };
    offsets("drafter_offsets", g.drafter_ids.size(), &g.drafter_offsets);
    offsets("target_offsets", g.prompt_ids.size(), &g.target_offsets);
    return g;
}

int serve(RequestHandler& handler) {
    std::string line;
    while (std::getline(std::cin, line)) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        Json req;
        try {
            req = Json::parse(line);
        } catch (const std::exception& e) {
            emit_error("", "bad_request", std::string("request is not JSON: ") + e.what());
            continue;
        }
        std::string id;
        if (auto* i = req.get("id"); i && i->is_string()) id = i->as_string();
        const Json* type = req.get("type");
        if (!req.is_object() || !type || !type->is_string()) {
            emit_error(id, "bad_request", "request must be an object with a string 'type'");
            continue;
        }
        if (type->as_string() == "shutdown") return 0;
        if (type->as_string() != "generate") {
            emit_error(id, "bad_request", "unknown request type '" + type->as_string() + "'");
            continue;
        }
        try {
            GenerateRequest g = parse_generate(req, handler.vocab_size());
            if (int64_t(g.prompt_ids.size()) + g.n_gen > handler.max_ctx())
                fail("context_overflow", "prompt " + std::to_string(g.prompt_ids.size()) + " + n_gen " + std::to_string(g.n_gen) +
                                             " exceeds max_ctx " + std::to_string(handler.max_ctx()));
            Json res = handler.generate(g);
            Json out = Json::object();
            out["type"] = "result";
            out["id"] = g.id;
            for (auto& [k, v] : res.members()) out[k] = v;
            emit(out);
        } catch (const EngineError& e) {
            emit_error(id, e.kind, e.what());
            if (e.kind == "oom" || e.kind == "internal") return 1;
        } catch (const std::bad_alloc&) {
            emit_error(id, "oom", "out of host memory");
            return 1;
        } catch (const std::exception& e) {
            emit_error(id, "internal", e.what());
            return 1;
        }
    }
    return 0;
}

}  // namespace lb
