// Gated delta rule over a prefill chunk (and the q/k normalisation, beta and g before it).
// CPU reference: ../cpu/delta_rule.cpp (delta_rule_recurrent, delta_rule_chunked), ../cpu/norms.cpp (l2norm).
#include "common.cuh"

namespace lb::gpu {

namespace {

// grid (n, 2 * hk + 1): blocks y < 2*hk normalise one q or k head; the last one computes g and beta.
__global__ void deltanet_prep_kernel(float* y, int ldy, const float* proj, int ldp, int b_off, const float* negA,
                                     const float* dt_bias, int hk, int dk, int hv, float* g, float* beta) {
    const int t = blockIdx.x, h = blockIdx.y;
    if (h == 2 * hk) {
        for (int i = threadIdx.x; i < hv; i += blockDim.x) {
            const float b = proj[size_t(t) * ldp + b_off + i];
            const float a = proj[size_t(t) * ldp + b_off + hv + i] + dt_bias[i];
            const float sp = softplus(a);
            beta[size_t(t) * hv + i] = sigmoidf(b);
            g[size_t(t) * hv + i] = negA[i] * sp;
        }
        return;
    }
    float* v = y + size_t(t) * ldy + size_t(h) * dk;  // q heads then k heads
    float ss = 0;
    for (int i = threadIdx.x; i < dk; i += blockDim.x) ss += v[i] * v[i];
    float inv = rsqrtf(block_sum(ss) + 1e-6f);
    if (h < hk) inv *= rsqrtf(float(dk));
    for (int i = threadIdx.x; i < dk; i += blockDim.x) v[i] *= inv;
}

// One block per value head; chunks of C tokens in sequence. Shared memory: K, Q [C][dk], U [C][dv],
// KK, QK [C][C], gamma, beta [C]. Thread j < dv owns column j of U for the forward substitution.
constexpr int DC = 16;
__global__ void delta_rule_kernel(const float* qkv, int ld, int n, int hk, int hv, int dk, int dv, const float* g,
                                  const float* beta, float* state, float* out) {
    extern __shared__ float sm[];
    float* Ks = sm;
    float* Qs = Ks + DC * dk;
    float* Us = Qs + DC * dk;
    float* Ws = Us + DC * dv;   // K S0, then reused
    float* QSs = Ws + DC * dv;  // Q S0
    float* KK = QSs + DC * dv;
    float* QK = KK + DC * DC;
    float* gam = QK + DC * DC;
    float* bet = gam + DC;
    const int h = blockIdx.x, kh = h / (hv / hk);
    const int kd = hk * dk;
    float* S = state + size_t(h) * dk * dv;
    for (int t0 = 0; t0 < n; t0 += DC) {
        const int L = min(DC, n - t0);
        for (int e = threadIdx.x; e < L * dk; e += blockDim.x) {
            const int t = e / dk, i = e % dk;
            const float* row = qkv + size_t(t0 + t) * ld;
            Qs[t * dk + i] = row[kh * dk + i];
            Ks[t * dk + i] = row[kd + kh * dk + i];
        }
        if (threadIdx.x == 0) {
            float acc = 0;
            for (int t = 0; t < L; ++t) {
                acc += g[size_t(t0 + t) * hv + h];
                gam[t] = acc;
                bet[t] = beta[size_t(t0 + t) * hv + h];
            }
        }
        __syncthreads();
        for (int e = threadIdx.x; e < L * L; e += blockDim.x) {
            const int t = e / L, s = e % L;
            float a = 0, b = 0;
            if (s <= t)
                for (int i = 0; i < dk; ++i) { a += Ks[t * dk + i] * Ks[s * dk + i]; b += Qs[t * dk + i] * Ks[s * dk + i]; }
            KK[t * DC + s] = a;
            QK[t * DC + s] = b;
        }
        for (int e = threadIdx.x; e < L * dv; e += blockDim.x) {
            const int t = e / dv, j = e % dv;
            float a = 0, b = 0;
            for (int i = 0; i < dk; ++i) {
                const float sij = S[size_t(i) * dv + j];
                a += Ks[t * dk + i] * sij;
                b += Qs[t * dk + i] * sij;
            }
            Ws[t * dv + j] = a;
            QSs[t * dv + j] = b;
        }
        __syncthreads();
        for (int j = threadIdx.x; j < dv; j += blockDim.x) {
            for (int t = 0; t < L; ++t) {
                const float* vrow = qkv + size_t(t0 + t) * ld + 2 * kd + size_t(h) * dv;
                float u = bet[t] * vrow[j] - bet[t] * __expf(gam[t]) * Ws[t * dv + j];
                for (int s = 0; s < t; ++s) u -= bet[t] * KK[t * DC + s] * __expf(gam[t] - gam[s]) * Us[s * dv + j];
                Us[t * dv + j] = u;
            }
            for (int t = 0; t < L; ++t) {
                float o = __expf(gam[t]) * QSs[t * dv + j];
                for (int s = 0; s <= t; ++s) o += QK[t * DC + s] * __expf(gam[t] - gam[s]) * Us[s * dv + j];
                out[(size_t(t0 + t) * hv + h) * dv + j] = o;
            }
        }
        __syncthreads();
        const float gl = gam[L - 1];
        for (int e = threadIdx.x; e < dk * dv; e += blockDim.x) {
            const int i = e / dv, j = e % dv;
            float sij = S[e] * __expf(gl);
            for (int s = 0; s < L; ++s) sij += __expf(gl - gam[s]) * Ks[s * dk + i] * Us[s * dv + j];
            S[e] = sij;
        }
        __syncthreads();
    }
}

// The chunked kernels' shared steps (blocks of 256 threads). Stage the chunk's q and k rows of key head kh ([L][dk + 1] each).
__device__ __forceinline__ void delta_stage_qk(const float* qkv, int ld, int t0, int L, int dk, int kh, int kd, float* Qs,
                                               float* Ks) {
    const int LDK = dk + 1;
    for (int e = threadIdx.x; e < L * dk; e += 256) {
        const int t = e / dk, i = e % dk;
        const float* row = qkv + size_t(t0 + t) * ld;
        Qs[t * LDK + i] = row[kh * dk + i];
        Ks[t * LDK + i] = row[kd + kh * dk + i];
    }
}
// The chunk's outputs of this block's CB columns, o_t = e^gamma_t QS_t + sum_{s<=t} B[t][s] U_s (out: row t at
// out + t * out_ld), and its state slice, S = e^gamma_L S + sum_s e^(gamma_L - gamma_s) k_s U_s^T.
template <int CB>
__device__ __forceinline__ void delta_chunk_finish(int L, int dk, const float* eg, const float* eL, const float* QSs,
                                                   const float* B, int ldb, const float* Us, const float* Ks, float* Ss,
                                                   float* out, int out_ld) {
    const int LDK = dk + 1;
    for (int e = threadIdx.x; e < L * CB; e += 256) {
        const int t = e / CB, j = e % CB;
        float o = eg[t] * QSs[e];
        for (int s = 0; s <= t; ++s) o += B[t * ldb + s] * Us[s * CB + j];
        out[size_t(t) * out_ld + j] = o;
    }
    const float gl = eg[L - 1];
    for (int e = threadIdx.x; e < dk * CB; e += 256) {
        const int i = e / CB, j = e % CB;
        float sij = Ss[e] * gl;
        for (int s = 0; s < L; ++s) sij += eL[s] * Ks[s * LDK + i] * Us[s * CB + j];
        Ss[e] = sij;
    }
}

// Chunked delta rule split over value columns: grid (hv, dv / CB), 256 threads. Column j of U and of
// the state depend only on column j of V (and on the chunk's K, Q, g, beta), so each block owns CB
// columns of one head and keeps that state slice in shared memory for the whole sequence. CB = DR_CB (16)
// by default: twice the blocks of CB = 32 (each recomputes the chunk's Gram matrices), pp520 on the H200
// 21.8k -> 25.8k tok/s with identical greedy tokens (docs/engines.md).
constexpr int DR_CB = 16;
template <int DCT, int CB>
__global__ __launch_bounds__(256) void delta_rule_cols_kernel(const float* qkv, int ld, int n, int hk, int hv, int dk,
                                                              int dv, const float* g, const float* beta, float* state,
                                                              float* out) {
    extern __shared__ float sm[];
    const int LDK = dk + 1, LDA = DCT + 1;
    float* Ss = sm;                    // [dk][CB]
    float* Ks = Ss + dk * CB;          // [DCT][LDK]
    float* Qs = Ks + DCT * LDK;        // [DCT][LDK]
    float* Us = Qs + DCT * LDK;        // [DCT][CB]
    float* Ws = Us + DCT * CB;         // [DCT][CB]  K S0
    float* QSs = Ws + DCT * CB;        // [DCT][CB]  Q S0
    float* A = QSs + DCT * CB;         // [DCT][LDA] beta_t (k_t.k_s) e^{gamma_t - gamma_s}, s < t
    float* B = A + DCT * LDA;          // [DCT][LDA] (q_t.k_s) e^{gamma_t - gamma_s}, s <= t
    float* gam = B + DCT * LDA;        // [DCT]
    float* bet = gam + DCT;            // [DCT]
    float* eg = bet + DCT;             // [DCT] e^{gamma_t}
    float* eL = eg + DCT;              // [DCT] e^{gamma_L - gamma_s}
    float* Vs = eL + DCT;              // [DCT][CB]
    const int h = blockIdx.x, c0 = blockIdx.y * CB, kh = h / (hv / hk), kd = hk * dk;
    const int tid = threadIdx.x;
    float* S = state + size_t(h) * dk * dv + c0;
    for (int e = tid; e < dk * CB; e += 256) Ss[e] = S[size_t(e / CB) * dv + e % CB];
    for (int t0 = 0; t0 < n; t0 += DCT) {
        const int L = min(DCT, n - t0);
        delta_stage_qk(qkv, ld, t0, L, dk, kh, kd, Qs, Ks);
        for (int e = tid; e < L * CB; e += 256)
            Vs[e] = qkv[size_t(t0 + e / CB) * ld + 2 * kd + size_t(h) * dv + c0 + e % CB];
        if (tid == 0) {
            float acc = 0;
            for (int t = 0; t < L; ++t) {
                acc += g[size_t(t0 + t) * hv + h];
                gam[t] = acc;
                bet[t] = beta[size_t(t0 + t) * hv + h];
                eg[t] = __expf(acc);
            }
            for (int t = 0; t < L; ++t) eL[t] = __expf(acc - gam[t]);
        }
        __syncthreads();
        for (int e = tid; e < L * L; e += 256) {
            const int t = e / L, s = e % L;
            if (s <= t) {
                float a = 0, b = 0;
                for (int i = 0; i < dk; ++i) {
                    const float ks = Ks[s * LDK + i];
                    a += Ks[t * LDK + i] * ks;
                    b += Qs[t * LDK + i] * ks;
                }
                const float d = __expf(gam[t] - gam[s]);
                A[t * LDA + s] = bet[t] * a * d;
                B[t * LDA + s] = b * d;
            }
        }
        for (int e = tid; e < L * CB; e += 256) {
            const int t = e / CB, j = e % CB;
            float a = 0, b = 0;
            for (int i = 0; i < dk; ++i) {
                const float sij = Ss[i * CB + j];
                a += Ks[t * LDK + i] * sij;
                b += Qs[t * LDK + i] * sij;
            }
            Ws[e] = a;
            QSs[e] = b;
        }
        __syncthreads();
        {   // forward substitution: LPC = 256 / CB consecutive lanes per column split the sum over s
            // (CB = 32: warp w owns columns 4w..4w+3, 8 lanes each)
            constexpr int LPC = 256 / CB;
            static_assert(LPC >= 1 && LPC <= 32 && 256 % CB == 0, "lanes per column");
            const int col = tid / LPC, sub = tid % LPC;
            for (int t = 0; t < L; ++t) {
                float part = 0;
                for (int s = sub; s < t; s += LPC) part += A[t * LDA + s] * Us[s * CB + col];
#pragma unroll
                for (int o = 1; o < LPC; o <<= 1) part += __shfl_xor_sync(0xffffffff, part, o);
                if (sub == 0) {
                    const float v = Vs[t * CB + col];
                    Us[t * CB + col] = bet[t] * v - bet[t] * eg[t] * Ws[t * CB + col] - part;
                }
                __syncwarp();
            }
        }
        __syncthreads();
        delta_chunk_finish<CB>(L, dk, eg, eL, QSs, B, LDA, Us, Ks, Ss, out + (size_t(t0) * hv + h) * dv + c0, hv * dv);
        __syncthreads();
    }
    for (int e = tid; e < dk * CB; e += 256) S[size_t(e / CB) * dv + e % CB] = Ss[e];
}
size_t delta_cols_smem(int dct, int dk, int cb) {
    return sizeof(float) * (size_t(dk) * cb + 2 * size_t(dct) * (dk + 1) + 3 * size_t(dct) * cb +
                            2 * size_t(dct) * (dct + 1) + 4 * size_t(dct) + size_t(dct) * cb);
}

// Chunked delta rule in two passes (the WY form). Everything a chunk needs that does not depend on the
// state - the decays, the Gram matrices and the inverse T = (I + A)^-1 that the forward substitution
// applies - is computed for all chunks at once by delta_chunk_prep_kernel (grid (chunks, hv)); the
// sequential pass, delta_rule_wy_kernel (grid (hv, dv / CB), as delta_rule_cols_kernel), is then left with
// products against its state slice: per chunk W = K S, QS = Q S, R = beta (v - e^gamma W), U = T R,
// out = e^gamma QS + B U, S = e^gamma_L S + sum_s e^(gamma_L - gamma_s) k_s U_s^T. Same math as
// delta_rule_cols_kernel (A, B, gamma as defined there); its 32-step forward substitution and the Gram
// matrices, recomputed by every column block of a head, leave the sequential chain.
// Chunk data layout, DR_PREP floats per (chunk, value head): T [DCT][DCT], B [DCT][DCT], e^gamma [DCT],
// e^(gamma_L - gamma) [DCT], beta [DCT].
template <int DCT>
__host__ __device__ constexpr int dr_prep_floats() { return 2 * DCT * DCT + 3 * DCT; }

template <int DCT>
__global__ __launch_bounds__(256) void delta_chunk_prep_kernel(const float* qkv, int ld, int n, int hk, int hv, int dk,
                                                               const float* g, const float* beta, float* prep) {
    static_assert(DCT <= 32 && 256 % DCT == 0, "one warp scans a chunk");
    extern __shared__ float sm[];
    const int LDK = dk + 1, LDA = DCT + 1;
    float* Ks = sm;                // [DCT][LDK], then T [DCT][LDA]
    float* Qs = Ks + DCT * LDK;    // [DCT][LDK]
    float* A = Qs + DCT * LDK;     // [DCT][LDA]
    float* gam = A + DCT * LDA;    // [DCT]
    float* bet = gam + DCT;        // [DCT]
    const int c = blockIdx.x, h = blockIdx.y, t0 = c * DCT, L = min(DCT, n - t0);
    const int kh = h / (hv / hk), kd = hk * dk, tid = threadIdx.x;
    delta_stage_qk(qkv, ld, t0, L, dk, kh, kd, Qs, Ks);
    if (tid < 32) {  // gamma: inclusive scan of g over the chunk
        float gv = tid < L ? g[size_t(t0 + tid) * hv + h] : 0.f;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float y = __shfl_up_sync(0xffffffffu, gv, o);
            if (tid >= o) gv += y;
        }
        if (tid < DCT) {
            gam[tid] = gv;
            bet[tid] = tid < L ? beta[size_t(t0 + tid) * hv + h] : 0.f;
        }
    }
    __syncthreads();
    float* T = prep + size_t(c * hv + h) * dr_prep_floats<DCT>();
    float* B = T + DCT * DCT;
    float* egp = B + DCT * DCT;
    float* eLp = egp + DCT;
    float* betp = eLp + DCT;
    for (int e = tid; e < L * L; e += 256) {
        const int t = e / L, s = e % L;
        float a = 0.f, b = 0.f;
        if (s <= t) {
            for (int i = 0; i < dk; ++i) {
                const float ks = Ks[s * LDK + i];
                a += Ks[t * LDK + i] * ks;
                b += Qs[t * LDK + i] * ks;
            }
            const float d = __expf(gam[t] - gam[s]);
            a *= bet[t] * d;
            b *= d;
        }
        A[t * LDA + s] = s < t ? a : 0.f;
        B[t * DCT + s] = b;
    }
    if (tid < L) {
        egp[tid] = __expf(gam[tid]);
        eLp[tid] = __expf(gam[L - 1] - gam[tid]);
        betp[tid] = bet[tid];
    }
    __syncthreads();
    {   // T = (I + A)^-1, unit lower triangular, column by column: T[t][j] = [t == j] - sum_{j<=s<t} A[t][s] T[s][j];
        // LPC consecutive lanes per column split the sum over s
        constexpr int LPC = 256 / DCT;
        float* Tm = Ks;  // K is no longer needed
        const int col = tid / LPC, sub = tid % LPC;
        for (int t = 0; t < L; ++t) {
            float part = 0.f;
            for (int s = col + sub; s < t; s += LPC) part += A[t * LDA + s] * Tm[s * LDA + col];
#pragma unroll
            for (int o = 1; o < LPC; o <<= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
            if (sub == 0) Tm[t * LDA + col] = t < col ? 0.f : t == col ? 1.f : -part;
            __syncwarp();
        }
        __syncthreads();
        for (int e = tid; e < L * L; e += 256) T[(e / L) * DCT + e % L] = Tm[(e / L) * LDA + e % L];
    }
}
size_t dr_prep_smem(int dct, int dk) { return sizeof(float) * (2 * size_t(dct) * (dk + 1) + size_t(dct) * (dct + 1) + 2 * size_t(dct)); }

template <int DCT, int CB>
__global__ __launch_bounds__(256) void delta_rule_wy_kernel(const float* qkv, int ld, int n, int hk, int hv, int dk,
                                                            int dv, const float* prep, float* state, float* out) {
    extern __shared__ float sm[];
    const int LDK = dk + 1;
    float* Ss = sm;                    // [dk][CB]
    float* Ks = Ss + dk * CB;          // [DCT][LDK]
    float* Qs = Ks + DCT * LDK;        // [DCT][LDK]
    float* Vs = Qs + DCT * LDK;        // [DCT][CB]
    float* Rs = Vs + DCT * CB;         // [DCT][CB]  beta (v - e^gamma K S)
    float* QSs = Rs + DCT * CB;        // [DCT][CB]  Q S
    float* Us = QSs + DCT * CB;        // [DCT][CB]  T R
    float* Cd = Us + DCT * CB;         // the chunk's prep data (T, B, e^gamma, e^(gamma_L - gamma), beta)
    constexpr int PF = dr_prep_floats<DCT>();
    const float* Tm = Cd;
    const float* Bm = Cd + DCT * DCT;
    const float* eg = Bm + DCT * DCT;
    const float* eL = eg + DCT;
    const float* bet = eL + DCT;
    const int h = blockIdx.x, c0 = blockIdx.y * CB, kh = h / (hv / hk), kd = hk * dk;
    const int tid = threadIdx.x;
    float* S = state + size_t(h) * dk * dv + c0;
    for (int e = tid; e < dk * CB; e += 256) Ss[e] = S[size_t(e / CB) * dv + e % CB];
    for (int t0 = 0, c = 0; t0 < n; t0 += DCT, ++c) {
        const int L = min(DCT, n - t0);
        delta_stage_qk(qkv, ld, t0, L, dk, kh, kd, Qs, Ks);
        for (int e = tid; e < L * CB; e += 256)
            Vs[e] = qkv[size_t(t0 + e / CB) * ld + 2 * kd + size_t(h) * dv + c0 + e % CB];
        const float4* src = (const float4*)(prep + size_t(c * hv + h) * PF);
        for (int e = tid; e < PF / 4; e += 256) ((float4*)Cd)[e] = src[e];
        __syncthreads();
        for (int e = tid; e < L * CB; e += 256) {
            const int t = e / CB, j = e % CB;
            float a = 0.f, b = 0.f;
            for (int i = 0; i < dk; ++i) {
                const float sij = Ss[i * CB + j];
                a += Ks[t * LDK + i] * sij;
                b += Qs[t * LDK + i] * sij;
            }
            Rs[e] = bet[t] * Vs[e] - bet[t] * eg[t] * a;
            QSs[e] = b;
        }
        __syncthreads();
        for (int e = tid; e < L * CB; e += 256) {
            const int t = e / CB, j = e % CB;
            float u = 0.f;
            for (int s = 0; s <= t; ++s) u += Tm[t * DCT + s] * Rs[s * CB + j];
            Us[e] = u;
        }
        __syncthreads();
        delta_chunk_finish<CB>(L, dk, eg, eL, QSs, Bm, DCT, Us, Ks, Ss, out + (size_t(t0) * hv + h) * dv + c0, hv * dv);
        __syncthreads();
    }
    for (int e = tid; e < dk * CB; e += 256) S[size_t(e / CB) * dv + e % CB] = Ss[e];
}
size_t dr_wy_smem(int dct, int dk, int cb) {
    return sizeof(float) * (size_t(dk) * cb + 2 * size_t(dct) * (dk + 1) + 4 * size_t(dct) * cb +
                            2 * size_t(dct) * dct + 3 * size_t(dct));
}

}  // namespace

void deltanet_prep(float* y, int ldy, const float* proj, int ldp, int b_off, const float* negA, const float* dt_bias,
                   int n, int hk, int dk, int hv, float* g, float* beta, gpuStream_t s) {
    deltanet_prep_kernel<<<dim3(n, 2 * hk + 1), 128, 0, s>>>(y, ldy, proj, ldp, b_off, negA, dt_bias, hk, dk, hv, g, beta);
}

void delta_rule(const float* qkv, int ld, int n, int hk, int hv, int dk, int dv, const float* g, const float* beta,
                float* state, float* out, gpuStream_t s) {
    const size_t smem = sizeof(float) * (2 * DC * dk + 3 * DC * dv + 2 * DC * DC + 2 * DC);
    // dv % 16, dk <= 256: the column-split kernels; other shapes the one-block-a-head kernel at the end
    if (dv % DR_CB == 0 && dk <= 256) {
        const int limit = smem_optin_limit();
        // the two-pass (WY) form, unless its chunk data cannot be allocated (during graph capture) or its
        // shared memory does not fit: then the one-pass column kernel
        const size_t sp = dr_prep_smem(32, dk), sw = dr_wy_smem(32, dk, DR_CB);
        const int chunks = (n + 31) / 32;
        float* prep = nullptr;
        if (sp <= size_t(limit) && sw <= size_t(limit) &&
            (prep = context().delta_prep.get(size_t(chunks) * hv * dr_prep_floats<32>(), s))) {
            launch_smem(delta_chunk_prep_kernel<32>, dim3(chunks, hv), dim3(256), sp, s, qkv, ld, n, hk, hv, dk, g, beta, prep);
            launch_smem(delta_rule_wy_kernel<32, DR_CB>, dim3(hv, dv / DR_CB), dim3(256), sw, s, qkv, ld, n, hk, hv, dk, dv,
                        prep, state, out);
            return;
        }
        const size_t s32 = delta_cols_smem(32, dk, DR_CB), s16 = delta_cols_smem(16, dk, DR_CB);
        const dim3 grid(hv, dv / DR_CB);
        auto go = [&](auto kernel, size_t smem_cols) {
            launch_smem(kernel, grid, dim3(256), smem_cols, s, qkv, ld, n, hk, hv, dk, dv, g, beta, state, out);
        };
        if (s32 <= size_t(limit)) return go(delta_rule_cols_kernel<32, DR_CB>, s32);
        if (s16 <= size_t(limit)) return go(delta_rule_cols_kernel<16, DR_CB>, s16);
    }
    launch_smem(delta_rule_kernel, dim3(hv), dim3(256), smem, s, qkv, ld, n, hk, hv, dk, dv, g, beta, state, out);
}

}  // namespace lb::gpu
