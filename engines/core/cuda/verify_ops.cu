// The verify operations (verify_ops.h): one kernel each, mirroring ../cpu/attention.cpp (tree form),
// ../cpu/conv1d.cpp (tree form and commit), ../cpu/delta_rule_tree.cpp, and the KV compaction of
// ../cpu/cpu_backend.cpp's commit. engines/tests/verify_kernels_check.cu checks each against its CPU
// reference on random inputs.
#include "verify_ops.h"

#include "attention_common.cuh"

#include <cmath>

namespace lb::gpu {
namespace {

// KV rows are read and written with common.cuh's kv_load / kv_store_warp, the attention prologue's own
// encoding, so a verify row holds the bytes an append forward would have written (quantised types too).

// Sum over the block (blockDim a multiple of the warp size, at most 1024 threads).
__device__ float block_sum(float v, float* red) {
    const int lane = threadIdx.x % LB_WARP, warp = threadIdx.x / LB_WARP, nw = blockDim.x / LB_WARP;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = 0;
    for (int i = 0; i < nw; ++i) t += red[i];
    return t;
}

// grid (n, nh + nkv): block (t, head) normalises and rotates one q or k head of row t; k blocks also store
// the row's K and V head in the caches.
__global__ void attn_prep_tree_kernel(float* qkv, int ld, int nh, int nkv, int hd, int gated, int rot, float theta,
                                      const float* q_gain, const float* k_gain, float eps, const int* positions,
                                      int len, void* kcache, DType kt, void* vcache, DType vt) {
    extern __shared__ float sh[];  // [hd] head, then reduction scratch
    float* red = sh + hd;
    const int t = blockIdx.x, head = blockIdx.y;
    const bool is_q = head < nh;
    const int q_rows = (gated ? 2 : 1) * nh * hd;
    float* row = qkv + size_t(t) * ld;
    float* x = is_q ? row + head * (gated ? 2 : 1) * hd : row + q_rows + (head - nh) * hd;
    const float* gain = is_q ? q_gain : k_gain;
    float ss = 0;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) { sh[i] = x[i]; ss += x[i] * x[i]; }
    ss = block_sum(ss, red);
    const float inv = 1.f / sqrtf(ss / hd + eps);
    for (int i = threadIdx.x; i < hd; i += blockDim.x) sh[i] = (sh[i] * inv) * gain[i];
    __syncthreads();
    const int half = rot / 2;
    const float pos = float(positions[t]);
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float inv_freq = 1.0f / powf(theta, float(2 * i) / float(rot));
        const float angle = pos * inv_freq;
        const float c = cosf(angle), s = sinf(angle);
        const float a = sh[i], b = sh[i + half];
        sh[i] = a * c - b * s;
        sh[i + half] = b * c + a * s;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < hd; i += blockDim.x) x[i] = sh[i];
    if (!is_q) {  // warp 0 encodes the K row, warp 1 the V row (a quantised block takes a whole warp)
        const int j = head - nh, warp = threadIdx.x / LB_WARP;
        const size_t slot = size_t(len + t) * nkv + j;
        const float* v = row + q_rows + nkv * hd + j * hd;
        if (warp == 0) kv_store_warp(sh, hd, kt, (char*)kcache + slot * kv_row_bytes(kt, hd));
        if (warp == 1) kv_store_warp(v, hd, vt, (char*)vcache + slot * kv_row_bytes(vt, hd));
    }
}

// 16 warps a block: a row's keys are walked one per warp at a time, so more warps hide more load latency.
constexpr int kAttnWarps = 16;
constexpr int kMaxPerLane = 16;  // head_dim up to 16 * warp size

// grid (n, nh), kAttnWarps warps: block (t, h) takes row t, head h over the committed keys and the tree rows
// visible to row t (attention_row_online_softmax), then the output gate.
__global__ void tree_attention_kernel(const float* qkv, int ld, int n, int nh, int nkv, int hd, int gated, int len,
                                      const void* kcache, DType kt, const void* vcache, DType vt,
                                      const unsigned char* visible, float* out) {
    __shared__ float m_s[kAttnWarps], l_s[kAttnWarps];
    extern __shared__ float acc_s[];  // [kAttnWarps, hd]
    const int t = blockIdx.x, h = blockIdx.y;
    const int kvh = h / (nh / nkv);
    const size_t krow = kv_row_bytes(kt, hd), vrow = kv_row_bytes(vt, hd);
    const float* gate = qkv + size_t(t) * ld + h * 2 * hd + hd;
    attention_row_online_softmax<kAttnWarps, kMaxPerLane>(
        qkv + size_t(t) * ld + h * (gated ? 2 : 1) * hd, hd, 0, len + n,
        [&](int key) { return key < len || visible[size_t(t) * n + (key - len)]; },
        [&](int key, int i) { return kv_load((const char*)kcache + (size_t(key) * nkv + kvh) * krow, kt, i); },
        [&](int key, int i) { return kv_load((const char*)vcache + (size_t(key) * nkv + kvh) * vrow, vt, i); }, m_s,
        l_s, acc_s, [&](int i, float o) {
            if (gated) o *= 1.f / (1.f + expf(-gate[i]));
            out[size_t(t) * nh * hd + size_t(h) * hd + i] = o;
        });
}

__device__ __forceinline__ float silu_f(float x) { return x / (1.f + expf(-x)); }

// Channel c of row t: SiLU of the causal conv along the row's ancestors.
__device__ __forceinline__ float conv_tree_at(const float* x, int ldx, int t, int c, int K, const float* w,
                                              const float* state, const int* parent) {
    // window, oldest first: ancestors' inputs (nearest last), then the state's newest slots before them
    float win[16];
    int r = t, j = K - 1;
    for (; j >= 0 && r >= 0; --j, r = parent[r]) win[j] = x[size_t(r) * ldx + c];
    for (int slot = K - 2; j >= 0; --j, --slot) win[j] = state[size_t(c) * (K - 1) + slot];
    float acc = 0;
    for (int i = 0; i < K; ++i) acc += w[size_t(c) * K + i] * win[i];
    return silu_f(acc);
}

