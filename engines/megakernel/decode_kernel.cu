// The persistent decode kernel (see decode_kernel.cuh for the plan). The reference for every stage is
// the core's CPU backend (core/cpu/), the same math the multi-kernel CUDA backend runs one kernel at a time.
#include "decode_kernel.cuh"

namespace lb::mk {
namespace {

// ----------------------------------------------------------------------------------------- memory helpers

__device__ __forceinline__ uint4 ldw(const void* p) {  // weights: 16 B, read-only path, no L1 allocation
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}
__device__ __forceinline__ float ldg(const float* p) { return __ldcg(p); }       // written by other blocks
__device__ __forceinline__ uint4 ldg4(const void* p) { return __ldcg((const uint4*)p); }
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void prefetch_line(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }
// Line by line, for ranges of any alignment.
__device__ __forceinline__ void prefetch_lines(const void* p, size_t bytes) {
    const uintptr_t a = uintptr_t(p) & ~uintptr_t(127), e = uintptr_t(p) + bytes;
    for (uintptr_t line = a + uintptr_t(threadIdx.x) * 128; line < e; line += uintptr_t(NT) * 128)
        prefetch_line((const void*)line);
}

// The whole block asks L2 for [p, p + bytes). p and bytes are multiples of 16 (rows of K % 8 == 0 weights).
__device__ __forceinline__ void prefetch_range(const void* p, size_t bytes) {
    if (bytes == 0) return;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr size_t CH = 16384;
    const char* base = (const char*)p;
    for (size_t off = size_t(threadIdx.x) * CH; off < bytes; off += size_t(NT) * CH) {
        const unsigned n = unsigned(bytes - off < CH ? bytes - off : CH);
        asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(base + off), "r"(n) : "memory");
    }
#else
    prefetch_lines(p, bytes);
#endif
}

// Per-lane private staging of weight vectors in shared memory (sm_80+): cp.async copies issued before a
// grid barrier land while the block waits; the same lane reads them back after cp.async.wait_all, so no
// block-level synchronisation is needed. Slot q of a lane lives at slots[q * NT] (conflict-free).
struct Slots {
    uint4* p;    // this lane's slot 0
    int n;       // slots per lane (0: staging off)
    int staged;  // slots filled for the stage about to run
};
__device__ __forceinline__ void cp_async16(uint4* smem_dst, const void* gsrc) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned s = unsigned(__cvta_generic_to_shared(smem_dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gsrc) : "memory");
#endif
}
__device__ __forceinline__ void cp_async_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;" ::: "memory");
#endif
}
// Vectors idx = k0 + lane + 32 j < k1 a lane handles.
__device__ __forceinline__ int lane_nvec(int k0, int k1) {
    const int n = k1 - k0 - int(threadIdx.x & 31);
    return n > 0 ? (n + 31) / 32 : 0;
}

__device__ __forceinline__ void unpack8(const uint4& u, float* f) {
#if defined(LB_GPU_FP16)
    const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const float2 t = __half22float2(h[k]);
        f[2 * k] = t.x;
        f[2 * k + 1] = t.y;
    }
#else
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        f[2 * k] = __uint_as_float(w[k] << 16);
        f[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    }
#endif
}

// KV rows: bf16 (bits) or f16.
__device__ __forceinline__ void unpack8_kv(const uint4& u, float* f, int kv_f16) {
    if (kv_f16) {
        const __half2* h = reinterpret_cast<const __half2*>(&u);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const float2 t = __half22float2(h[k]);
            f[2 * k] = t.x;
            f[2 * k + 1] = t.y;
        }
    } else {
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            f[2 * k] = __uint_as_float(w[k] << 16);
            f[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
        }
    }
}
// Rounds like the core's kv_store_warp (round to nearest even), returns the stored bits and the value.
__device__ __forceinline__ unsigned short kv_round(float v, int kv_f16, float* back) {
    if (kv_f16) {
        const __half h = __float2half_rn(v);
        *back = __half2float(h);
        return __half_as_ushort(h);
    }
    unsigned bits = __float_as_uint(v);
    bits += 0x7fff + ((bits >> 16) & 1);
    const unsigned short r = (unsigned short)(bits >> 16);
    *back = __uint_as_float(unsigned(r) << 16);
    return r;
}

// ----------------------------------------------------------------------------------------- reductions

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
// Sum over the block; every thread gets it. `red` holds NW floats; reusable right after return.
__device__ __forceinline__ float block_sum(float v, float* red) {
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    float t = 0.f;
#pragma unroll
    for (int w = 0; w < NW; ++w) t += red[w];
    __syncthreads();
    return t;
}
__device__ __forceinline__ float silu(float x) { return x / (1.f + __expf(-x)); }
__device__ __forceinline__ float sigm(float x) { return 1.f / (1.f + __expf(-x)); }

