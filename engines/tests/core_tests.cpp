// Unit checks of the core pieces that the end-to-end tests (tests/engines/) cannot isolate:
// JSON round trips, fp16/bf16 rounding, KV block formats, and the chunked delta rule against the
// token-by-token recurrence. Exit status 0 when all pass.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/cpu/ops.h"
#include "core/half.h"
#include "core/json.h"
#include "core/quant.h"
#include "core/server.h"
#include "core/errors.h"
#include "core/tuning.h"
#include "core/cuda/attention_split.h"

static int failures = 0;
#define CHECK(cond, ...) do { if (!(cond)) { ++failures; fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); fprintf(stderr, __VA_ARGS__); fprintf(stderr, "\n"); } } while (0)

// The split-KV attention's range count (core/cuda/attention_split.h): one range where the blocks fill half
// the GPU or the context is under 8 key tiles; otherwise one wave at most (splits x blocks <= SMs), ranges of
// >= 4 key tiles.
static void test_kv_split_count() {
    using lb::gpu::kv_split_count;
    const int sms = 132;  // H100 SXM
    // a 27B verify (23 rows, G 6: 2 query tiles x 4 KV heads = 8 blocks)
    CHECK(kv_split_count(8, 448 / 64, sms) == 1, "448 keys: one range");
    CHECK(kv_split_count(8, 512 / 64, sms) == 2, "512 keys: 2 ranges");
    CHECK(kv_split_count(8, 1024 / 64, sms) == 4, "1024 keys: 4 ranges");
    CHECK(kv_split_count(8, 4096 / 64, sms) == 16, "4096 keys: one wave (132 / 8)");
    CHECK(kv_split_count(8, 65536 / 64, sms) == 16, "64K keys: one wave");
    CHECK(kv_split_count(4, 131072 / 64, sms) == 33, "128K keys, 4 blocks: 33 ranges");
    CHECK(kv_split_count(66, 131072 / 64, sms) == 2, "66 blocks: 2 ranges");
    CHECK(kv_split_count(67, 131072 / 64, sms) == 1, "blocks fill half the GPU: one range");
    CHECK(kv_split_count(8, 65536 / 64, 0) == 1, "no device limits known: one range");
    for (int blocks = 1; blocks <= 80; ++blocks)
        for (int tiles = 0; tiles <= 4096; tiles += 37) {
            const int k = kv_split_count(blocks, tiles, sms);
            CHECK(k >= 1 && (k == 1 || (k * blocks <= sms && tiles / k >= lb::gpu::kSplitMinTiles)),
                  "blocks %d tiles %d: %d ranges", blocks, tiles, k);
        }
}

static void test_json() {
    auto j = lb::Json::parse(R"({"a": [1, 2.5, "x\n\u00e9"], "b": {"c": null, "d": true}, "e": -3})");
    CHECK(j.get("a")->items()[1].as_number() == 2.5, "number");
    CHECK(j.get("a")->items()[2].as_string() == "x\n\xc3\xa9", "escapes");
    CHECK(j.get("e")->as_int() == -3, "int");
    auto again = lb::Json::parse(j.dump());
    CHECK(again.dump() == j.dump(), "round trip: %s", j.dump().c_str());
    bool threw = false;
    try { lb::Json::parse("{\"a\": }"); } catch (const std::exception&) { threw = true; }
    CHECK(threw, "malformed JSON must throw");
}

static void test_half() {
    for (float f : {0.f, 1.f, -2.5f, 65504.f, 1e-7f, 3.14159f}) {
        CHECK(std::fabs(lb::f16_to_f32(lb::f32_to_f16(f)) - f) <= std::fabs(f) * 1e-3f + 1e-7f, "f16 %g", f);
        CHECK(std::fabs(lb::bf16_to_f32(lb::f32_to_bf16(f)) - f) <= std::fabs(f) * 8e-3f, "bf16 %g", f);
    }
    CHECK(lb::f32_to_bf16(1.00390625f) == 0x3f80, "bf16 ties to even");  // halfway between 1 and 1+2^-7
}