__global__ void conv_tree_kernel(const float* x, int ldx, int n, int C, int K, const float* w, const float* state,
                                 const int* parent, float* y, float* keep) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (c >= C) return;
    y[size_t(t) * C + c] = conv_tree_at(x, ldx, t, c, K, w, state, parent);
    keep[size_t(t) * C + c] = x[size_t(t) * ldx + c];
}

// conv_tree_kernel and deltanet_prep_kernel (delta_rule.cu) in one launch: grid (n, 2 hk + vd / 128 rounded up
// + 1), 128 threads (deltanet_prep_kernel's: its block sums, so the same values). Blocks y < 2 hk take a q or k
// head (dk <= 256 channels): conv, then the head's L2 norm (q also scaled by dk^-1/2); then the v channels, 128 a
// block; the last block computes g and beta. Launch_dependents at once: delta_tree's fused kernel reads its
// state slice while this runs and waits for it before reading anything this writes.
constexpr int CTP_THREADS = 128;
__global__ void __launch_bounds__(CTP_THREADS) conv_tree_prep_kernel(
    const float* x, int ldx, int K, const float* w, const float* state, const int* parent, float* y, float* keep,
    int hk, int dk, int vd, int hv, int b_off, const float* negA, const float* dt_bias, float* g, float* beta) {
    griddep_launch();
    const int t = blockIdx.x, b = blockIdx.y, C = 2 * hk * dk + vd;
    const float* row = x + size_t(t) * ldx;
    if (b == int(gridDim.y) - 1) {
        for (int i = threadIdx.x; i < hv; i += CTP_THREADS) {
            const float a = row[b_off + hv + i] + dt_bias[i];
            beta[size_t(t) * hv + i] = sigmoidf(row[b_off + i]);
            g[size_t(t) * hv + i] = negA[i] * softplus(a);
        }
        return;
    }
    if (b < 2 * hk) {
        float v[2];
        float ss = 0;
#pragma unroll
        for (int m = 0; m < 2; ++m) {
            const int i = threadIdx.x + CTP_THREADS * m, c = b * dk + i;
            if (i < dk) {
                v[m] = conv_tree_at(x, ldx, t, c, K, w, state, parent);
                keep[size_t(t) * C + c] = row[c];
                ss += v[m] * v[m];
            }
        }
        float inv = rsqrtf(block_sum(ss) + 1e-6f);
        if (b < hk) inv *= rsqrtf(float(dk));
#pragma unroll
        for (int m = 0; m < 2; ++m) {
            const int i = threadIdx.x + CTP_THREADS * m;
            if (i < dk) y[size_t(t) * C + b * dk + i] = v[m] * inv;
        }
        return;
    }
    const int c = 2 * hk * dk + (b - 2 * hk) * CTP_THREADS + threadIdx.x;
    if (c >= C) return;
    y[size_t(t) * C + c] = conv_tree_at(x, ldx, t, c, K, w, state, parent);
    keep[size_t(t) * C + c] = row[c];
}

// One block per value head; thread j owns column j of the head's state and of every row's u and output.
__global__ void delta_tree_kernel(const float* qkv, int ld, int n, int hk, int hv, int dk, int dv, const float* g,
                                  const float* beta, const int* parent, const unsigned char* visible,
                                  const float* state, float* out, float* u, float* gamma, float* k_keep,
                                  float* scratch) {
    const int h = blockIdx.x, kh = h / (hv / hk), kd = hk * dk;
    const float* S = state + size_t(h) * dk * dv;
    // [n, n] each: A[t][s] = beta_t (k_t . k_s) e^{gamma_t - gamma_s} (s < t), B[t][s] = (q_t . k_s) e^{gamma_t - gamma_s}
    // (s <= t), for ancestor pairs, formed in parallel so that the per-column solve below is FMAs only
    float* A = scratch + size_t(h) * 2 * n * n;
    float* B = A + size_t(n) * n;
    auto Q = [&](int t) { return qkv + size_t(t) * ld + kh * dk; };
    auto Kr = [&](int t) { return qkv + size_t(t) * ld + kd + kh * dk; };
    auto G = [&](int t) { return gamma[size_t(t) * hv + h]; };
    if (threadIdx.x == 0)
        for (int t = 0; t < n; ++t)
            gamma[size_t(t) * hv + h] = (parent[t] >= 0 ? gamma[size_t(parent[t]) * hv + h] : 0.f) + g[size_t(t) * hv + h];
    if (h % (hv / hk) == 0)  // one value head per key head keeps the k copy
        for (int e = threadIdx.x; e < n * dk; e += blockDim.x) k_keep[size_t(e / dk) * kd + kh * dk + e % dk] = Kr(e / dk)[e % dk];
    __syncthreads();
    for (int p = threadIdx.x; p < n * n; p += blockDim.x) {
        const int t = p / n, s = p % n;
        if (s > t || !visible[size_t(t) * n + s]) continue;
        float a = 0, b = 0;
        for (int i = 0; i < dk; ++i) { a += Kr(t)[i] * Kr(s)[i]; b += Q(t)[i] * Kr(s)[i]; }
        const float decay = expf(G(t) - G(s));
        A[p] = beta[size_t(t) * hv + h] * a * decay;
        B[p] = b * decay;
    }
    __syncthreads();
    constexpr int T = 8;  // rows per pass over the state column
    for (int j = threadIdx.x; j < dv; j += blockDim.x) {
        for (int t0 = 0; t0 < n; t0 += T) {
            const int L = min(T, n - t0);
            float sk[T], sq[T];
            for (int r = 0; r < T; ++r) sk[r] = sq[r] = 0.f;
            for (int i = 0; i < dk; ++i) {
                const float sij = S[size_t(i) * dv + j];
                for (int r = 0; r < L; ++r) { sk[r] += sij * Kr(t0 + r)[i]; sq[r] += sij * Q(t0 + r)[i]; }
            }
            for (int r = 0; r < L; ++r) {
                const int t = t0 + r;
                const float bt = beta[size_t(t) * hv + h], eg = expf(G(t));
                u[(size_t(t) * hv + h) * dv + j] = bt * qkv[size_t(t) * ld + 2 * kd + h * dv + j] - bt * eg * sk[r];
                out[(size_t(t) * hv + h) * dv + j] = eg * sq[r];
            }
        }
        // forward substitution over each row's ancestors, then the outputs (column j only: no block sync)
        for (int t = 0; t < n; ++t) {
            float ut = u[(size_t(t) * hv + h) * dv + j];
            for (int s = 0; s < t; ++s)
                if (visible[size_t(t) * n + s]) ut -= A[size_t(t) * n + s] * u[(size_t(s) * hv + h) * dv + j];
            u[(size_t(t) * hv + h) * dv + j] = ut;
        }
        for (int t = 0; t < n; ++t) {
            float o = out[(size_t(t) * hv + h) * dv + j];
            for (int s = 0; s <= t; ++s)
                if (visible[size_t(t) * n + s]) o += B[size_t(t) * n + s] * u[(size_t(s) * hv + h) * dv + j];
            out[(size_t(t) * hv + h) * dv + j] = o;
        }
    }
}