// Grid barrier: generation counter; the last block to arrive resets the count and opens the next
// generation. Writes before the barrier are made visible with a fence; reads after it go through L2.
__device__ __forceinline__ void grid_barrier(unsigned* bar) {
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned* count = bar;
        unsigned* gen = bar + 1;
        const unsigned g = ld_acquire(gen);
        __threadfence();
        if (atomicAdd(count, 1u) == gridDim.x - 1) {
            atomicExch(count, 0u);
            __threadfence();
            atomicAdd(gen, 1u);
        } else {
            while (ld_acquire(gen) == g) {
            }
        }
        __threadfence();
    }
    __syncthreads();
}

__device__ __forceinline__ void part_range(int n, int b, int nb, int* r0, int* r1) {
    *r0 = int(int64_t(n) * b / nb);
    *r1 = int(int64_t(n) * (b + 1) / nb);
}

// ----------------------------------------------------------------------------------------- GEMV pieces

// acc[r] += W_r[k] . x[k] over the 16-byte vectors [k0, k1) of R rows; each lane keeps 4 * R loads in flight.
// Load number q = qbase + j * R + r of this lane (j: the lane's j-th vector) comes from its staging slot
// q when q < staged, else from global memory.
template <int R>
__device__ __forceinline__ void dot_rows(const uint4* const* rows, int k0, int k1, const float* xs, float* acc,
                                         const Slots& sl, int qbase) {
    const int lane = threadIdx.x & 31;
    const float4* x4 = reinterpret_cast<const float4*>(xs);
    int j0 = 0;
    for (int i = k0 + lane; i < k1; i += 32 * 4, j0 += 4) {
        uint4 w[R][4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int idx = i + 32 * u;
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const int q = qbase + (j0 + u) * R + r;
                w[r][u] = idx < k1 ? (q < sl.staged ? sl.p[q * NT] : ldw(rows[r] + idx)) : make_uint4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int idx = i + 32 * u;
            if (idx < k1) {
                const float4 xa = x4[2 * idx], xb = x4[2 * idx + 1];
#pragma unroll
                for (int r = 0; r < R; ++r) {
                    float f[8];
                    unpack8(w[r][u], f);
                    acc[r] += f[0] * xa.x + f[1] * xa.y + f[2] * xa.z + f[3] * xa.w + f[4] * xb.x + f[5] * xb.y +
                              f[6] * xb.z + f[7] * xb.w;
                }
            }
        }
    }
}
// The issuing twin of dot_rows: stages this lane's loads q < sl.n; returns the slots filled so far.
template <int R>
__device__ __forceinline__ int issue_rows(const uint4* const* rows, int k0, int k1, const Slots& sl, int qbase, int staged) {
    const int lane = threadIdx.x & 31;
    for (int j = 0;; ++j) {
        const int idx = k0 + lane + 32 * j;
        if (idx >= k1) break;
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int q = qbase + j * R + r;
            if (q >= sl.n) return staged;
            cp_async16(sl.p + size_t(q) * NT, rows[r] + idx);
            staged = q + 1;
        }
    }
    return staged;
}

// Rows [r0, r1) of W [*, K] times xs. Many rows: each warp takes two rows at a time. Few rows (<= NW):
// each row's K is split over S warps (S a power of two) and the parts are summed in shared memory.
// epi(row, value) runs once per row on one lane. Every thread of the block must call this.
// ISSUE: only stage (cp.async) this lane's first sl.n loads of the same walk; returns the slots filled.
template <bool ISSUE, class Epi>
__device__ __forceinline__ int gemv_rows(const wtype* W, int K, int r0, int r1, const float* xs, float* red,
                                         const Slots& sl, Epi epi) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n = r1 - r0, kv = K / 8;
    int staged = 0;
    if (!ISSUE && sl.staged > 0) cp_async_wait_all();
    if (n > NW) {
        const int nvec = lane_nvec(0, kv);
        int tl = 0;
        for (int t = warp; 2 * t < n; t += NW, ++tl) {
            const int ra = r0 + 2 * t, rb = ra + 1;
            const int qbase = tl * nvec * 2;
            if (ISSUE) {
                if (qbase >= sl.n) break;
                if (rb < r1) {
                    const uint4* rows[2] = {(const uint4*)(W + size_t(ra) * K), (const uint4*)(W + size_t(rb) * K)};
                    staged = issue_rows<2>(rows, 0, kv, sl, qbase, staged);
                } else {
                    const uint4* rows[1] = {(const uint4*)(W + size_t(ra) * K)};
                    staged = issue_rows<1>(rows, 0, kv, sl, qbase, staged);
                }
                continue;
            }
            float acc[2] = {0.f, 0.f};
            if (rb < r1) {
                const uint4* rows[2] = {(const uint4*)(W + size_t(ra) * K), (const uint4*)(W + size_t(rb) * K)};
                dot_rows<2>(rows, 0, kv, xs, acc, sl, qbase);
            } else {
                const uint4* rows[1] = {(const uint4*)(W + size_t(ra) * K)};
                dot_rows<1>(rows, 0, kv, xs, acc, sl, qbase);
            }
            acc[0] = warp_sum(acc[0]);
            acc[1] = warp_sum(acc[1]);
            if (lane == 0) {
                epi(ra, acc[0]);
                if (rb < r1) epi(rb, acc[1]);
            }
        }
        return staged;
    }
    if (n <= 0) return staged;
    int S = 1;
    while (S < NW && n * S * 2 <= NW) S *= 2;
    const int part = warp % S, rl = warp / S, rpp = NW / S;
    const int per = (kv + S - 1) / S;
    const int k0 = min(kv, part * per), k1 = min(kv, k0 + per);
    const int nvec = lane_nvec(k0, k1);
    int pass = 0;
    for (int base = r0; base < r1; base += rpp, ++pass) {
        const int row = base + rl;
        const int qbase = pass * nvec;
        if (ISSUE) {
            if (row < r1 && qbase < sl.n) {
                const uint4* rows[1] = {(const uint4*)(W + size_t(row) * K)};
                staged = issue_rows<1>(rows, k0, k1, sl, qbase, staged);
            }
            continue;
        }
        float acc = 0.f;
        if (row < r1) {
            const uint4* rows[1] = {(const uint4*)(W + size_t(row) * K)};
            dot_rows<1>(rows, k0, k1, xs, &acc, sl, qbase);
        }
        acc = warp_sum(acc);
        if (S == 1) {
            if (lane == 0 && row < r1) epi(row, acc);
        } else {
            if (lane == 0) red[warp] = acc;
            __syncthreads();
            if (part == 0 && lane == 0 && row < r1) {
                float s = 0.f;
                for (int q = 0; q < S; ++q) s += red[warp + q];
                epi(row, s);
            }
            __syncthreads();
        }
    }
    return staged;
}
struct NoEpi {
    __device__ void operator()(int, float) const {}
};

