// Each GPU verify kernel (core/cuda/verify_ops.cu) against its CPU reference (core/cpu/ops.h) on random
// inputs of several shapes, odd ones included, random trees (parents before children) and paths.
// Run on the device by scripts/device/check_verify_gpu.sh; exit status 0 when every check passes.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "core/cpu/ops.h"
#include "core/cuda/gpu_ops.h"
#include "core/cuda/verify_ops.h"
#include "gpu_check_util.h"

using namespace lb;

// A random tree of n rows (parents before children), or a chain.
static std::vector<int> random_parents(int n, bool chain) {
    std::vector<int> p(static_cast<size_t>(n));
    for (int t = 0; t < n; ++t) p[size_t(t)] = chain ? t - 1 : (t == 0 ? -1 : int(rng() % uint32_t(t + 1)) - 1);
    return p;
}
static std::vector<unsigned char> visible_of(const std::vector<int>& parent) {
    const int n = int(parent.size());
    std::vector<unsigned char> v(size_t(n) * n, 0);
    for (int t = 0; t < n; ++t) for (int s = t; s >= 0; s = parent[size_t(s)]) v[size_t(t) * n + s] = 1;
    return v;
}
// The path from a root (parent -1) to a random row, root first.
static std::vector<int> random_path(const std::vector<int>& parent) {
    int node = int(rng() % parent.size());
    std::vector<int> path;
    for (int s = node; s >= 0; s = parent[size_t(s)]) path.insert(path.begin(), s);
    return path;
}