// The split form of delta_tree_kernel (where the fused kernel below does not take the shape: dk % 32 != 0, or a tree
// too long for its shared memory), for dk % 16 == 0, dk <= 256, dv % 16 == 0: the rows' cumulative gates, the
// pair coefficients and the per-column solve as three kernels, the solve spread over hv * dv / 16 blocks
// instead of hv (the one-block-a-head kernel above leaves most of the GPU idle and is serial over rows).

// One thread per value head: gamma_t = gamma_parent + g_t, in row order (parents come first).
__global__ void delta_tree_gamma_kernel(int n, int hv, const float* g, const int* parent, float* gamma) {
    const int h = blockIdx.x * blockDim.x + threadIdx.x;
    if (h >= hv) return;
    for (int t = 0; t < n; ++t)
        gamma[size_t(t) * hv + h] = (parent[t] >= 0 ? gamma[size_t(parent[t]) * hv + h] : 0.f) + g[size_t(t) * hv + h];
}

// grid (n, hv), one warp per pair: row t of A and B (delta_tree_kernel's), zero outside the row's ancestors
// (so the solve sums without the mask), and the k copy for commit.
__global__ void delta_tree_pairs_kernel(const float* qkv, int ld, int n, int hk, int hv, int dk, const float* beta,
                                        const unsigned char* visible, const float* gamma, float* k_keep, float* scratch) {
    const int t = blockIdx.x, h = blockIdx.y, kh = h / (hv / hk), kd = hk * dk;
    const int lane = threadIdx.x % LB_WARP, warp = threadIdx.x / LB_WARP, nw = blockDim.x / LB_WARP;
    float* A = scratch + size_t(h) * 2 * n * n + size_t(t) * n;
    float* B = A + size_t(n) * n;
    const float* qt = qkv + size_t(t) * ld + kh * dk;
    const float* kt = qkv + size_t(t) * ld + kd + kh * dk;
    if (h % (hv / hk) == 0)  // one value head per key head keeps the k copy
        for (int i = threadIdx.x; i < dk; i += blockDim.x) k_keep[size_t(t) * kd + kh * dk + i] = kt[i];
    const float gt = gamma[size_t(t) * hv + h], bt = beta[size_t(t) * hv + h];
    for (int s = warp; s < n; s += nw) {
        if (s > t || !visible[size_t(t) * n + s]) {
            if (lane == 0) { A[s] = 0.f; B[s] = 0.f; }
            continue;
        }
        const float* ks = qkv + size_t(s) * ld + kd + kh * dk;
        float a = 0, b = 0;
        for (int i = lane; i < dk; i += LB_WARP) { a += kt[i] * ks[i]; b += qt[i] * ks[i]; }
        a = warp_sum(a);
        b = warp_sum(b);
        if (lane == 0) {
            const float decay = expf(gt - gamma[size_t(s) * hv + h]);
            A[s] = s < t ? bt * a * decay : 0.f;
            B[s] = b * decay;
        }
    }
}