static void test_blocks() {
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    std::vector<float> x(256), y(256);
    for (auto& v : x) v = nd(rng);
    for (auto t : {lb::DType::F16, lb::DType::BF16, lb::DType::Q8_0, lb::DType::Q4_0}) {
        std::vector<uint8_t> buf(lb::dtype_row_bytes(t, x.size()));
        lb::encode_row(t, x.data(), buf.data(), x.size());
        lb::decode_row(t, buf.data(), y.data(), x.size());
        double err = 0, ref = 0;
        for (size_t i = 0; i < x.size(); ++i) { err += (x[i] - y[i]) * (x[i] - y[i]); ref += x[i] * x[i]; }
        double rel = std::sqrt(err / ref);
        double bound = t == lb::DType::Q4_0 ? 0.15 : t == lb::DType::Q8_0 ? 0.01 : 0.005;
        CHECK(rel < bound, "%s relative error %g", lb::dtype_name(t), rel);
    }
}

static void test_delta_rule() {
    const int n = 150, hk = 2, hv = 4, dk = 16, dv = 8;
    std::mt19937 rng(2);
    std::normal_distribution<float> nd;
    std::uniform_real_distribution<float> ud(0.f, 1.f);
    std::vector<float> q(n * hk * dk), k(n * hk * dk), v(n * hv * dv), g(n * hv), beta(n * hv);
    for (auto& e : q) e = nd(rng);
    for (auto& e : k) e = nd(rng);
    for (auto& e : v) e = nd(rng);
    for (auto& e : g) e = -3.f * ud(rng);
    for (auto& e : beta) e = ud(rng);
    g[5] = -80.f;  // a strongly decaying step must not produce NaN in the chunked form
    lb::cpu::l2norm(q.data(), n * hk, dk, 1e-6f);
    lb::cpu::l2norm(k.data(), n * hk, dk, 1e-6f);
    std::vector<float> s1(hv * dk * dv), s2(hv * dk * dv), o1(n * hv * dv), o2(n * hv * dv);
    for (auto& e : s1) e = 0.1f * nd(rng);
    s2 = s1;
    lb::cpu::delta_rule_recurrent(q.data(), k.data(), v.data(), g.data(), beta.data(), n, hk, hv, dk, dv, s1.data(), o1.data());
    lb::cpu::delta_rule_chunked(q.data(), k.data(), v.data(), g.data(), beta.data(), n, hk, hv, dk, dv, s2.data(), o2.data(), 64);
    double emax = 0;
    for (size_t i = 0; i < o1.size(); ++i) emax = std::fmax(emax, std::fabs(o1[i] - o2[i]));
    for (size_t i = 0; i < s1.size(); ++i) emax = std::fmax(emax, std::fabs(s1[i] - s2[i]));
    CHECK(emax < 1e-4, "chunked vs recurrent max abs diff %g", emax);
}

// `lucebench-core-tests dequantize TYPE IN OUT`: decodes the raw blocks in IN (a ggml type name: q8_0,
// q4_0, q4_k, q5_k, q6_k) to fp32 in OUT, for tests/engines/test_gguf_quants.py to compare with the gguf
// package's reference dequantisation.
static int dequantize_file(const char* type, const char* in, const char* out) {
    static const std::pair<const char*, lb::DType> types[] = {{"q8_0", lb::DType::Q8_0}, {"q4_0", lb::DType::Q4_0},
                                                              {"q4_k", lb::DType::Q4_K}, {"q5_k", lb::DType::Q5_K},
                                                              {"q6_k", lb::DType::Q6_K}};
    const lb::DType* t = nullptr;
    for (auto& [name, dt] : types) if (std::string(type) == name) t = &dt;
    if (!t) { fprintf(stderr, "unknown type %s\n", type); return 2; }
    FILE* f = fopen(in, "rb");
    if (!f) { fprintf(stderr, "cannot read %s\n", in); return 2; }
    std::vector<uint8_t> raw;
    uint8_t buf[4096];
    for (size_t got; (got = fread(buf, 1, sizeof buf, f)) > 0;) raw.insert(raw.end(), buf, buf + got);
    fclose(f);
    const size_t n = raw.size() / lb::dtype_block_bytes(*t) * lb::dtype_block_elems(*t);
    std::vector<float> y(n);
    lb::decode_row(*t, raw.data(), y.data(), n);
    FILE* o = fopen(out, "wb");
    if (!o || fwrite(y.data(), 4, n, o) != n) { fprintf(stderr, "cannot write %s\n", out); return 2; }
    fclose(o);
    return 0;
}