// xs[0..H) = rmsnorm(v) * gain, v from the residual (other blocks wrote it) or an embedding row.
__device__ __forceinline__ void norm_to_smem(const float* xg, const wtype* erow, int H, const float* gain, float eps,
                                             float* xs, float* red) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < H; i += NT) {
        const float v = erow ? gpu::w2f(erow[i]) : ldg(xg + i);
        xs[i] = v;
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum(ss, red) / float(H) + eps);
    for (int i = threadIdx.x; i < H; i += NT) xs[i] = xs[i] * inv * __ldg(gain + i);
    __syncthreads();
}

// ----------------------------------------------------------------------------------------- prefetch plan

// Asks L2 for this block's share of stage `s` of layer `l` (s == 5: the LM head's first window).
__device__ void prefetch_stage(const Params& p, int l, int s, int pos) {
    const int nb = gridDim.x, b = blockIdx.x;
    if (l >= p.n_layers) { s = 5; }
    int r0, r1;
    if (s == 5) {
        part_range(p.V, b, nb, &r0, &r1);
        const int e = min(r1, r0 + LM_WIN);
        prefetch_range(p.lm_head + size_t(r0) * p.H, size_t(e - r0) * p.H * sizeof(wtype));
        return;
    }
    const LayerPtrs& L = p.layers[l];
    switch (s) {
        case 0:
            part_range(L.in_rows, b, nb, &r0, &r1);
            prefetch_range(L.in_w + size_t(r0) * p.H, size_t(r1 - r0) * p.H * sizeof(wtype));
            if (!L.full) {
                const int c0 = min(r0, p.cd), c1 = min(r1, p.cd);
                if (c1 > c0) {
                    prefetch_lines(L.conv_state + size_t(c0) * (p.conv_k - 1), size_t(c1 - c0) * (p.conv_k - 1) * 4);
                    prefetch_lines(L.conv_w + size_t(c0) * p.conv_k, size_t(c1 - c0) * p.conv_k * 4);
                }
            }
            break;
        case 1:
            if (!L.full) {
                const int per_head = p.dv / DN_COLS, items = p.hv * per_head;
                for (int it = b; it < items; it += nb) {
                    const int h = it / per_head, j0 = (it % per_head) * DN_COLS;
                    for (int i = threadIdx.x; i < p.dk; i += NT)
                        prefetch_line(L.ssm + (size_t(h) * p.dk + i) * p.dv + j0);
                }
            } else {
                const int ctx = pos + 1;
                int nch = max(1, min((ctx + 15) / 16, nb / p.nh));
                const int cs = (ctx + nch - 1) / nch;
                nch = (ctx + cs - 1) / cs;
                const size_t row = size_t(p.hd) * 2;
                const int lines = int((row + 127) / 128);
                for (int it = b; it < p.nh * nch; it += nb) {
                    const int h = it / nch, c = it % nch, kvh = h / (p.nh / p.nkv);
                    const int s0 = c * cs, s1 = min(ctx, s0 + cs);
                    for (int e = threadIdx.x; e < (s1 - s0) * lines; e += NT) {
                        const size_t off = (size_t(s0 + e / lines) * p.nkv + kvh) * row + size_t(e % lines) * 128;
                        prefetch_line((const char*)L.kc + off);
                        prefetch_line((const char*)L.vc + off);
                    }
                }
            }
            break;
        case 2:
            part_range(p.H, b, nb, &r0, &r1);
            prefetch_range(L.out_w + size_t(r0) * L.out_in, size_t(r1 - r0) * L.out_in * sizeof(wtype));
            break;
        case 3:
            part_range(p.I, b, nb, &r0, &r1);
            prefetch_range(L.gate_up + size_t(r0) * p.H, size_t(r1 - r0) * p.H * sizeof(wtype));
            prefetch_range(L.gate_up + size_t(p.I + r0) * p.H, size_t(r1 - r0) * p.H * sizeof(wtype));
            break;
        case 4:
            part_range(p.H, b, nb, &r0, &r1);
            prefetch_range(L.down + size_t(r0) * p.I, size_t(r1 - r0) * p.I * sizeof(wtype));
            break;
    }
}