// grid (hv, dv / 16), 256 threads: 16 columns a block, 16 lanes a column. Rows in order: lane l holds state
// rows i = l + 16 m of its column; S^T k_t and S^T q_t are summed over the 16 lanes, then
//   u_t = beta_t v_t - beta_t e^{gamma_t} S^T k_t - sum_{s < t} A[t][s] u_s
//   o_t = e^{gamma_t} S^T q_t + sum_{s <= t} B[t][s] u_s
// with the sums over s split across the lanes (lane l takes s = l mod 16, and keeps those u_s: it wrote them).
constexpr int DT_LANES = 16;
__global__ void __launch_bounds__(256) delta_tree_cols_kernel(const float* qkv, int ld, int n, int hk, int hv, int dk,
                                                              int dv, const float* beta, const float* gamma,
                                                              const float* state, const float* scratch, float* out,
                                                              float* u) {
    const int h = blockIdx.x, kh = h / (hv / hk), kd = hk * dk;
    const int lane = threadIdx.x % DT_LANES, j = blockIdx.y * (256 / DT_LANES) + threadIdx.x / DT_LANES;
    const int per = dk / DT_LANES;  // <= 16
    const float* A = scratch + size_t(h) * 2 * n * n;
    const float* B = A + size_t(n) * n;
    float sr[256 / DT_LANES];
    for (int m = 0; m < 256 / DT_LANES; ++m)
        sr[m] = m < per ? state[(size_t(h) * dk + lane + DT_LANES * m) * dv + j] : 0.f;
    auto group_sum = [&](float v) {
        for (int o = DT_LANES / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
        return v;
    };
    for (int t = 0; t < n; ++t) {
        const float* qt = qkv + size_t(t) * ld + kh * dk;
        const float* kt = qkv + size_t(t) * ld + kd + kh * dk;
        float sk = 0, sq = 0;
        for (int m = 0; m < per; ++m) {
            const int i = lane + DT_LANES * m;
            sk += sr[m] * kt[i];
            sq += sr[m] * qt[i];
        }
        sk = group_sum(sk);
        sq = group_sum(sq);
        const float bt = beta[size_t(t) * hv + h], eg = expf(gamma[size_t(t) * hv + h]);
        float sub = 0;
        for (int s = lane; s < t; s += DT_LANES) sub += A[size_t(t) * n + s] * u[(size_t(s) * hv + h) * dv + j];
        const float ut = bt * qkv[size_t(t) * ld + 2 * kd + h * dv + j] - bt * eg * sk - group_sum(sub);
        if (lane == t % DT_LANES) u[(size_t(t) * hv + h) * dv + j] = ut;
        float acc = lane == t % DT_LANES ? B[size_t(t) * n + t] * ut : 0.f;
        for (int s = lane; s < t; s += DT_LANES) acc += B[size_t(t) * n + s] * u[(size_t(s) * hv + h) * dv + j];
        acc = group_sum(acc);
        if (lane == 0) out[(size_t(t) * hv + h) * dv + j] = eg * sq + acc;
    }
}

// The fused form, for dk % 32 == 0, dk <= 256, dv % 16 == 0 (every Qwen3.5 shape) while its shared memory
// fits: one kernel, grid (hv, dv / 16), 128 threads; block (h, c) owns state columns 16c .. 16c + 15 of value
// head h, 8 lanes a column. The split kernels above walk the rows one after another with every step's loads
// from global memory (a chain of dependent L2 round trips a row: 52 us a 27B layer at 23 rows, and a single
// block for the gates); here every global load is issued at once up front and the rest runs in shared memory:
//   1. stage S0's 16 columns, the key head's k and q rows, v's 16 columns, g, beta and the ancestor mask;
//   2. gamma_t = the sum of g over t's ancestors and t in row order (the CPU's gamma_parent + g_t, the same
//      additions in the same order); the ancestor pairs (s, t), s <= t, listed row by row, s ascending;
//   3. the pair coefficients A[t][s], B[t][s] (16 groups of 8 lanes, a row's k and q held while its
//      ancestors' k are read) and, independent of them, S0^T k_t and S0^T q_t for every row (a lane holds
//      dk / 8 state rows of its column; an 8-lane sum);
//   4. the forward substitution u_t = beta_t v_t - beta_t e^{gamma_t} S0^T k_t - sum_{s anc t} A[t][s] u_s
//      (a thread a column, rows in order, only the ancestors' terms: a row costs its depth, not t);
//   5. o_t = e^{gamma_t} S0^T q_t + sum_{s anc-or-self t} B[t][s] u_s, every (t, column) at once.
// The redundant work (each of the dv / 16 column blocks of a head, and the hv / hk heads of a key head,
// form the same pairs) is a few KB of shared-memory reads; it buys the absence of a second launch and of a
// global round trip between them. Sums in a fixed order: identical run to run.
constexpr int DTF_COLS = 16, DTF_LANES = 8, DTF_THREADS = DTF_COLS * DTF_LANES;
constexpr int DTF_SLD = DTF_COLS + 1;  // the staged state's row stride: lanes of a column hit distinct banks

size_t delta_tree_fused_smem(int n, int dk) {
    const size_t N = size_t(n), P = N * (N + 1) / 2;
    return sizeof(float) * (2 * N * dk + size_t(dk) * DTF_SLD + 4 * N * DTF_COLS + 4 * N + 2 * P) +
           sizeof(int) * (P + 2 * N + 1) + N * N;
}

__global__ void __launch_bounds__(DTF_THREADS) delta_tree_fused_kernel(
    const float* qkv, int ld, int n, int hk, int hv, int dk, int dv, const float* g, const float* beta,
    const unsigned char* visible, const float* state, float* out, float* u, float* gamma, float* k_keep) {
    extern __shared__ __align__(16) float sm[];  // k and q rows are read as float4
    const int P = n * (n + 1) / 2;
    float* Ks = sm;                       // [n][dk]
    float* Qs = Ks + n * dk;              // [n][dk]
    float* Ss = Qs + n * dk;              // [dk][DTF_SLD]  S0's columns c0 ..
    float* Vs = Ss + dk * DTF_SLD;        // [n][16]
    float* Rs = Vs + n * DTF_COLS;        // [n][16]  beta (v - e^gamma S0^T k)
    float* QSs = Rs + n * DTF_COLS;       // [n][16]  S0^T q
    float* Us = QSs + n * DTF_COLS;       // [n][16]
    float* gin = Us + n * DTF_COLS;       // [n] g of this head
    float* gam = gin + n;                 // [n]
    float* eg = gam + n;                  // [n] e^gamma
    float* bet = eg + n;                  // [n]
    float* pa = bet + n;                  // [P] A of pair p (0 for s = t)
    float* pb = pa + P;                   // [P] B of pair p
    int* ps = (int*)(pb + P);             // [P] s of pair p
    int* cnt = ps + P;                    // [n] pairs of row t
    int* off = cnt + n;                   // [n + 1] row t's pairs: off[t] .. off[t + 1] - 1, the last one s = t
    unsigned char* vis = (unsigned char*)(off + n + 1);  // [n][n]
    const int h = blockIdx.x, c0 = blockIdx.y * DTF_COLS, kh = h / (hv / hk), kd = hk * dk, tid = threadIdx.x;
    // the state was written by an earlier forward's commit: read before the wait for the kernel before
    for (int e = tid; e < dk * DTF_COLS; e += DTF_THREADS)
        Ss[(e / DTF_COLS) * DTF_SLD + e % DTF_COLS] = state[(size_t(h) * dk + e / DTF_COLS) * dv + c0 + e % DTF_COLS];
    griddep_wait();
    for (int e = tid; e < n * dk; e += DTF_THREADS) {
        const float* row = qkv + size_t(e / dk) * ld + kh * dk + e % dk;
        Qs[e] = row[0];
        Ks[e] = row[kd];
    }
    for (int e = tid; e < n * DTF_COLS; e += DTF_THREADS)
        Vs[e] = qkv[size_t(e / DTF_COLS) * ld + 2 * kd + size_t(h) * dv + c0 + e % DTF_COLS];
    for (int e = tid; e < n * n; e += DTF_THREADS) vis[e] = visible[e];
    for (int t = tid; t < n; t += DTF_THREADS) {
        gin[t] = g[size_t(t) * hv + h];
        bet[t] = beta[size_t(t) * hv + h];
    }
    __syncthreads();
    if (blockIdx.y == 0 && h % (hv / hk) == 0)  // one block per key head keeps the k copy
        for (int e = tid; e < n * dk; e += DTF_THREADS) k_keep[size_t(e / dk) * kd + kh * dk + e % dk] = Ks[e];
    for (int t = tid; t < n; t += DTF_THREADS) {
        float acc = 0.f;
        int c = 0;
        for (int s = 0; s <= t; ++s)
            if (vis[t * n + s]) { acc += gin[s]; ++c; }
        gam[t] = acc;
        eg[t] = expf(acc);
        cnt[t] = c;
        if (blockIdx.y == 0) gamma[size_t(t) * hv + h] = acc;
    }
    __syncthreads();
    if (tid < LB_WARP) {  // off: exclusive prefix of cnt, a contiguous range of rows a lane
        const int per = (n + LB_WARP - 1) / LB_WARP, a = min(n, tid * per), b = min(n, a + per);
        int local = 0;
        for (int t = a; t < b; ++t) local += cnt[t];
        int incl = local;
        for (int o = 1; o < LB_WARP; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, incl, o);
            if (tid >= o) incl += y;
        }
        int run = incl - local;
        for (int t = a; t < b; ++t) { off[t] = run; run += cnt[t]; }
        if (tid == LB_WARP - 1) off[n] = incl;
    }
    __syncthreads();
    for (int t = tid; t < n; t += DTF_THREADS) {
        int p = off[t];
        for (int s = 0; s <= t; ++s)
            if (vis[t * n + s]) ps[p++] = s;
    }
    __syncthreads();
    const int sub = tid % DTF_LANES, grp = tid / DTF_LANES, np = dk / 32;  // lane sub: elements 32m + 4 sub + e
    // the 8 lanes of a group (groups of one warp take rows with different pair counts: the group's mask)
    const unsigned gmask = 0xffu << ((tid % 32) & ~(DTF_LANES - 1));
    auto lanes_sum = [gmask](float v) {
#pragma unroll
        for (int o = DTF_LANES / 2; o > 0; o >>= 1) v += __shfl_xor_sync(gmask, v, o, DTF_LANES);
        return v;
    };
    // 3a. pair coefficients: group grp takes rows grp, grp + 16, ...
    for (int t = grp; t < n; t += DTF_THREADS / DTF_LANES) {
        float kt[32], qt[32];
#pragma unroll
        for (int m = 0; m < 8; ++m)
            if (m < np) {
                const float4 a = *(const float4*)&Ks[t * dk + 32 * m + 4 * sub];
                const float4 b = *(const float4*)&Qs[t * dk + 32 * m + 4 * sub];
                kt[4 * m] = a.x; kt[4 * m + 1] = a.y; kt[4 * m + 2] = a.z; kt[4 * m + 3] = a.w;
                qt[4 * m] = b.x; qt[4 * m + 1] = b.y; qt[4 * m + 2] = b.z; qt[4 * m + 3] = b.w;
            }
        for (int p = off[t]; p < off[t + 1]; ++p) {
            const int s = ps[p];
            float kk = 0.f, qk = 0.f;
#pragma unroll
            for (int m = 0; m < 8; ++m)
                if (m < np) {
                    const float4 a = *(const float4*)&Ks[s * dk + 32 * m + 4 * sub];
                    kk += kt[4 * m] * a.x + kt[4 * m + 1] * a.y + kt[4 * m + 2] * a.z + kt[4 * m + 3] * a.w;
                    qk += qt[4 * m] * a.x + qt[4 * m + 1] * a.y + qt[4 * m + 2] * a.z + qt[4 * m + 3] * a.w;
                }
            kk = lanes_sum(kk);
            qk = lanes_sum(qk);
            if (sub == 0) {
                const float d = expf(gam[t] - gam[s]);
                pa[p] = s < t ? bet[t] * kk * d : 0.f;
                pb[p] = qk * d;
            }
        }
    }
    // 3b. S0^T k_t, S0^T q_t: lane sub of column grp holds S0 rows 32m + 4 sub + e; 8 rows at a time, their
    // 8-lane sums reduce-scattered (7 exchanges for 8 sums, not 24) so that lane sub ends with row t0 + sub's
    {
        float sr[32];
#pragma unroll
        for (int m = 0; m < 8; ++m)
#pragma unroll
            for (int e = 0; e < 4; ++e) sr[4 * m + e] = m < np ? Ss[(32 * m + 4 * sub + e) * DTF_SLD + grp] : 0.f;
        for (int t0 = 0; t0 < n; t0 += DTF_LANES) {
            float sk[DTF_LANES], sq[DTF_LANES];
#pragma unroll
            for (int r = 0; r < DTF_LANES; ++r) {
                const int t = min(t0 + r, n - 1);  // rows past n: any row, its sums unused
                float a = 0.f, b = 0.f;
#pragma unroll
                for (int m = 0; m < 8; ++m)
                    if (m < np) {
                        const float4 kv = *(const float4*)&Ks[t * dk + 32 * m + 4 * sub];
                        const float4 qv = *(const float4*)&Qs[t * dk + 32 * m + 4 * sub];
                        a += sr[4 * m] * kv.x + sr[4 * m + 1] * kv.y + sr[4 * m + 2] * kv.z + sr[4 * m + 3] * kv.w;
                        b += sr[4 * m] * qv.x + sr[4 * m + 1] * qv.y + sr[4 * m + 2] * qv.z + sr[4 * m + 3] * qv.w;
                    }
                sk[r] = a;
                sq[r] = b;
            }
#pragma unroll
            for (int o = DTF_LANES / 2; o > 0; o >>= 1) {
                const bool up = sub & o;  // keep the upper half of the o * 2 sums, send the lower
#pragma unroll
                for (int i = 0; i < o; ++i) {
                    const float ks = up ? sk[i] : sk[i + o], qs = up ? sq[i] : sq[i + o];
                    const float kk = up ? sk[i + o] : sk[i], qk = up ? sq[i + o] : sq[i];
                    sk[i] = kk + __shfl_xor_sync(gmask, ks, o, DTF_LANES);
                    sq[i] = qk + __shfl_xor_sync(gmask, qs, o, DTF_LANES);
                }
            }
            const int t = t0 + sub;
            if (t < n) {
                Rs[t * DTF_COLS + grp] = bet[t] * Vs[t * DTF_COLS + grp] - bet[t] * eg[t] * sk[0];
                QSs[t * DTF_COLS + grp] = sq[0];
            }
        }
    }
    __syncthreads();
    // 4. forward substitution, a thread a column (the pair list's last entry of a row is the row itself)
    if (tid < DTF_COLS) {
        for (int t = 0; t < n; ++t) {
            float ut = Rs[t * DTF_COLS + tid];
#pragma unroll 4
            for (int p = off[t]; p < off[t + 1] - 1; ++p) ut -= pa[p] * Us[ps[p] * DTF_COLS + tid];
            Us[t * DTF_COLS + tid] = ut;
        }
    }
    __syncthreads();
    // 5. outputs and u for commit
    for (int e = tid; e < n * DTF_COLS; e += DTF_THREADS) {
        const int t = e / DTF_COLS, j = e % DTF_COLS;
        float o = eg[t] * QSs[e];
#pragma unroll 4
        for (int p = off[t]; p < off[t + 1]; ++p) o += pb[p] * Us[ps[p] * DTF_COLS + j];
        const size_t at = (size_t(t) * hv + h) * dv + c0 + j;
        out[at] = o;
        u[at] = Us[e];
    }
}