// The flag parser: speculative flags stored and validated where the engine takes them, refused by name
// ("unsupported") where it does not, --flag=value and --flag value alike.
static bool parse_fails(std::vector<std::string> args, unsigned accepted, const std::string& kind,
                        const std::string& fragment) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    try {
        lb::parse_engine_flags(int(argv.size()), argv.data(), accepted);
    } catch (const lb::EngineError& e) {
        return e.kind == kind && std::string(e.what()).find(fragment) != std::string::npos;
    }
    return false;
}

static void test_engine_flags() {
    const unsigned dflash = lb::kFlagDraft | lb::kFlagBudget | lb::kFlagChain;
    const unsigned pflash = lb::kFlagDrafter | lb::kFlagKeepRatio | lb::kFlagMinPromptTokens;
    std::vector<std::string> args = {"lucebench-dflash", "--model", "t", "--draft=d", "--budget", "22", "--chain",
                                     "--kv-k=q8_0"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    lb::EngineOptions o = lb::parse_engine_flags(int(argv.size()), argv.data(), dflash);
    CHECK(o.model == "t" && o.draft == "d" && o.budget == 22 && o.chain && o.kv_k == lb::DType::Q8_0,
          "dflash flags: draft '%s' budget %d chain %d", o.draft.c_str(), o.budget, int(o.chain));
    args = {"lucebench-pflash", "--drafter", "q", "--keep-ratio=0.05", "--model=t"};
    argv.clear();
    for (auto& a : args) argv.push_back(a.data());
    o = lb::parse_engine_flags(int(argv.size()), argv.data(), pflash);
    CHECK(o.drafter == "q" && o.keep_ratio == 0.05 && !o.chain && o.budget == 0 && o.min_prompt_tokens == -1,
          "pflash flags");
    args = {"lucebench-pflash", "--drafter", "q", "--min-prompt-tokens", "32000", "--model=t"};
    argv.clear();
    for (auto& a : args) argv.push_back(a.data());
    CHECK(lb::parse_engine_flags(int(argv.size()), argv.data(), pflash).min_prompt_tokens == 32000,
          "--min-prompt-tokens 32000");
    args = {"e", "--chain=false", "--model", "t"};
    argv.clear();
    for (auto& a : args) argv.push_back(a.data());
    CHECK(!lb::parse_engine_flags(int(argv.size()), argv.data(), dflash).chain, "--chain=false");

    CHECK(parse_fails({"e", "--model", "t", "--budget", "0"}, dflash, "bad_request", "--budget must be"), "budget 0");
    CHECK(parse_fails({"e", "--model", "t", "--budget=x"}, dflash, "bad_request", "integer"), "budget x");
    CHECK(parse_fails({"e", "--model", "t", "--keep-ratio", "0"}, pflash, "bad_request", "(0, 1]"), "keep 0");
    CHECK(parse_fails({"e", "--model", "t", "--keep-ratio=1.5"}, pflash, "bad_request", "(0, 1]"), "keep 1.5");
    CHECK(parse_fails({"e", "--model", "t", "--keep-ratio=nan"}, pflash, "bad_request", "number"), "keep nan");
    CHECK(parse_fails({"e", "--model", "t", "--min-prompt-tokens=-1"}, pflash, "bad_request", ">= 0"), "min -1");
    CHECK(parse_fails({"e", "--model", "t", "--min-prompt-tokens=1.5"}, pflash, "bad_request", "integer"), "min 1.5");
    CHECK(parse_fails({"x", "--model", "t", "--min-prompt-tokens=0"}, dflash, "unsupported", "--min-prompt-tokens"),
          "dflash min-prompt-tokens");
    CHECK(parse_fails({"e", "--model", "t", "--chain=maybe"}, dflash, "bad_request", "--chain"), "chain=maybe");
    CHECK(parse_fails({"e", "--model", "t", "--draft="}, dflash, "bad_request", "path"), "empty draft");
    // Each engine refuses the others' flags, naming the flag and the program.
    CHECK(parse_fails({"lucebench-pflash", "--model", "t", "--budget", "22"}, pflash, "unsupported",
                      "lucebench-pflash does not take --budget"), "pflash --budget");
    CHECK(parse_fails({"x", "--model", "t", "--draft", "d"}, pflash, "unsupported", "--draft"), "pflash --draft");
    CHECK(parse_fails({"x", "--model", "t", "--keep-ratio=0.1"}, dflash, "unsupported", "--keep-ratio"), "dflash keep");
    CHECK(parse_fails({"x", "--model", "t", "--drafter", "q"}, dflash, "unsupported", "--drafter"), "dflash drafter");
    CHECK(parse_fails({"x", "--model", "t", "--chain"}, pflash, "unsupported", "--chain"), "pflash chain");
    CHECK(parse_fails({"x", "--model", "t", "--budget"}, 0, "unsupported", "--budget"), "refused before its value");
}

// A knob that became an engine option changes nothing and names the flag that replaces it.
static void test_tuning_moved() {
    const lb::Tuning m = lb::parse_tuning({"LB_PFLASH_SPARSE_FROM=32768"});
    CHECK(m.set.empty() && m.warnings.size() == 1 &&
              m.warnings[0].find("--drafter-sparse-from") != std::string::npos &&
              m.to_json().dump().find("pflash_sparse") == std::string::npos,
          "moved: %s", m.warnings.empty() ? "(no warning)" : m.warnings[0].c_str());
}

// The knobs (core/tuning.h): parsed, range-clamped, recorded as set; stray and malformed variables warned
// about and ignored.
static void test_tuning() {
    const lb::Tuning d = lb::parse_tuning({"PATH=/bin", "HOME=/root"});
    CHECK(d.set.empty() && d.warnings.empty() && d.gpu_pdl && d.gemv_tile_bytes == 16384, "defaults");
    const lb::Tuning t = lb::parse_tuning({"LB_GPU_PDL=0", "LB_GV_TILE=8192", "LB_GV_PREWAIT=9", "LB_MK_TRACE=/tmp/t",
                                           "LB_GPU_OLD_GEMM=1", "LB_NOT_A_KNOB=x", "LB_MK_FUSE=yes", "LB_GPU_SPLITK=four"});
    CHECK(!t.gpu_pdl && t.gemv_tile_bytes == 8192 && t.gemv_prewait == 3 && t.mk_trace == "/tmp/t", "values");
    CHECK(t.mk_fuse && t.gemm_splitk_per_sm == 4, "malformed values leave the default");
    CHECK(t.set.size() == 4, "set: %zu", t.set.size());
    CHECK(t.warnings.size() == 5, "warnings: %zu", t.warnings.size());
    const std::string j = t.to_json().dump();
    CHECK(j.find("\"gemv_tile_bytes\": 8192") != std::string::npos || j.find("\"gemv_tile_bytes\":8192") != std::string::npos,
          "json: %s", j.c_str());
    CHECK(j.find("LB_GV_TILE") != std::string::npos, "json set: %s", j.c_str());
    // a retired variant's switch changes nothing and says so
    const std::pair<const char*, const char*> retired[] = {
        {"LB_GPU_QGEMV32=1", "\"qgemv32\""}, {"LB_GPU_QMV=0", "\"qmv\""}, {"LB_GPU_QMMA=0", "\"qmma\""}};
    for (const auto& [var, key] : retired) {
        const lb::Tuning r = lb::parse_tuning({var});
        CHECK(r.set.empty() && r.warnings.size() == 1 && r.warnings[0].find("retired") != std::string::npos &&
                  r.to_json().dump().find(key) == std::string::npos,
              "retired %s: %s", var, r.warnings.empty() ? "(no warning)" : r.warnings[0].c_str());
    }
}

// Block-sparse attention's CPU reference (cpu::block_sparse_select / block_sparse_attention, the rule the GPU's
// block_select_kernel is checked against): with every block kept it is the causal attention, bit for bit; the
// alpha rule keeps exactly the blocks within ln(alpha) of the best; the budget keeps at most its count of
// them, the best-scoring.
static void test_block_sparse_cpu() {
    const int n = 300, pos0 = 3000, nh = 4, nkv = 2, hd = 48, rows = 64, ctx = pos0 + n;
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::vector<float> q(size_t(n) * nh * hd), K(size_t(ctx) * nkv * hd), V(K.size());
    for (float& x : q) x = u(rng) + 0.5f;  // queries and every third key block share a direction
    for (size_t i = 0; i < K.size(); ++i) {
        K[i] = u(rng) + ((i / (size_t(nkv) * hd)) / 128 % 3 == 1 ? 0.5f : 0.f);
        V[i] = u(rng);
    }
    std::vector<float> dense(q.size()), sparse(q.size());
    lb::cpu::attention(q.data(), n, nh, nkv, hd, pos0, K.data(), lb::DType::F32, V.data(), lb::DType::F32, dense.data());
    lb::cpu::SparseRule all;
    all.alpha = 1e-30f;
    auto tiles = lb::cpu::block_sparse_select(q.data(), n, nh, nkv, hd, rows, pos0, K.data(), all);
    lb::cpu::block_sparse_attention(q.data(), n, nh, nkv, hd, rows, pos0, K.data(), V.data(), tiles, sparse.data());
    CHECK(dense == sparse, "every block kept: not the causal attention");
    for (float budget : {1.f, 0.1f}) {
        lb::cpu::SparseRule rule;
        rule.budget = budget;
        std::vector<std::vector<float>> scores;
        tiles = lb::cpu::block_sparse_select(q.data(), n, nh, nkv, hd, rows, pos0, K.data(), rule, &scores);
        int cut = 0, dropped = 0;
        for (size_t th = 0; th < tiles.size(); ++th) {
            const int tile = int(th) / nkv, last = pos0 + std::min(tile * rows + rows, n) - 1, jl = last / 128;
            const std::vector<float>& sc = scores[th];
            float best = -1e30f;
            for (float x : sc) best = std::max(best, x);
            std::vector<char> kept(size_t(jl + 1), 0);
            for (int k : tiles[th]) kept[size_t(k / 2)] = 1;
            int n_free = 0, n_cand = 0;
            float min_kept = 1e30f, max_dropped = -1e30f;
            for (int j = 2; j <= jl - 4; ++j) {
                const bool cand = sc[size_t(j)] - best >= std::log(rule.alpha);
                CHECK(!kept[size_t(j)] || cand, "budget %g: block %d kept outside the alpha rule", budget, j);
                n_free += kept[size_t(j)];
                n_cand += cand;
                if (kept[size_t(j)]) min_kept = std::min(min_kept, sc[size_t(j)]);
                else if (cand) max_dropped = std::max(max_dropped, sc[size_t(j)]);
                dropped += !kept[size_t(j)];
            }
            for (int j = 0; j <= jl; ++j)
                if (j < 2 || j > jl - 4) CHECK(kept[size_t(j)], "budget %g: forced block %d dropped", budget, j);
            const int cap = budget >= 1.f ? n_cand : int(std::ceil(budget * float(jl + 1)));
            CHECK(n_free == std::min(n_cand, cap), "budget %g: %d kept of %d candidates, cap %d", budget, n_free,
                  n_cand, cap);
            CHECK(min_kept >= max_dropped, "budget %g: a dropped candidate outscores a kept block", budget);
            cut += n_cand > cap;
        }
        CHECK(dropped > 0 && (budget >= 1.f || cut > 0), "budget %g: the shape tests nothing (%d dropped, %d cut)",
              budget, dropped, cut);
    }
}

int main(int argc, char** argv) {
    if (argc == 5 && std::string(argv[1]) == "dequantize") return dequantize_file(argv[2], argv[3], argv[4]);
    test_json();
    test_kv_split_count();
    test_tuning();
    test_half();
    test_blocks();
    test_delta_rule();
    test_block_sparse_cpu();
    test_engine_flags();
    test_tuning_moved();
    if (failures) { fprintf(stderr, "%d check(s) failed\n", failures); return 1; }
    printf("core tests passed\n");
    return 0;
}