// ----------------------------------------------------------------------------------------- stages

// Stage 0: RMSNorm + in-projection; DeltaNet rows finish their element-wise work in the epilogue.
__device__ void stage_in(const Params& p, const LayerPtrs& L, int l, int tok, float* xs, float* red, const Slots& sl) {
    const int nb = gridDim.x, b = blockIdx.x;
    const wtype* erow = l == 0 ? p.embed + size_t(tok) * p.H : nullptr;
    if (l == 0 && b == 0)
        for (int i = threadIdx.x; i < p.H; i += NT) p.x[i] = gpu::w2f(erow[i]);
    norm_to_smem(p.x, erow, p.H, L.input_norm, p.eps, xs, red);
    int r0, r1;
    part_range(L.in_rows, b, nb, &r0, &r1);
    if (L.full) {
        gemv_rows<false>(L.in_w, p.H, r0, r1, xs, red, sl, [&](int r, float v) { p.buf_in[r] = v; });
        return;
    }
    const int cd = p.cd, vd = p.vd, K = p.conv_k;
    gemv_rows<false>(L.in_w, p.H, r0, r1, xs, red, sl, [&](int r, float v) {
        if (r < cd) {  // causal depthwise conv over [state (K-1, oldest first), v] + SiLU; state shifts
            float* st = L.conv_state + size_t(r) * (K - 1);
            const float* w = L.conv_w + size_t(r) * K;
            float win[8];  // K <= 8 (checked at load); unrolled so the window stays in registers
            float acc = __ldg(w + K - 1) * v;
#pragma unroll
            for (int j = 0; j < 7; ++j)
                if (j < K - 1) {
                    win[j] = __ldcg(st + j);
                    acc += __ldg(w + j) * win[j];
                }
#pragma unroll
            for (int j = 0; j < 6; ++j)
                if (j + 1 < K - 1) st[j] = win[j + 1];
            if (K > 1) st[K - 2] = v;
            p.conv_out[r] = silu(acc);
        } else if (r < cd + vd) {
            p.buf_in[r] = v;  // z
        } else if (r < cd + vd + p.hv) {
            p.beta[r - cd - vd] = sigm(v);
        } else {
            const int i = r - cd - vd - p.hv;
            const float a = v + __ldg(L.dt_bias + i);
            const float sp = a > 20.f ? a : log1pf(expf(a));
            p.g[i] = __ldg(L.neg_A + i) * sp;
        }
    });
}

// Stage 1 (DeltaNet): item = (value head h, columns [j0, j0 + 16)). Columns of the state are independent:
//   S' = e^g S;  kv = S'^T k;  delta = beta (v - kv);  S'' = S' + k delta^T;  o = S''^T q.
__device__ void stage_deltanet(const Params& p, const LayerPtrs& L, float* aux) {
    const int nb = gridDim.x, b = blockIdx.x;
    const int dk = p.dk, dv = p.dv, per_head = dv / DN_COLS, items = p.hv * per_head;
    const int group = p.hv / p.hk, kd = p.hk * dk;
    float* qn = aux;            // [dk]
    float* kn = aux + dk;       // [dk]
    float* red1 = kn + dk;      // [NW * 16]
    float* red2 = red1 + NW * DN_COLS;
    float* red = red2 + NW * DN_COLS;  // [NW]
    const int c = threadIdx.x & (DN_COLS - 1), rg = threadIdx.x >> 4;  // 32 row groups
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int it = b; it < items; it += nb) {
        const int h = it / per_head, j0 = (it % per_head) * DN_COLS, kh = h / group;
        float sq = 0.f, sk = 0.f;
        for (int i = threadIdx.x; i < dk; i += NT) {
            const float q = ldg(p.conv_out + size_t(kh) * dk + i);
            const float k = ldg(p.conv_out + kd + size_t(kh) * dk + i);
            qn[i] = q;
            kn[i] = k;
            sq += q * q;
            sk += k * k;
        }
        const float tq = block_sum(sq, red);
        const float tk = block_sum(sk, red);
        const float iq = rsqrtf(tq + 1e-6f) * rsqrtf(float(dk)), ik = rsqrtf(tk + 1e-6f);
        const float decay = expf(ldg(p.g + h)), bt = ldg(p.beta + h);
        const float vj = ldg(p.conv_out + 2 * kd + size_t(h) * dv + j0 + c);
        float* S = L.ssm + size_t(h) * dk * dv + j0 + c;
        float s[DN_MAXR], kr[DN_MAXR];
        float kv = 0.f;
#pragma unroll
        for (int r = 0; r < DN_MAXR; ++r) {
            const int i = rg + 32 * r;
            s[r] = 0.f;
            kr[r] = 0.f;
            if (i < dk) {
                s[r] = ldg(S + size_t(i) * dv) * decay;
                kr[r] = kn[i] * ik;
                kv += s[r] * kr[r];
            }
        }
        kv += __shfl_xor_sync(0xffffffffu, kv, 16);
        if (lane < DN_COLS) red1[warp * DN_COLS + lane] = kv;
        __syncthreads();
        float kvt = 0.f;
#pragma unroll
        for (int w = 0; w < NW; ++w) kvt += red1[w * DN_COLS + c];
        const float delta = (vj - kvt) * bt;
        float o = 0.f;
#pragma unroll
        for (int r = 0; r < DN_MAXR; ++r) {
            const int i = rg + 32 * r;
            if (i < dk) {
                s[r] += kr[r] * delta;
                S[size_t(i) * dv] = s[r];
                o += s[r] * qn[i] * iq;
            }
        }
        o += __shfl_xor_sync(0xffffffffu, o, 16);
        if (lane < DN_COLS) red2[warp * DN_COLS + lane] = o;
        __syncthreads();
        if (threadIdx.x < DN_COLS) {
            float ot = 0.f;
#pragma unroll
            for (int w = 0; w < NW; ++w) ot += red2[w * DN_COLS + threadIdx.x];
            p.o[size_t(h) * dv + j0 + threadIdx.x] = ot;
        }
        __syncthreads();
    }
}