// The commit of up to kCommitLayers layers (DeltaCommitLayers), grid (delta_blocks + conv blocks, layers):
//  * block x < delta_blocks: rows i0 .. i0 + R - 1 of one head's state (dk / R blocks a head), as
//      S[i][j] = e^{gamma_a} S[i][j] + sum over the path, in order, of (k_s[i] e^{gamma_a - gamma_s}) u_s[j]
//    (the R rows share each u_s[j] load and decay);
//  * the others: the conv state's window shift (the last K - 1 inputs) for blockDim channels each.
template <int R>
__global__ void delta_conv_commit_kernel(DeltaCommitLayers L, int hk, int hv, int dk, int dv, int C, int K,
                                         const int* path, int m, int delta_blocks) {
    const int l = blockIdx.y;
    if (int(blockIdx.x) < delta_blocks) {
        const int groups = dk / R, h = blockIdx.x / groups, i0 = (blockIdx.x % groups) * R, kh = h / (hv / hk);
        const float* k = L.k[l];
        const float* u = L.u[l];
        const float* gamma = L.gamma[l];
        const int a = path[m - 1];
        const float ga = gamma[size_t(a) * hv + h], el = expf(ga);
        float* S = L.state[l] + (size_t(h) * dk + i0) * dv;
        for (int j = threadIdx.x; j < dv; j += blockDim.x) {
            float sv[R];
#pragma unroll
            for (int r = 0; r < R; ++r) sv[r] = S[size_t(r) * dv + j] * el;
            for (int p = 0; p < m; ++p) {
                const int s = path[p];
                const float d = expf(ga - gamma[size_t(s) * hv + h]);
                const float uj = u[(size_t(s) * hv + h) * dv + j];
                const float* ks = k + size_t(s) * hk * dk + kh * dk + i0;
#pragma unroll
                for (int r = 0; r < R; ++r) sv[r] += (ks[r] * d) * uj;
            }
#pragma unroll
            for (int r = 0; r < R; ++r) S[size_t(r) * dv + j] = sv[r];
        }
        return;
    }
    const int c = (blockIdx.x - delta_blocks) * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const float* keep = L.conv_keep[l];
    float* state = L.conv_state[l];
    float win[32];  // K - 1 old inputs + at most K - 1 of the path
    for (int j = 0; j < K - 1; ++j) win[j] = state[size_t(c) * (K - 1) + j];
    const int first = max(0, m - (K - 1));  // only the path's last K-1 inputs can survive
    int len = K - 1;
    for (int p = first; p < m; ++p) win[len++] = keep[size_t(path[p]) * C + c];
    for (int j = 0; j < K - 1; ++j) state[size_t(c) * (K - 1) + j] = win[len - (K - 1) + j];
}

