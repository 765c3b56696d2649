#include "tuning.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

extern char** environ;

namespace lb {

namespace {

// One knob: its variable, the field it sets, and for integers the range it accepts (values outside are
// clamped, with a warning).
struct Knob {
    const char* var;
    const char* key;
    bool Tuning::*flag = nullptr;
    int Tuning::*num = nullptr;
    std::string Tuning::*text = nullptr;
    int lo = 0, hi = 0;
};

const Knob kKnobs[] = {
    {"LB_GPU_PDL", "gpu_pdl", &Tuning::gpu_pdl},
    {"LB_GPU_SPLITK", "gemm_splitk_per_sm", nullptr, &Tuning::gemm_splitk_per_sm, nullptr, 0, 64},
    {"LB_GV_TILE", "gemv_tile_bytes", nullptr, &Tuning::gemv_tile_bytes, nullptr, 1024, 1 << 20},
    {"LB_GV_PER_SM", "gemv_blocks_per_sm", nullptr, &Tuning::gemv_blocks_per_sm, nullptr, 1, 64},
    {"LB_GV_PREWAIT", "gemv_prewait", nullptr, &Tuning::gemv_prewait, nullptr, 0, 3},
    {"LB_GPU_MLP_PER_SM", "mlp_blocks_per_sm", nullptr, &Tuning::mlp_blocks_per_sm, nullptr, 1, 64},
    {"LB_GPU_ATTN_SHORT", "attn_short_ctx", nullptr, &Tuning::attn_short_ctx, nullptr, 0, 1 << 30},
    {"LB_ATT_SPLITS", "attn_decode_blocks", nullptr, &Tuning::attn_decode_blocks, nullptr, 1, 256},
    {"LB_GPU_FUSED_ATTN", "fused_attn", &Tuning::fused_attn},
    {"LB_GPU_FUSED_DELTA", "fused_delta", &Tuning::fused_delta},
    {"LB_GPU_DELTA_OUT", "delta_out", &Tuning::delta_out},
    {"LB_GPU_PREFILL_CHUNK", "prefill_chunk", nullptr, &Tuning::prefill_chunk, nullptr, 0, 1 << 30},
    {"LB_GPU_QUANT", "gpu_quant", &Tuning::gpu_quant},
    {"LB_GPU_FUSED_MLP", "fused_mlp", nullptr, &Tuning::fused_mlp, nullptr, 0, 1},
    {"LB_MK_FUSE", "mk_fuse", &Tuning::mk_fuse},
    {"LB_MK_FUSE_OUT", "mk_fuse_out", &Tuning::mk_fuse_out},
    {"LB_MK_FUSE_IN", "mk_fuse_in", &Tuning::mk_fuse_in},
    {"LB_MK_FUSE_ATT", "mk_fuse_att", &Tuning::mk_fuse_att},
    {"LB_MK_DN_WHOLE", "mk_dn_whole", &Tuning::mk_dn_whole},
    {"LB_MK_ATT_ROWS", "mk_att_rows", &Tuning::mk_att_rows},
    {"LB_MK_GENERIC", "mk_generic", &Tuning::mk_generic},
    {"LB_MK_TRACE", "mk_trace", nullptr, nullptr, &Tuning::mk_trace},
    {"LB_DFLASH_TRACE", "dflash_trace", nullptr, nullptr, &Tuning::dflash_trace},
    {"LB_DFLASH_DRAFT_BF16", "dflash_draft_bf16", &Tuning::dflash_draft_bf16},
};

// Variables that were knobs of variants since retired (git history keeps them): named in the warning.
const char* const kRetired[] = {
    "LB_GPU_OLD_GEMM", "LB_GPU_OLD_CONV", "LB_GPU_OLD_DELTA", "LB_GPU_OLD_ATTN", "LB_GPU_OLD_ATTN_DEC",
    "LB_GPU_DR_CB",    "LB_GPU_DR_WY",    "LB_GPU_ATTN_ANYKV", "LB_GPU_ATTN_TILED", "LB_MLP_EARLY_DOWN",
    "LB_GPU_DECODE",   "LB_GPU_DIAG_SKIP", "LB_MK_RING",     "LB_MK_RING_PAGES", "LB_MK_DIAG",
    "LB_MK_BARRIER",   "LB_MK_EARLY",     "LB_GPU_QGEMV32", "LB_GPU_QMV",       "LB_GPU_QMMA",
    "LB_GPU_ATTN_SPLIT",
};

// Read by a tool loaded into the engine, not by the engine: no warning. LB_TIMELINE_OUT: the CUPTI
// library that scripts/device/timeline_decode.py injects (scripts/device/kernel_timeline.cpp).
const char* const kTools[] = {"LB_TIMELINE_OUT"};

// Knobs that became engine options (typed, in the config and the ready line's engine.options): the
// warning names the flag that replaces each.
const char* const kMoved[][2] = {
    {"LB_PFLASH_SPARSE_FROM", "lucebench-pflash --drafter-sparse-from N"},
    {"LB_PFLASH_SPARSE_ALPHA", "lucebench-pflash --drafter-sparse-alpha A (a fraction: 0.85, not 85)"},
    {"LB_PFLASH_SPARSE_BUDGET", "lucebench-pflash --drafter-sparse-budget B (a fraction: 0.1, not 10)"},
};

bool parse_int(const std::string& s, long* out) {
    if (s.empty()) return false;
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(s.c_str(), &end, 10);
    if (errno != 0 || *end != 0) return false;
    *out = v;
    return true;
}

}  // namespace

Tuning parse_tuning(const std::vector<std::string>& env) {
    Tuning t;
    for (const std::string& entry : env) {
        if (entry.rfind("LB_", 0) != 0) continue;
        const size_t eq = entry.find('=');
        const std::string var = entry.substr(0, eq), value = eq == std::string::npos ? "" : entry.substr(eq + 1);
        const Knob* k = nullptr;
        for (const Knob& c : kKnobs)
            if (var == c.var) k = &c;
        if (!k) {
            if (std::any_of(std::begin(kTools), std::end(kTools), [&](const char* n) { return var == n; })) continue;
            const auto moved =
                std::find_if(std::begin(kMoved), std::end(kMoved), [&](const auto& m) { return var == m[0]; });
            if (moved != std::end(kMoved)) {
                t.warnings.push_back(var + "=" + value + ": now the engine option " + (*moved)[1] + "; ignored");
                continue;
            }
            const bool retired =
                std::any_of(std::begin(kRetired), std::end(kRetired), [&](const char* n) { return var == n; });
            t.warnings.push_back(var + "=" + value + (retired ? ": a retired switch (git history keeps its variant)"
                                                             : ": not a lucebench engine knob") +
                                 "; ignored");
            continue;
        }
        if (k->flag) {
            if (value != "0" && value != "1") {
                t.warnings.push_back(var + "=" + value + ": expected 0 or 1; ignored");
                continue;
            }
            t.*(k->flag) = value == "1";
        } else if (k->num) {
            long v = 0;
            if (!parse_int(value, &v)) {
                t.warnings.push_back(var + "=" + value + ": expected an integer; ignored");
                continue;
            }
            const long c = std::clamp<long>(v, k->lo, k->hi);
            if (c != v)
                t.warnings.push_back(var + "=" + value + ": outside [" + std::to_string(k->lo) + ", " +
                                     std::to_string(k->hi) + "]; " + std::to_string(c) + " used");
            t.*(k->num) = int(c);
        } else {
            if (value.empty()) {
                t.warnings.push_back(var + " is empty; ignored");
                continue;
            }
            t.*(k->text) = value;
        }
        t.set.push_back(var);
    }
    std::sort(t.set.begin(), t.set.end());
    std::sort(t.warnings.begin(), t.warnings.end());
    return t;
}

Json Tuning::to_json() const {
    Json j = Json::object();
    for (const Knob& k : kKnobs) {
        if (k.flag) j[k.key] = this->*(k.flag);
        else if (k.num) j[k.key] = this->*(k.num);
        else j[k.key] = this->*(k.text);
    }
    Json s = Json::array();
    for (const std::string& v : set) s.push_back(v);
    j["set"] = s;
    return j;
}

const Tuning& tuning() {
    static const Tuning t = [] {
        std::vector<std::string> env;
        for (char** e = environ; e && *e; ++e) env.emplace_back(*e);
        Tuning r = parse_tuning(env);
        for (const std::string& w : r.warnings) fprintf(stderr, "[lucebench] warning: %s\n", w.c_str());
        return r;
    }();
    return t;
}

}  // namespace lb
