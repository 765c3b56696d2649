// The gated delta rule over the rows of a verify forward (a chain or a tree), in the chunked (WY) form of
// delta_rule.cpp with the causal mask replaced by the ancestor mask: every row's path from the committed
// state is a chain, and a row's u depends only on its ancestors' u, so one triangular solve in row order
// (parents before children) serves every path at once. Nothing per row is a full state: commit rebuilds
// the accepted row's state from S0 and the path's (k, u, gamma), a rank-|path| update.
#include <cmath>
#include <vector>

#include "ops.h"

namespace lb::cpu {

void delta_rule_tree(const float* q, const float* k, const float* v, const float* g, const float* beta, int n,
                     int hk, int hv, int dk, int dv, const int* parent, const float* state, float* out, float* u,
                     float* gamma) {
    const int group = hv / hk;
    // anc[t * n + s]: s is an ancestor of t or t itself
    std::vector<uint8_t> anc(size_t(n) * n, 0);
    for (int t = 0; t < n; ++t)
        for (int s = t; s >= 0; s = parent[s]) anc[size_t(t) * n + s] = 1;
    for (int t = 0; t < n; ++t)
        for (int h = 0; h < hv; ++h)
            gamma[int64_t(t) * hv + h] = (parent[t] >= 0 ? gamma[int64_t(parent[t]) * hv + h] : 0.f) + g[int64_t(t) * hv + h];
#pragma omp parallel for schedule(static)
    for (int h = 0; h < hv; ++h) {
        const float* S = state + int64_t(h) * dk * dv;
        auto Q = [&](int t) { return q + (int64_t(t) * hk + h / group) * dk; };
        auto Kr = [&](int t) { return k + (int64_t(t) * hk + h / group) * dk; };
        auto Vr = [&](int t) { return v + (int64_t(t) * hv + h) * dv; };
        auto U = [&](int t) { return u + (int64_t(t) * hv + h) * dv; };
        auto G = [&](int t) { return gamma[int64_t(t) * hv + h]; };
        std::vector<float> S0k(static_cast<size_t>(dv)), S0q(static_cast<size_t>(dv));
        for (int t = 0; t < n; ++t) {
            const float bt = beta[int64_t(t) * hv + h];
            const float eg = std::exp(G(t));
            for (int j = 0; j < dv; ++j) S0k[size_t(j)] = 0;
            for (int i = 0; i < dk; ++i)
                for (int j = 0; j < dv; ++j) S0k[size_t(j)] += S[int64_t(i) * dv + j] * Kr(t)[i];
            float* ut = U(t);
            for (int j = 0; j < dv; ++j) ut[j] = bt * Vr(t)[j] - bt * eg * S0k[size_t(j)];
            for (int s = 0; s < t; ++s) {
                if (!anc[size_t(t) * n + s]) continue;
                float kk = 0;
                for (int i = 0; i < dk; ++i) kk += Kr(t)[i] * Kr(s)[i];
                const float a = bt * kk * std::exp(G(t) - G(s));
                const float* us = U(s);
                for (int j = 0; j < dv; ++j) ut[j] -= a * us[j];
            }
        }
        for (int t = 0; t < n; ++t) {
            const float eg = std::exp(G(t));
            for (int j = 0; j < dv; ++j) S0q[size_t(j)] = 0;
            for (int i = 0; i < dk; ++i)
                for (int j = 0; j < dv; ++j) S0q[size_t(j)] += S[int64_t(i) * dv + j] * Q(t)[i];
            float* ot = out + (int64_t(t) * hv + h) * dv;
            for (int j = 0; j < dv; ++j) ot[j] = eg * S0q[size_t(j)];
            for (int s = 0; s <= t; ++s) {
                if (!anc[size_t(t) * n + s]) continue;
                float qk = 0;
                for (int i = 0; i < dk; ++i) qk += Q(t)[i] * Kr(s)[i];
                const float a = qk * std::exp(G(t) - G(s));
                const float* us = U(s);
                for (int j = 0; j < dv; ++j) ot[j] += a * us[j];
            }
        }
    }
}

void delta_rule_tree_commit(const float* k, const float* u, const float* gamma, int hk, int hv, int dk, int dv,
                            const int* path, int n_path, float* state) {
    if (n_path == 0) return;
    const int group = hv / hk;
    const int a = path[n_path - 1];
#pragma omp parallel for schedule(static)
    for (int h = 0; h < hv; ++h) {
        float* S = state + int64_t(h) * dk * dv;
        const float ga = gamma[int64_t(a) * hv + h];
        const float el = std::exp(ga);
        for (int64_t i = 0; i < int64_t(dk) * dv; ++i) S[i] *= el;
        for (int p = 0; p < n_path; ++p) {
            const int s = path[p];
            const float d = std::exp(ga - gamma[int64_t(s) * hv + h]);
            const float* ks = k + (int64_t(s) * hk + h / group) * dk;
            const float* us = u + (int64_t(s) * hv + h) * dv;
            for (int i = 0; i < dk; ++i) {
                const float kd = ks[i] * d;
                for (int j = 0; j < dv; ++j) S[int64_t(i) * dv + j] += kd * us[j];
            }
        }
    }
}

}  // namespace lb::cpu