// One block of kArgmaxThreads a row. A row is the vocabulary (248,320 logits, ~1 MB for the 27B): a thread
// keeps four float4 loads in flight (the earlier 256-thread scalar loop took 383 us for 23 rows on an H100, its
// loads serialised behind the compare chain). A thread's indices ascend (i, i + T, ... and x..w within a
// float4), so strict > keeps the lowest index of a tie, as cpu::argmax; the warps' results merge the same way.
constexpr int kArgmaxThreads = 1024, kArgmaxUnroll = 4;
__global__ __launch_bounds__(kArgmaxThreads) void argmax_rows_kernel(const float* logits, int vocab, int* out) {
    __shared__ float best_v[kArgmaxThreads / 32];
    __shared__ int best_i[kArgmaxThreads / 32];
    const float* x = logits + size_t(blockIdx.x) * vocab;
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    auto take = [&](float v, int i) {
        if (v > bv) { bv = v; bi = i; }
    };
    int tail = 0;
    if (vocab % 4 == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0) {
        const float4* x4 = reinterpret_cast<const float4*>(x);
        const int n4 = vocab / 4, T = blockDim.x;
        int i = threadIdx.x;
        for (; i + (kArgmaxUnroll - 1) * T < n4; i += kArgmaxUnroll * T) {
            float4 v[kArgmaxUnroll];
#pragma unroll
            for (int u = 0; u < kArgmaxUnroll; ++u) v[u] = x4[i + u * T];
#pragma unroll
            for (int u = 0; u < kArgmaxUnroll; ++u) {
                const int b = 4 * (i + u * T);
                take(v[u].x, b), take(v[u].y, b + 1), take(v[u].z, b + 2), take(v[u].w, b + 3);
            }
        }
        for (; i < n4; i += T) {
            const float4 v = x4[i];
            take(v.x, 4 * i), take(v.y, 4 * i + 1), take(v.z, 4 * i + 2), take(v.w, 4 * i + 3);
        }
        tail = vocab;
    }
    for (int i = tail + threadIdx.x; i < vocab; i += blockDim.x) take(x[i], i);
    for (int o = LB_WARP / 2; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffff, bv, o);
        const int oi = __shfl_xor_sync(0xffffffff, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    const int lane = threadIdx.x % LB_WARP, warp = threadIdx.x / LB_WARP;
    if (lane == 0) { best_v[warp] = bv; best_i[warp] = bi; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < int(blockDim.x / LB_WARP); ++w)
            if (best_v[w] > bv || (best_v[w] == bv && best_i[w] < bi)) { bv = best_v[w]; bi = best_i[w]; }
        out[blockIdx.x] = bi;
    }
}