static void check_attention(int n, int len, int nh, int nkv, int hd, int rot, bool gated, DType kt, DType vt, bool chain) {
    char name[160];
    snprintf(name, sizeof name, "attn n=%d len=%d h=%d/%d hd=%d %s %s/%s%s", n, len, nh, nkv, hd, gated ? "gated" : "plain",
             dtype_name(kt), dtype_name(vt), chain ? " chain" : "");
    const int q_rows = (gated ? 2 : 1) * nh * hd, ld = q_rows + 2 * nkv * hd;
    const int ctx = len + n + 3;
    const auto parent = random_parents(n, chain);
    const auto vis = visible_of(parent);
    std::vector<int> positions(static_cast<size_t>(n));
    for (int t = 0; t < n; ++t) { int d = 0; for (int s = parent[size_t(t)]; s >= 0; s = parent[size_t(s)]) ++d; positions[size_t(t)] = len + d; }
    auto qkv = randn(size_t(n) * ld);
    const auto qg = randn(size_t(hd), 0.2f), kg = randn(size_t(hd), 0.2f);
    std::vector<float> qgain(qg), kgain(kg);
    for (auto& e : qgain) e += 1.f;
    for (auto& e : kgain) e += 1.f;
    const size_t krow = dtype_row_bytes(kt, size_t(hd)), vrow = dtype_row_bytes(vt, size_t(hd));
    std::vector<uint8_t> kc(size_t(ctx) * nkv * krow), vc(size_t(ctx) * nkv * vrow);
    for (size_t r = 0; r < size_t(len) * nkv; ++r) {  // the committed rows
        auto a = randn(size_t(hd)), b = randn(size_t(hd));
        encode_row(kt, a.data(), &kc[r * krow], size_t(hd));
        encode_row(vt, b.data(), &vc[r * vrow], size_t(hd));
    }
    // CPU: split, norm, rope, store, attend
    std::vector<float> q(size_t(n) * nh * hd), gate(size_t(n) * nh * hd), k(size_t(n) * nkv * hd), v(size_t(n) * nkv * hd);
    for (int t = 0; t < n; ++t) {
        const float* r = &qkv[size_t(t) * ld];
        for (int h = 0; h < nh; ++h) {
            std::copy(r + h * (gated ? 2 : 1) * hd, r + h * (gated ? 2 : 1) * hd + hd, &q[(size_t(t) * nh + h) * hd]);
            if (gated) std::copy(r + h * 2 * hd + hd, r + h * 2 * hd + 2 * hd, &gate[(size_t(t) * nh + h) * hd]);
        }
        std::copy(r + q_rows, r + q_rows + nkv * hd, &k[size_t(t) * nkv * hd]);
        std::copy(r + q_rows + nkv * hd, r + ld, &v[size_t(t) * nkv * hd]);
    }
    cpu::rmsnorm(q.data(), qgain.data(), q.data(), n * nh, hd, 1e-6f);
    cpu::rmsnorm(k.data(), kgain.data(), k.data(), n * nkv, hd, 1e-6f);
    cpu::rope_at(q.data(), n, nh, hd, rot, 1e6f, positions.data());
    cpu::rope_at(k.data(), n, nkv, hd, rot, 1e6f, positions.data());
    std::vector<uint8_t> kc_ref(kc), vc_ref(vc);
    for (int t = 0; t < n; ++t)
        for (int j = 0; j < nkv; ++j) {
            const size_t r = size_t(len + t) * nkv + j;
            encode_row(kt, &k[(size_t(t) * nkv + j) * hd], &kc_ref[r * krow], size_t(hd));
            encode_row(vt, &v[(size_t(t) * nkv + j) * hd], &vc_ref[r * vrow], size_t(hd));
        }
    std::vector<float> want(size_t(n) * nh * hd);
    cpu::tree_attention(q.data(), n, nh, nkv, hd, len, kc_ref.data(), kt, vc_ref.data(), vt, vis.data(), want.data());
    if (gated) for (size_t i = 0; i < want.size(); ++i) want[i] *= cpu::sigmoid(gate[i]);
    // GPU
    float* d_qkv = up(qkv);
    uint8_t *d_k = up(kc), *d_v = up(vc);
    int* d_pos = up(positions);
    unsigned char* d_vis = up(vis);
    float *d_qg = up(qgain), *d_kg = up(kgain), *d_out = up(std::vector<float>(want.size()));
    gpu::attn_prep_tree(d_qkv, ld, n, nh, nkv, hd, gated, rot, 1e6f, d_qg, d_kg, 1e-6f, d_pos, len, d_k, kt, d_v, vt, 0);
    gpu::tree_attention(d_qkv, ld, n, nh, nkv, hd, gated, len, d_k, kt, d_v, vt, d_vis, d_out, 0);
    const auto got = down(d_out, want.size());
    const auto gk = down(d_k, kc.size()), gv = down(d_v, vc.size());
    // the stored rows, decoded
    std::vector<float> kg_f(size_t(ctx) * nkv * hd), kw_f(kg_f.size()), vg_f(kg_f.size()), vw_f(kg_f.size());
    for (size_t r = 0; r < size_t(ctx) * nkv; ++r) {
        decode_row(kt, &gk[r * krow], &kg_f[r * hd], size_t(hd));
        decode_row(kt, &kc_ref[r * krow], &kw_f[r * hd], size_t(hd));
        decode_row(vt, &gv[r * vrow], &vg_f[r * hd], size_t(hd));
        decode_row(vt, &vc_ref[r * vrow], &vw_f[r * hd], size_t(hd));
    }
    // a rounding flip of a 16-bit value, or a q4_0 value one step (1/8 of its block's largest) away
    const bool q4 = kt == DType::Q4_0 || vt == DType::Q4_0;
    const double store_tol = kt == DType::F32 && vt == DType::F32 ? 1e-5 : q4 ? 0.15 : 1e-2;
    compare(std::string(name) + ": K stored", kg_f, kw_f, store_tol);
    compare(std::string(name) + ": V stored", vg_f, vw_f, store_tol);
    compare(name, got, want, kt == DType::F32 ? 1e-4 : q4 ? 5e-2 : 2e-2);
    for (void* p : {(void*)d_qkv, (void*)d_k, (void*)d_v, (void*)d_pos, (void*)d_vis, (void*)d_qg, (void*)d_kg, (void*)d_out}) GPU_CHECK(gpuFree(p));
}