// Per-head RMSNorm (gain) + partial RoPE of one head row of hd values into shared memory `dst`.
__device__ void head_norm_rope(const float* src, const float* gain, int hd, int rot, float theta, float eps, int pos,
                               float* dst, float* red) {
    float ss = 0.f;
    for (int i = threadIdx.x; i < hd; i += NT) {
        const float v = ldg(src + i);
        dst[i] = v;
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum(ss, red) / float(hd) + eps);
    for (int i = threadIdx.x; i < hd; i += NT) dst[i] = dst[i] * inv * __ldg(gain + i);
    __syncthreads();
    const int half = rot / 2;
    for (int i = threadIdx.x; i < half; i += NT) {
        const float inv_freq = 1.0f / powf(theta, float(2 * i) / float(rot));
        const float angle = float(pos) * inv_freq;
        float sn, cs;
        sincosf(angle, &sn, &cs);
        const float a = dst[i], bb = dst[i + half];
        dst[i] = a * cs - bb * sn;
        dst[i + half] = bb * cs + a * sn;
    }
    __syncthreads();
}

// Stage 1 (full attention): item = (q head h, chunk of positions). Each warp runs an online softmax over
// every NW-th position of the chunk; the block merges its warps; the last chunk of a head merges chunks.
template <int MAXC>
__device__ void stage_attention(const Params& p, const LayerPtrs& L, int l, int pos, float* aux) {
    const int nb = gridDim.x, b = blockIdx.x;
    const int hd = p.hd, nh = p.nh, nkv = p.nkv, group = nh / nkv;
    const int ctx = pos + 1;
    int nch = max(1, min((ctx + 15) / 16, nb / nh));
    const int cs = (ctx + nch - 1) / nch;
    nch = (ctx + cs - 1) / cs;
    float* qs = aux;            // [hd]
    float* kn = qs + hd;        // [hd] new key (normed, roped, rounded to the cache type)
    float* vn = kn + hd;        // [hd] new value (rounded)
    float* wm = vn + hd;        // [NW]
    float* wl = wm + NW;        // [NW]
    float* red = wl + NW;       // [NW]
    float* wacc = red + NW;     // [NW, hd]
    __shared__ int s_last;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int chunks8 = hd / 8;
    const size_t row_elems = size_t(nkv) * hd;
    const float scale = rsqrtf(float(hd));
    for (int it = b; it < nh * nch; it += nb) {
        const int h = it / nch, c = it % nch, kvh = h / group;
        const int s0 = c * cs, s1 = min(ctx, s0 + cs);
        const float* qkv = p.buf_in;
        head_norm_rope(qkv + size_t(h) * 2 * hd, L.q_norm, hd, p.rot, p.theta, p.eps, pos, qs, red);
        const bool has_new = s1 == ctx;
        if (has_new) {
            head_norm_rope(qkv + size_t(2 * nh) * hd + size_t(kvh) * hd, L.k_norm, hd, p.rot, p.theta, p.eps, pos, kn, red);
            const bool writer = (h % group) == 0;
            unsigned short* krow = (unsigned short*)L.kc + (size_t(pos) * nkv + kvh) * hd;
            unsigned short* vrow = (unsigned short*)L.vc + (size_t(pos) * nkv + kvh) * hd;
            for (int i = threadIdx.x; i < hd; i += NT) {
                float kb, vb;
                const unsigned short kbits = kv_round(kn[i], p.kv_f16, &kb);
                const unsigned short vbits = kv_round(ldg(qkv + size_t(2 * nh + nkv) * hd + size_t(kvh) * hd + i), p.kv_f16, &vb);
                kn[i] = kb;
                vn[i] = vb;
                if (writer) { krow[i] = kbits; vrow[i] = vbits; }
            }
            __syncthreads();
        }
        float q[MAXC][8], acc[MAXC][8];
#pragma unroll
        for (int m = 0; m < MAXC; ++m) {
            const int e8 = lane + 32 * m;
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                q[m][j] = e8 < chunks8 ? qs[e8 * 8 + j] : 0.f;
                acc[m][j] = 0.f;
            }
        }
        float mx = -FLT_MAX, lsum = 0.f;
        for (int s = s0 + warp; s < s1; s += NW) {
            float kf[MAXC][8], vf[MAXC][8];
            const bool fresh = s == pos;
            const uint4* kr = (const uint4*)((const unsigned short*)L.kc + (size_t(s) * row_elems + size_t(kvh) * hd));
            const uint4* vr = (const uint4*)((const unsigned short*)L.vc + (size_t(s) * row_elems + size_t(kvh) * hd));
#pragma unroll
            for (int m = 0; m < MAXC; ++m) {
                const int e8 = lane + 32 * m;
                if (e8 < chunks8) {
                    if (fresh) {
#pragma unroll
                        for (int j = 0; j < 8; ++j) { kf[m][j] = kn[e8 * 8 + j]; vf[m][j] = vn[e8 * 8 + j]; }
                    } else {
                        unpack8_kv(ldg4(kr + e8), kf[m], p.kv_f16);
                        unpack8_kv(ldg4(vr + e8), vf[m], p.kv_f16);
                    }
                } else {
#pragma unroll
                    for (int j = 0; j < 8; ++j) { kf[m][j] = 0.f; vf[m][j] = 0.f; }
                }
            }
            float d = 0.f;
#pragma unroll
            for (int m = 0; m < MAXC; ++m)
#pragma unroll
                for (int j = 0; j < 8; ++j) d += q[m][j] * kf[m][j];
            const float score = warp_sum(d) * scale;
            const float mnew = fmaxf(mx, score);
            const float corr = __expf(mx - mnew), pr = __expf(score - mnew);
            lsum = lsum * corr + pr;
#pragma unroll
            for (int m = 0; m < MAXC; ++m)
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[m][j] = acc[m][j] * corr + pr * vf[m][j];
            mx = mnew;
        }
        if (lane == 0) { wm[warp] = mx; wl[warp] = lsum; }
#pragma unroll
        for (int m = 0; m < MAXC; ++m) {
            const int e8 = lane + 32 * m;
            if (e8 < chunks8)
#pragma unroll
                for (int j = 0; j < 8; ++j) wacc[warp * hd + e8 * 8 + j] = acc[m][j];
        }
        __syncthreads();
        float M = -FLT_MAX;
        for (int w = 0; w < NW; ++w) M = fmaxf(M, wm[w]);
        float Lsum = 0.f;
        for (int w = 0; w < NW; ++w) Lsum += wl[w] * __expf(wm[w] - M);
        const float* gate = qkv + size_t(h) * 2 * hd + hd;
        if (nch == 1) {
            for (int e = threadIdx.x; e < hd; e += NT) {
                float ov = 0.f;
                for (int w = 0; w < NW; ++w) ov += wacc[w * hd + e] * __expf(wm[w] - M);
                p.o[size_t(h) * hd + e] = ov / Lsum * sigm(ldg(gate + e));
            }
            __syncthreads();
            continue;
        }
        float* part = p.att_part + (size_t(h) * nb + c) * (hd + 2);
        for (int e = threadIdx.x; e < hd; e += NT) {
            float ov = 0.f;
            for (int w = 0; w < NW; ++w) ov += wacc[w * hd + e] * __expf(wm[w] - M);
            part[2 + e] = ov;
        }
        if (threadIdx.x == 0) { part[0] = M; part[1] = Lsum; }
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) s_last = atomicAdd(p.tickets + l * nh + h, 1u) == unsigned(nch - 1);
        __syncthreads();
        if (s_last) {
            __threadfence();
            const float* hp = p.att_part + size_t(h) * nb * (hd + 2);
            float MM = -FLT_MAX;
            for (int k = 0; k < nch; ++k) MM = fmaxf(MM, ldg(hp + size_t(k) * (hd + 2)));
            float LL = 0.f;
            for (int k = 0; k < nch; ++k) LL += ldg(hp + size_t(k) * (hd + 2) + 1) * __expf(ldg(hp + size_t(k) * (hd + 2)) - MM);
            for (int e = threadIdx.x; e < hd; e += NT) {
                float ov = 0.f;
                for (int k = 0; k < nch; ++k)
                    ov += ldg(hp + size_t(k) * (hd + 2) + 2 + e) * __expf(ldg(hp + size_t(k) * (hd + 2)) - MM);
                p.o[size_t(h) * hd + e] = ov / LL * sigm(ldg(gate + e));
            }
            if (threadIdx.x == 0) atomicExch(p.tickets + l * nh + h, 0u);
        }
        __syncthreads();
    }
}

