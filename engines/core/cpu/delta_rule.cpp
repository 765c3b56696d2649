// The gated delta rule of Gated DeltaNet, fp32 state. Two forms of one recurrence:
//   S_t = exp(g_t) S_{t-1} + k_t u_t^T,   u_t = beta_t (v_t - exp(g_t) S_{t-1}^T k_t),   o_t = S_t^T q_t
// `recurrent` steps token by token (decode). `chunked` (prefill) solves each chunk of C tokens at once:
// with gamma_t = sum of g over the chunk up to t, and S0 the state before the chunk,
//   u_t + sum_{s<t} beta_t (k_t . k_s) e^{gamma_t - gamma_s} u_s = beta_t v_t - beta_t e^{gamma_t} S0^T k_t
// is a unit lower-triangular system (forward substitution), then
//   o_t   = e^{gamma_t} S0^T q_t + sum_{s<=t} e^{gamma_t - gamma_s} (q_t . k_s) u_s
//   S_end = e^{gamma_L} S0 + sum_s e^{gamma_L - gamma_s} k_s u_s^T.
// Decays are always formed as exp(gamma_t - gamma_s) (never a ratio of exps) so that strongly decaying
// heads underflow to 0 instead of producing 0/0.
#include <cmath>
#include <vector>

#include "ops.h"

namespace lb::cpu {

void delta_rule_recurrent(const float* q, const float* k, const float* v, const float* g, const float* beta, int n,
                          int hk, int hv, int dk, int dv, float* state, float* out) {
    const int group = hv / hk;
#pragma omp parallel for schedule(static)
    for (int h = 0; h < hv; ++h) {
        float* S = state + int64_t(h) * dk * dv;
        std::vector<float> delta(static_cast<size_t>(dv));
        for (int t = 0; t < n; ++t) {
            const float* qt = q + (int64_t(t) * hk + h / group) * dk;
            const float* kt = k + (int64_t(t) * hk + h / group) * dk;
            const float* vt = v + (int64_t(t) * hv + h) * dv;
            const float decay = std::exp(g[int64_t(t) * hv + h]);
            const float b = beta[int64_t(t) * hv + h];
            for (int64_t i = 0; i < int64_t(dk) * dv; ++i) S[i] *= decay;
            for (int j = 0; j < dv; ++j) delta[size_t(j)] = 0;
            for (int i = 0; i < dk; ++i)
                for (int j = 0; j < dv; ++j) delta[size_t(j)] += S[int64_t(i) * dv + j] * kt[i];
            for (int j = 0; j < dv; ++j) delta[size_t(j)] = (vt[j] - delta[size_t(j)]) * b;
            for (int i = 0; i < dk; ++i)
                for (int j = 0; j < dv; ++j) S[int64_t(i) * dv + j] += kt[i] * delta[size_t(j)];
            float* ot = out + (int64_t(t) * hv + h) * dv;
            for (int j = 0; j < dv; ++j) ot[j] = 0;
            for (int i = 0; i < dk; ++i)
                for (int j = 0; j < dv; ++j) ot[j] += S[int64_t(i) * dv + j] * qt[i];
        }
    }
}

void delta_rule_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta, int n,
                        int hk, int hv, int dk, int dv, float* state, float* out, int chunk) {
    const int group = hv / hk;
#pragma omp parallel for schedule(static)
    for (int h = 0; h < hv; ++h) {
        float* S = state + int64_t(h) * dk * dv;
        std::vector<float> gamma(static_cast<size_t>(chunk)), u(size_t(chunk) * dv), kk(size_t(chunk) * chunk), qk(size_t(chunk) * chunk);
        std::vector<float> S0q(static_cast<size_t>(dv)), S0k(static_cast<size_t>(dv));
        for (int t0 = 0; t0 < n; t0 += chunk) {
            const int L = std::min(chunk, n - t0);
            auto Q = [&](int t) { return q + (int64_t(t0 + t) * hk + h / group) * dk; };
            auto Kr = [&](int t) { return k + (int64_t(t0 + t) * hk + h / group) * dk; };
            auto Vr = [&](int t) { return v + (int64_t(t0 + t) * hv + h) * dv; };
            float acc = 0;
            for (int t = 0; t < L; ++t) { acc += g[int64_t(t0 + t) * hv + h]; gamma[size_t(t)] = acc; }
            // Gram matrices within the chunk: k_t . k_s and q_t . k_s for s <= t.
            for (int t = 0; t < L; ++t)
                for (int s = 0; s <= t; ++s) {
                    float a = 0, b = 0;
                    for (int i = 0; i < dk; ++i) { a += Kr(t)[i] * Kr(s)[i]; b += Q(t)[i] * Kr(s)[i]; }
                    kk[size_t(t) * chunk + s] = a;
                    qk[size_t(t) * chunk + s] = b;
                }
            // Forward substitution for u, reading the chunk-start state S0 (not yet updated).
            for (int t = 0; t < L; ++t) {
                const float bt = beta[int64_t(t0 + t) * hv + h];
                const float eg = std::exp(gamma[size_t(t)]);
                for (int j = 0; j < dv; ++j) S0k[size_t(j)] = 0;
                for (int i = 0; i < dk; ++i)
                    for (int j = 0; j < dv; ++j) S0k[size_t(j)] += S[int64_t(i) * dv + j] * Kr(t)[i];
                float* ut = &u[size_t(t) * dv];
                for (int j = 0; j < dv; ++j) ut[j] = bt * Vr(t)[j] - bt * eg * S0k[size_t(j)];
                for (int s = 0; s < t; ++s) {
                    const float a = bt * kk[size_t(t) * chunk + s] * std::exp(gamma[size_t(t)] - gamma[size_t(s)]);
                    const float* us = &u[size_t(s) * dv];
                    for (int j = 0; j < dv; ++j) ut[j] -= a * us[j];
                }
            }
            // Outputs.
            for (int t = 0; t < L; ++t) {
                const float eg = std::exp(gamma[size_t(t)]);
                for (int j = 0; j < dv; ++j) S0q[size_t(j)] = 0;
                for (int i = 0; i < dk; ++i)
                    for (int j = 0; j < dv; ++j) S0q[size_t(j)] += S[int64_t(i) * dv + j] * Q(t)[i];
                float* ot = out + (int64_t(t0 + t) * hv + h) * dv;
                for (int j = 0; j < dv; ++j) ot[j] = eg * S0q[size_t(j)];
                for (int s = 0; s <= t; ++s) {
                    const float a = qk[size_t(t) * chunk + s] * std::exp(gamma[size_t(t)] - gamma[size_t(s)]);
                    const float* us = &u[size_t(s) * dv];
                    for (int j = 0; j < dv; ++j) ot[j] += a * us[j];
                }
            }
            // State at the end of the chunk.
            const float gl = gamma[size_t(L - 1)];
            const float el = std::exp(gl);
            for (int64_t i = 0; i < int64_t(dk) * dv; ++i) S[i] *= el;
            for (int s = 0; s < L; ++s) {
                const float d = std::exp(gl - gamma[size_t(s)]);
                const float* us = &u[size_t(s) * dv];
                for (int i = 0; i < dk; ++i) {
                    const float ks = Kr(s)[i] * d;
                    for (int j = 0; j < dv; ++j) S[int64_t(i) * dv + j] += ks * us[j];
                }
            }
        }
    }
}

}  // namespace lb::cpu