static void check_conv(int n, int C, int K, bool chain) {
    char name[96];
    snprintf(name, sizeof name, "conv tree n=%d C=%d K=%d%s", n, C, K, chain ? " chain" : "");
    const int ldx = C + 5;
    const auto parent = random_parents(n, chain);
    const auto x = randn(size_t(n) * ldx), w = randn(size_t(C) * K, 0.5f), state = randn(size_t(C) * (K - 1));
    std::vector<float> xc(size_t(n) * C);
    for (int t = 0; t < n; ++t) std::copy(&x[size_t(t) * ldx], &x[size_t(t) * ldx] + C, &xc[size_t(t) * C]);
    std::vector<float> want(size_t(n) * C);
    cpu::causal_conv1d_silu_tree(xc.data(), n, C, K, w.data(), state.data(), parent.data(), want.data());
    float *dx = up(x), *dw = up(w), *ds = up(state), *dy = up(want), *dkeep = up(xc);
    int* dp = up(parent);
    gpu::conv_tree(dx, ldx, n, C, K, dw, ds, dp, dy, dkeep, 0);
    compare(name, down(dy, want.size()), want, 1e-5);
    compare(std::string(name) + ": kept inputs", down(dkeep, xc.size()), xc, 0);
    const auto path = random_path(parent);
    std::vector<float> st(state);
    cpu::conv_state_commit(xc.data(), C, K, path.data(), int(path.size()), st.data());
    int* dpath = up(path);
    gpu::DeltaCommitLayers L;  // one layer, its conv state only (hv = 0)
    L.count = 1;
    L.conv_keep[0] = dkeep;
    L.conv_state[0] = ds;
    gpu::delta_conv_commit(L, 0, 0, 0, 0, C, K, dpath, int(path.size()), 0);
    compare(std::string(name) + ": commit", down(ds, st.size()), st, 0);
    for (void* p : {(void*)dx, (void*)dw, (void*)ds, (void*)dy, (void*)dkeep, (void*)dp, (void*)dpath}) GPU_CHECK(gpuFree(p));
}