// Stage 2: (gated RMSNorm of the DeltaNet output) + out-projection + residual.
__device__ void stage_out(const Params& p, const LayerPtrs& L, float* xs, float* aux, float* red, const Slots& sl) {
    const int nb = gridDim.x, b = blockIdx.x;
    const int in = L.out_in;
    for (int e = threadIdx.x; e < in; e += NT) xs[e] = ldg(p.o + e);
    __syncthreads();
    if (!L.full) {
        const int dv = p.dv;
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        for (int h = warp; h < p.hv; h += NW) {
            float ss = 0.f;
            for (int j = lane; j < dv; j += 32) ss += xs[h * dv + j] * xs[h * dv + j];
            ss = warp_sum(ss);
            if (lane == 0) aux[h] = rsqrtf(ss / float(dv) + p.eps);
        }
        __syncthreads();
        for (int e = threadIdx.x; e < in; e += NT) {
            const float z = ldg(p.buf_in + p.cd + e);
            xs[e] = __ldg(L.ssm_norm + e % dv) * (xs[e] * aux[e / dv]) * silu(z);
        }
        __syncthreads();
    }
    int r0, r1;
    part_range(p.H, b, nb, &r0, &r1);
    gemv_rows<false>(L.out_w, in, r0, r1, xs, red, sl, [&](int r, float v) { p.x[r] = ldg(p.x + r) + v; });
}