// One block a cache (KvCompactLayers): rows in order, so that a row is read before a later row's move
// overwrites it; 16 bytes a thread where the rows allow.
__global__ void kv_compact_kernel(KvCompactLayers L, int len, const int* path, int m) {
    unsigned char* cache = (unsigned char*)L.cache[blockIdx.x];
    const size_t row_bytes = L.row_bytes[blockIdx.x];
    const bool vec = row_bytes % 16 == 0 && (uintptr_t(cache) & 15) == 0;
    for (int i = 0; i < m; ++i) {
        const int from = len + path[i], to = len + i;
        if (from != to) {
            if (vec) {
                const uint4* src = (const uint4*)(cache + size_t(from) * row_bytes);
                uint4* dst = (uint4*)(cache + size_t(to) * row_bytes);
                for (size_t b = threadIdx.x; b < row_bytes / 16; b += blockDim.x) dst[b] = src[b];
            } else {
                for (size_t b = threadIdx.x; b < row_bytes; b += blockDim.x)
                    cache[size_t(to) * row_bytes + b] = cache[size_t(from) * row_bytes + b];
            }
        }
        __syncthreads();
    }
}

// Threads for a block that loops over n columns: n rounded up to whole warps, at most 256.
int threads_for(int n) { return n >= 256 ? 256 : ((n + LB_WARP - 1) / LB_WARP) * LB_WARP; }

}  // namespace

void attn_prep_tree(float* qkv, int ld, int n, int nh, int nkv, int hd, bool gated, int rot, float theta,
                    const float* q_gain, const float* k_gain, float eps, const int* positions, int len, void* kcache,
                    DType kt, void* vcache, DType vt, gpuStream_t s) {
    const int threads = hd >= 128 ? 128 : 2 * LB_WARP;  // at least two warps: K and V rows are stored by one each
    attn_prep_tree_kernel<<<dim3(n, nh + nkv), threads, sizeof(float) * (hd + 32), s>>>(
        qkv, ld, nh, nkv, hd, gated, rot, theta, q_gain, k_gain, eps, positions, len, kcache, kt, vcache, vt);
}

void tree_attention(const float* qkv, int ld, int n, int nh, int nkv, int hd, bool gated, int len,
                    const void* kcache, DType kt, const void* vcache, DType vt, const unsigned char* visible,
                    float* out, gpuStream_t s) {
    if (hd > kMaxPerLane * LB_WARP) lb::fail("unsupported", "tree attention: head_dim above 16 x the warp size");
    tree_attention_kernel<<<dim3(n, nh), kAttnWarps * LB_WARP, sizeof(float) * kAttnWarps * hd, s>>>(
        qkv, ld, n, nh, nkv, hd, gated, len, kcache, kt, vcache, vt, visible, out);
}