static void check_delta(int n, int hk, int hv, int dk, int dv, bool chain) {
    char name[96];
    snprintf(name, sizeof name, "delta tree n=%d heads %d/%d dk=%d dv=%d%s", n, hk, hv, dk, dv, chain ? " chain" : "");
    const int kd = hk * dk, vd = hv * dv, ld = 2 * kd + vd + 3;
    const auto parent = random_parents(n, chain);
    const auto vis = visible_of(parent);
    auto qkv = randn(size_t(n) * ld);
    std::uniform_real_distribution<float> ud(0.f, 1.f);
    std::vector<float> g(size_t(n) * hv), beta(size_t(n) * hv);
    for (auto& e : g) e = -3.f * ud(rng);
    for (auto& e : beta) e = ud(rng);
    std::vector<float> q(size_t(n) * kd), k(size_t(n) * kd), v(size_t(n) * vd);
    for (int t = 0; t < n; ++t) {
        float* r = &qkv[size_t(t) * ld];
        cpu::l2norm(r, hk, dk, 1e-6f);
        cpu::l2norm(r + kd, hk, dk, 1e-6f);
        for (int i = 0; i < kd; ++i) r[i] /= std::sqrt(float(dk));
        std::copy(r, r + kd, &q[size_t(t) * kd]);
        std::copy(r + kd, r + 2 * kd, &k[size_t(t) * kd]);
        std::copy(r + 2 * kd, r + 2 * kd + vd, &v[size_t(t) * vd]);
    }
    const auto state = randn(size_t(hv) * dk * dv, 0.3f);
    std::vector<float> out(size_t(n) * vd), u(size_t(n) * vd), gamma(size_t(n) * hv);
    cpu::delta_rule_tree(q.data(), k.data(), v.data(), g.data(), beta.data(), n, hk, hv, dk, dv, parent.data(), state.data(),
                         out.data(), u.data(), gamma.data());
    // outputs start as NaN: an element the kernel does not write fails the comparison
    auto nans = [](size_t n) { return std::vector<float>(n, NAN); };
    float *dq = up(qkv), *dg = up(g), *db = up(beta), *ds = up(state), *dout = up(nans(out.size())), *du = up(nans(u.size()));
    float *dgam = up(nans(gamma.size())), *dk_keep = up(nans(k.size())), *dscr = up(std::vector<float>(gpu::delta_tree_scratch(n, hv)));
    int* dp = up(parent);
    unsigned char* dvis = up(vis);
    gpu::delta_tree(dq, ld, n, hk, hv, dk, dv, dg, db, dp, dvis, ds, dout, du, dgam, dk_keep, dscr, 0);
    compare(name, down(dout, out.size()), out, 1e-4);
    compare(std::string(name) + ": u", down(du, u.size()), u, 1e-4);
    compare(std::string(name) + ": gamma", down(dgam, gamma.size()), gamma, 1e-6);
    compare(std::string(name) + ": k kept", down(dk_keep, k.size()), k, 0);
    const auto path = random_path(parent);
    std::vector<float> st(state);
    cpu::delta_rule_tree_commit(k.data(), u.data(), gamma.data(), hk, hv, dk, dv, path.data(), int(path.size()), st.data());
    int* dpath = up(path);
    gpu::DeltaCommitLayers L;  // one layer, its DeltaNet state only (C = 0)
    L.count = 1;
    L.k[0] = dk_keep;
    L.u[0] = du;
    L.gamma[0] = dgam;
    L.state[0] = ds;
    gpu::delta_conv_commit(L, hk, hv, dk, dv, 0, 0, dpath, int(path.size()), 0);
    compare(std::string(name) + ": commit", down(ds, st.size()), st, 1e-4);
    for (void* p : {(void*)dq, (void*)dg, (void*)db, (void*)ds, (void*)dout, (void*)du, (void*)dgam, (void*)dk_keep, (void*)dscr, (void*)dp, (void*)dpath, (void*)dvis})
        GPU_CHECK(gpuFree(p));
}

static void check_compact(int len, int n, size_t row_bytes) {
    const auto parent = random_parents(n, false);
    const auto path = random_path(parent);
    std::vector<uint8_t> cache(size_t(len + n) * row_bytes);
    for (auto& b : cache) b = uint8_t(rng());
    std::vector<uint8_t> want(cache);
    for (size_t i = 0; i < path.size(); ++i)
        memmove(&want[size_t(len + int(i)) * row_bytes], &want[size_t(len + path[i]) * row_bytes], row_bytes);
    uint8_t* d = up(cache);
    int* dp = up(path);
    gpu::KvCompactLayers kv;  // one cache
    kv.count = 1;
    kv.cache[0] = d;
    kv.row_bytes[0] = row_bytes;
    gpu::kv_compact(kv, len, dp, int(path.size()), 0);
    const bool ok = down(d, cache.size()) == want;
    if (!ok) ++g_failed;
    printf("  kv compact len=%d n=%d path %zu rows, row %zu B %s\n", len, n, path.size(), row_bytes, ok ? "ok" : "FAIL");
    GPU_CHECK(gpuFree(d));
    GPU_CHECK(gpuFree(dp));
}

// The DeltaNet state commit in its plain form, one state row a block: delta_conv_commit's kernel (a block's
// rows sharing each u load and decay) must give the same bits.
__global__ void delta_commit_row_kernel(const float* k, const float* u, const float* gamma, int hk, int hv, int dk,
                                        int dv, const int* path, int m, float* state) {
    const int h = blockIdx.x, i = blockIdx.y, kh = h / (hv / hk);
    const int a = path[m - 1];
    const float ga = gamma[size_t(a) * hv + h], el = expf(ga);
    float* S = state + (size_t(h) * dk + i) * dv;
    for (int j = threadIdx.x; j < dv; j += blockDim.x) {
        float sv = S[j] * el;
        for (int p = 0; p < m; ++p) {
            const int s = path[p];
            const float d = expf(ga - gamma[size_t(s) * hv + h]);
            sv += (k[size_t(s) * hk * dk + kh * dk + i] * d) * u[(size_t(s) * hv + h) * dv + j];
        }
        S[j] = sv;
    }
}