// Stage 3: RMSNorm + gate/up rows together + SiLU(gate) * up. ISSUE: stage the loads only.
template <bool ISSUE>
__device__ int stage_gate_up(const Params& p, const LayerPtrs& L, float* xs, float* red, const Slots& sl) {
    const int nb = gridDim.x, b = blockIdx.x;
    if (!ISSUE) norm_to_smem(p.x, nullptr, p.H, L.post_norm, p.eps, xs, red);
    if (!ISSUE && sl.staged > 0) cp_async_wait_all();
    int r0, r1;
    part_range(p.I, b, nb, &r0, &r1);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, kv = p.H / 8;
    const int nvec = lane_nvec(0, kv);
    int staged = 0, tl = 0;
    for (int r = r0 + warp; r < r1; r += NW, ++tl) {
        const uint4* rows[2] = {(const uint4*)(L.gate_up + size_t(r) * p.H), (const uint4*)(L.gate_up + size_t(p.I + r) * p.H)};
        const int qbase = tl * nvec * 2;
        if (ISSUE) {
            if (qbase >= sl.n) break;
            staged = issue_rows<2>(rows, 0, kv, sl, qbase, staged);
            continue;
        }
        float acc[2] = {0.f, 0.f};
        dot_rows<2>(rows, 0, kv, xs, acc, sl, qbase);
        acc[0] = warp_sum(acc[0]);
        acc[1] = warp_sum(acc[1]);
        if (lane == 0) p.act[r] = silu(acc[0]) * acc[1];
    }
    return staged;
}

// Stagers for the GEMV stages: the same walk as the compute, cp.async only.
__device__ int issue_in(const Params& p, const LayerPtrs& L, const Slots& sl) {
    int r0, r1;
    part_range(L.in_rows, blockIdx.x, gridDim.x, &r0, &r1);
    return gemv_rows<true>(L.in_w, p.H, r0, r1, nullptr, nullptr, sl, NoEpi{});
}
__device__ int issue_out(const Params& p, const LayerPtrs& L, const Slots& sl) {
    int r0, r1;
    part_range(p.H, blockIdx.x, gridDim.x, &r0, &r1);
    return gemv_rows<true>(L.out_w, L.out_in, r0, r1, nullptr, nullptr, sl, NoEpi{});
}
__device__ int issue_down(const Params& p, const LayerPtrs& L, const Slots& sl) {
    int r0, r1;
    part_range(p.H, blockIdx.x, gridDim.x, &r0, &r1);
    return gemv_rows<true>(L.down, p.I, r0, r1, nullptr, nullptr, sl, NoEpi{});
}

// Stage 4: down-projection + residual.
__device__ void stage_down(const Params& p, const LayerPtrs& L, float* xs, float* red, const Slots& sl) {
    const int nb = gridDim.x, b = blockIdx.x;
    for (int e = threadIdx.x; e < p.I; e += NT) xs[e] = ldg(p.act + e);
    __syncthreads();
    int r0, r1;
    part_range(p.H, b, nb, &r0, &r1);
    gemv_rows<false>(L.down, p.I, r0, r1, xs, red, sl, [&](int r, float v) { p.x[r] = ldg(p.x + r) + v; });
}