void conv_tree(const float* x, int ldx, int n, int C, int K, const float* w, const float* state, const int* parent,
               float* y, float* keep, gpuStream_t s) {
    if (K > 16) lb::fail("unsupported", "conv kernel wider than 16");
    conv_tree_kernel<<<dim3((C + 127) / 128, n), 128, 0, s>>>(x, ldx, n, C, K, w, state, parent, y, keep);
}

void conv_tree_prep(const float* x, int ldx, int n, int K, const float* w, const float* state, const int* parent,
                    float* y, float* keep, int hk, int dk, int hv, int dv, int b_off, const float* negA,
                    const float* dt_bias, float* g, float* beta, gpuStream_t s) {
    const int C = 2 * hk * dk + hv * dv;
    if (K <= 16 && dk <= 2 * CTP_THREADS) {
        const dim3 grid(n, 2 * hk + (hv * dv + CTP_THREADS - 1) / CTP_THREADS + 1);
        conv_tree_prep_kernel<<<grid, CTP_THREADS, 0, s>>>(x, ldx, K, w, state, parent, y, keep, hk, dk, hv * dv, hv,
                                                           b_off, negA, dt_bias, g, beta);
        return;
    }
    conv_tree(x, ldx, n, C, K, w, state, parent, y, keep, s);
    deltanet_prep(y, C, x, ldx, b_off, negA, dt_bias, n, hk, dk, hv, g, beta, s);
}

size_t delta_tree_scratch(int n, int hv) { return size_t(hv) * 2 * n * n; }

void delta_tree(const float* qkv, int ld, int n, int hk, int hv, int dk, int dv, const float* g, const float* beta,
                const int* parent, const unsigned char* visible, const float* state, float* out, float* u,
                float* gamma, float* k_keep, float* scratch, gpuStream_t s, DeltaTreeKernel kernel) {
    using K = DeltaTreeKernel;
    const size_t fused_smem = delta_tree_fused_smem(n, dk);
    const bool fused_ok = dk % 32 == 0 && dk <= 256 && dv % DTF_COLS == 0 && fused_smem <= size_t(smem_optin_limit());
    const bool split_ok = dk % DT_LANES == 0 && dk <= 256 && dv % (256 / DT_LANES) == 0;
    if ((kernel == K::Fused && !fused_ok) || (kernel == K::Split && !split_ok))
        lb::fail("unsupported", "delta_tree: the named kernel does not take this shape");
    if (fused_ok && (kernel == K::Auto || kernel == K::Fused)) {
        const dim3 grid(hv, dv / DTF_COLS), block(DTF_THREADS);
        // up to the default 48 KB (dk 128: to 26 rows): with programmatic dependent launch, so that
        // the state slice is read while the kernel before finishes
        if (fused_smem <= 48 * 1024)
            launch_k(delta_tree_fused_kernel, grid, block, fused_smem, s, qkv, ld, n, hk, hv, dk, dv, g, beta, visible,
                     state, out, u, gamma, k_keep);
        else
            launch_smem(delta_tree_fused_kernel, grid, block, fused_smem, s, qkv, ld, n, hk, hv, dk, dv, g, beta,
                        visible, state, out, u, gamma, k_keep);
        return;
    }
    if (split_ok && (kernel == K::Auto || kernel == K::Split)) {
        delta_tree_gamma_kernel<<<(hv + 127) / 128, 128, 0, s>>>(n, hv, g, parent, gamma);
        delta_tree_pairs_kernel<<<dim3(n, hv), 128, 0, s>>>(qkv, ld, n, hk, hv, dk, beta, visible, gamma, k_keep, scratch);
        delta_tree_cols_kernel<<<dim3(hv, dv / (256 / DT_LANES)), 256, 0, s>>>(qkv, ld, n, hk, hv, dk, dv, beta, gamma,
                                                                             state, scratch, out, u);
        return;
    }
    delta_tree_kernel<<<hv, threads_for(dv), 0, s>>>(qkv, ld, n, hk, hv, dk, dv, g, beta, parent, visible, state, out,
                                                      u, gamma, k_keep, scratch);
}

void delta_conv_commit(const DeltaCommitLayers& L, int hk, int hv, int dk, int dv, int C, int K, const int* path,
                       int m, gpuStream_t s) {
    if (m == 0 || L.count == 0) return;
    if (L.count > kCommitLayers) lb::fail("internal", "delta_conv_commit: more layers than kCommitLayers");
    if (C > 0 && K > 16) lb::fail("unsupported", "conv kernel wider than 16");
    constexpr int threads = 128;
    const bool rows8 = dk % 8 == 0;
    const int delta_blocks = hv > 0 ? hv * (rows8 ? dk / 8 : dk) : 0;
    const int conv_blocks = (C + threads - 1) / threads;
    const dim3 grid(unsigned(delta_blocks + conv_blocks), unsigned(L.count));
    if (rows8) delta_conv_commit_kernel<8><<<grid, threads, 0, s>>>(L, hk, hv, dk, dv, C, K, path, m, delta_blocks);
    else delta_conv_commit_kernel<1><<<grid, threads, 0, s>>>(L, hk, hv, dk, dv, C, K, path, m, delta_blocks);
}

void argmax_rows(const float* logits, int n, int vocab, int* out, gpuStream_t s) {
    argmax_rows_kernel<<<n, kArgmaxThreads, 0, s>>>(logits, vocab, out);
}

void kv_compact(const KvCompactLayers& L, int len, const int* path, int m, gpuStream_t s) {
    if (m == 0 || L.count == 0) return;
    if (L.count > kCommitLayers) lb::fail("internal", "kv_compact: more caches than kCommitLayers");
    kv_compact_kernel<<<unsigned(L.count), 128, 0, s>>>(L, len, path, m);
}

}  // namespace lb::gpu