// The batched commit (verify_ops.h: delta_conv_commit over `layers` DeltaNet layers, kv_compact over caches of
// several row sizes) against the CPU references layer by layer: conv states and KV rows exactly, DeltaNet
// states to 1e-4 and bitwise against delta_commit_row_kernel.
static void check_commit_layers(int layers, int n, int hk, int hv, int dk, int dv, int C, int K) {
    char name[96];
    snprintf(name, sizeof name, "commit of %d layers n=%d heads %d/%d dk=%d dv=%d C=%d", layers, n, hk, hv, dk, dv, C);
    const auto parent = random_parents(n, false);
    const auto path = random_path(parent);
    const int m = int(path.size());
    int* dpath = up(path);
    gpu::DeltaCommitLayers L;
    L.count = layers;
    std::vector<std::vector<float>> want_s(static_cast<size_t>(layers)), want_c(static_cast<size_t>(layers));
    std::vector<float*> ref_states, frees;
    for (int l = 0; l < layers; ++l) {
        const auto k = randn(size_t(n) * hk * dk), u = randn(size_t(n) * hv * dv);
        std::vector<float> gamma(size_t(n) * hv);
        std::uniform_real_distribution<float> ud(0.f, 1.f);
        for (int t = 0; t < n; ++t)
            for (int h = 0; h < hv; ++h)
                gamma[size_t(t) * hv + h] = (parent[size_t(t)] >= 0 ? gamma[size_t(parent[size_t(t)]) * hv + h] : 0.f) - 2.f * ud(rng);
        const auto state = randn(size_t(hv) * dk * dv, 0.3f), keep = randn(size_t(n) * C), cst = randn(size_t(C) * (K - 1));
        want_s[size_t(l)] = state;
        cpu::delta_rule_tree_commit(k.data(), u.data(), gamma.data(), hk, hv, dk, dv, path.data(), m, want_s[size_t(l)].data());
        want_c[size_t(l)] = cst;
        cpu::conv_state_commit(keep.data(), C, K, path.data(), m, want_c[size_t(l)].data());
        float *dk_ = up(k), *du = up(u), *dg = up(gamma), *ds = up(state), *dkeep = up(keep), *dc = up(cst), *dref = up(state);
        L.k[l] = dk_;
        L.u[l] = du;
        L.gamma[l] = dg;
        L.state[l] = ds;
        L.conv_keep[l] = dkeep;
        L.conv_state[l] = dc;
        delta_commit_row_kernel<<<dim3(hv, dk), 128>>>(dk_, du, dg, hk, hv, dk, dv, dpath, m, dref);
        ref_states.push_back(dref);
        for (float* p : {dk_, du, dg, ds, dkeep, dc, dref}) frees.push_back(p);
    }
    gpu::delta_conv_commit(L, hk, hv, dk, dv, C, K, dpath, m, 0);
    for (int l = 0; l < layers; ++l) {
        const std::string ln = std::string(name) + ", layer " + std::to_string(l);
        const auto got = down(L.state[l], want_s[size_t(l)].size());
        compare(ln + ": DeltaNet state", got, want_s[size_t(l)], 1e-4);
        const auto ref = down((const float*)ref_states[size_t(l)], got.size());
        const bool same = memcmp(got.data(), ref.data(), sizeof(float) * got.size()) == 0;
        ++g_checks;
        if (!same) ++g_failed;
        printf("  %-64s %s\n", (ln + ": state bits = one-row-a-block kernel's").c_str(), same ? "ok" : "FAIL");
        compare(ln + ": conv state", down(L.conv_state[l], want_c[size_t(l)].size()), want_c[size_t(l)], 0);
    }
    // KV caches of three row sizes (16-byte rows and byte rows) compacted in one launch
    const int len = 11;
    const size_t row_bytes[3] = {2048, 40, 96 * 3};
    gpu::KvCompactLayers kv;
    kv.count = 3;
    std::vector<std::vector<uint8_t>> want_kv(3);
    for (int c = 0; c < 3; ++c) {
        std::vector<uint8_t> cache(size_t(len + n) * row_bytes[c]);
        for (auto& b : cache) b = uint8_t(rng());
        want_kv[size_t(c)] = cache;
        for (int i = 0; i < m; ++i)
            memmove(&want_kv[size_t(c)][size_t(len + i) * row_bytes[c]], &want_kv[size_t(c)][size_t(len + path[size_t(i)]) * row_bytes[c]],
                    row_bytes[c]);
        kv.cache[c] = up(cache);
        kv.row_bytes[c] = row_bytes[c];
    }
    gpu::kv_compact(kv, len, dpath, m, 0);
    for (int c = 0; c < 3; ++c) {
        const bool ok = down((const uint8_t*)kv.cache[c], want_kv[size_t(c)].size()) == want_kv[size_t(c)];
        ++g_checks;
        if (!ok) ++g_failed;
        printf("  %-64s %s\n", (std::string(name) + ": KV rows of " + std::to_string(row_bytes[c]) + " B").c_str(),
               ok ? "ok" : "FAIL");
        GPU_CHECK(gpuFree(kv.cache[c]));
    }
    for (float* p : frees) GPU_CHECK(gpuFree(p));
    GPU_CHECK(gpuFree(dpath));
}