// LM head + greedy argmax (lowest index on ties); the last block to finish writes the token and advances
// the sequence state.
__device__ void stage_lm(const Params& p, int pos, float* xs, float* red) {
    const int nb = gridDim.x, b = blockIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __shared__ float s_val[NW];
    __shared__ int s_idx[NW];
    __shared__ int s_last;
    norm_to_smem(p.x, nullptr, p.H, p.final_norm, p.eps, xs, red);
    int r0, r1;
    part_range(p.V, b, nb, &r0, &r1);
    float best = -FLT_MAX;
    int bidx = 0x7fffffff;
    const Slots nosl{nullptr, 0, 0};
    if (p.diag & 2) r1 = r0;  // diagnostics: time everything but the LM head
    for (int w0 = r0; w0 < r1; w0 += LM_WIN) {
        if (p.prefetch & 2) {
            const int a = w0 + LM_WIN, e = min(r1, a + LM_WIN);
            if (a < e) prefetch_range(p.lm_head + size_t(a) * p.H, size_t(e - a) * p.H * sizeof(wtype));
        }
        const int w1 = min(r1, w0 + LM_WIN);
        gemv_rows<false>(p.lm_head, p.H, w0, w1, xs, red, nosl, [&](int r, float v) {
            if (v > best || (v == best && r < bidx)) { best = v; bidx = r; }
        });
    }
    // gemv_rows calls epi on lane 0 of the owning warp (n > NW) or of the part-0 warp (n <= NW).
    best = __shfl_sync(0xffffffffu, best, 0);
    bidx = __shfl_sync(0xffffffffu, bidx, 0);
    if (lane == 0) { s_val[warp] = best; s_idx[warp] = bidx; }
    __syncthreads();
    if (threadIdx.x == 0) {
        float bv = -FLT_MAX;
        int bi = 0x7fffffff;
        for (int w = 0; w < NW; ++w)
            if (s_val[w] > bv || (s_val[w] == bv && s_idx[w] < bi)) { bv = s_val[w]; bi = s_idx[w]; }
        p.lm_val[b] = bv;
        p.lm_idx[b] = bi;
        __threadfence();
        s_last = atomicAdd(p.tickets + p.n_layers * p.nh, 1u) == unsigned(nb - 1);
    }
    __syncthreads();
    if (s_last && threadIdx.x == 0) {
        __threadfence();
        float bv = -FLT_MAX;
        int bi = 0x7fffffff;
        for (int k = 0; k < nb; ++k) {
            const float v = ldg(p.lm_val + k);
            const int i = __ldcg(p.lm_idx + k);
            if (v > bv || (v == bv && i < bi)) { bv = v; bi = i; }
        }
        if (bi == 0x7fffffff) bi = 0;  // all NaN: keep a valid id
        const int st = *p.step;
        p.out_tokens[st] = bi;
        *p.step = st + 1;
        *p.tok = bi;
        *p.pos = pos + 1;
        for (int e = 0; e < p.n_eos; ++e)
            if (p.eos[e] == bi) *p.done = 1;
        atomicExch(p.tickets + p.n_layers * p.nh, 0u);
        __threadfence();
    }
}

__global__ void __launch_bounds__(NT, 1) decode_kernel(const Params p) {
    extern __shared__ float4 smem4[];
    Slots sl{reinterpret_cast<uint4*>(smem4) + threadIdx.x, p.nslot, 0};
    float* xs = reinterpret_cast<float*>(reinterpret_cast<uint4*>(smem4) + size_t(p.nslot) * NT);
    float* red = xs + p.xs_floats;  // 64 floats
    float* aux = red + 64;
    if (*(volatile int*)p.done) return;  // the chain already produced an eos token
    const int pos = *(volatile int*)p.pos;
    const int tok = *(volatile int*)p.tok;
    const bool pf = p.prefetch & 1;
    const int n_layers = (p.diag & 1) ? 0 : p.n_layers;  // diagnostics: time the LM head alone
    if (pf) prefetch_stage(p, 0, 0, pos);
    if (n_layers > 0) sl.staged = issue_in(p, p.layers[0], sl);
    for (int l = 0; l < n_layers; ++l) {
        const LayerPtrs& L = p.layers[l];
        if (pf) prefetch_stage(p, l, 1, pos);
        stage_in(p, L, l, tok, xs, red, sl);
        sl.staged = issue_out(p, L, sl);  // lands during the barrier and the mixer
        grid_barrier(p.bar);
        if (pf) prefetch_stage(p, l, 2, pos);
        if (L.full) {
            if (p.hd <= 256) stage_attention<1>(p, L, l, pos, aux);
            else stage_attention<ATT_MAXC>(p, L, l, pos, aux);
        }
        else stage_deltanet(p, L, aux);
        grid_barrier(p.bar);
        if (pf) prefetch_stage(p, l, 3, pos);
        stage_out(p, L, xs, aux, red, sl);
        sl.staged = stage_gate_up<true>(p, L, xs, red, sl);
        grid_barrier(p.bar);
        if (pf) prefetch_stage(p, l, 4, pos);
        stage_gate_up<false>(p, L, xs, red, sl);
        sl.staged = issue_down(p, L, sl);
        grid_barrier(p.bar);
        if (pf) prefetch_stage(p, l + 1, 0, pos);  // the LM head's first window after the last layer
        stage_down(p, L, xs, red, sl);
        sl.staged = l + 1 < n_layers ? issue_in(p, p.layers[l + 1], sl) : 0;
        grid_barrier(p.bar);
    }
    stage_lm(p, pos, xs, red);
    if (pf) prefetch_stage(p, 0, 0, pos + 1);  // the next token's first stage, while the tail finishes
}

}  // namespace

const void* decode_kernel_ptr() { return (const void*)decode_kernel; }

}  // namespace lb::mk