int main() {
    gpu::DeviceContext ctx(0);  // delta_tree's choice of kernel reads the device's shared-memory limit
    gpu::ContextScope bind(ctx);
    for (bool chain : {false, true}) {
        check_attention(7, 5, 3, 1, 20, 10, true, DType::F32, DType::F32, chain);
        check_attention(23, 40, 8, 2, 256, 64, true, DType::BF16, DType::BF16, chain);
        check_attention(65, 300, 16, 8, 128, 128, false, DType::F16, DType::F32, chain);
        check_attention(33, 0, 4, 4, 72, 72, false, DType::F32, DType::F32, chain);
        check_attention(23, 40, 8, 2, 256, 64, true, DType::Q8_0, DType::Q8_0, chain);
        check_attention(17, 33, 4, 2, 128, 128, false, DType::Q4_0, DType::Q8_0, chain);
        check_conv(9, 37, 4, chain);
        check_conv(65, 6144, 4, chain);
        check_conv(17, 50, 3, chain);
        check_delta(9, 1, 3, 12, 6, chain);
        check_delta(23, 2, 4, 16, 20, chain);
        check_delta(65, 16, 16, 128, 128, chain);
        check_delta(33, 2, 6, 128, 128, chain);
        check_delta(17, 1, 3, 48, 32, chain);   // the split kernels at odd sizes (dk % 16, dv % 16 == 0)
        check_delta(5, 1, 1, 256, 16, chain);
    }
    check_compact(10, 20, 1024);
    check_compact(0, 65, 256 * 2 * 2);
    check_commit_layers(3, 9, 2, 4, 16, 20, 37, 4);      // 8 state rows a block
    check_commit_layers(2, 17, 1, 3, 12, 6, 50, 3);      // one row a block (dk % 8 != 0)
    check_commit_layers(5, 23, 16, 48, 128, 128, 10240, 4);  // Qwen3.5-27B's DeltaNet shape
    if (g_failed) { printf("%d check(s) failed\n", g_failed); return 1; }
    printf("verify kernels match the CPU reference\n");
    return 0;
}
