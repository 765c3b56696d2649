// The persistent decode kernel (see decode_kernel.cuh for the plan). The reference for every stage is
// the core's CPU backend (core/cpu/), the same math the multi-kernel CUDA backend runs one kernel at a time.
#include "decode_kernel.cuh"
#include "core/cuda/fixed_point.cuh"

#if defined(__HIPCC__)
// HIP (AMD, wave32 targets; compiled in CI, never run): the same kernel without PTX. Data other blocks
// wrote in this launch is read with volatile loads (past the non-coherent L1), the barrier uses clang's
// atomics, and the sm_80/sm_90 paths (cp.async) are left out.
#define LB_MK_HIP 1
#if defined(__HIP_DEVICE_COMPILE__)
static_assert(LB_WARP == 32, "the megakernel assumes 32-lane warps: build it for a wave32 (gfx10+) target");
#endif
#endif

namespace lb::mk {
namespace {

// ----------------------------------------------------------------------------------------- memory helpers
// Barrier of the block's NT threads (named barrier 1).
#if defined(LB_MK_HIP)
__device__ __forceinline__ void csync() { __syncthreads(); }  // the v1 kernel's blocks are all compute threads
#else
__device__ __forceinline__ void csync() { asm volatile("bar.sync 1, %0;" ::"n"(NT) : "memory"); }
#endif


#if defined(LB_MK_HIP)
__device__ __forceinline__ uint4 ldw(const void* p) { return *reinterpret_cast<const uint4*>(p); }
template <class T>
__device__ __forceinline__ T ldcg(const T* p) { return *reinterpret_cast<const volatile T*>(p); }
__device__ __forceinline__ float ldg(const float* p) { return ldcg(p); }
__device__ __forceinline__ uint4 ldg4(const void* p) {
    const volatile unsigned* w = reinterpret_cast<const volatile unsigned*>(p);
    return make_uint4(w[0], w[1], w[2], w[3]);
}
__device__ __forceinline__ float4 ldg4f(const float* p) {
    const volatile float* w = p;
    return make_float4(w[0], w[1], w[2], w[3]);
}
#define LB_MK_TRAP() __builtin_trap()
#else
__device__ __forceinline__ uint4 ldw(const void* p) {  // weights: 16 B, read-only path, no L1 allocation
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}
template <class T>
__device__ __forceinline__ T ldcg(const T* p) { return __ldcg(p); }
__device__ __forceinline__ float ldg(const float* p) { return __ldcg(p); }       // written by other blocks
__device__ __forceinline__ uint4 ldg4(const void* p) { return __ldcg((const uint4*)p); }
__device__ __forceinline__ float4 ldg4f(const float* p) { return __ldcg((const float4*)p); }

#define LB_MK_TRAP() __trap()
#endif
using gpu::ld_acquire;  // counters and barrier words other blocks released (gpu_compat.h)

// A wait that lasts seconds (a token takes about a millisecond) is a hang: trap, so that the launch fails
// with an error the engine reports instead of blocking forever.
__device__ __forceinline__ void watchdog(long long* t0) {
    const long long now = clock64();
    if (*t0 == 0) *t0 = now;
    else if (now - *t0 > (1ll << 33)) LB_MK_TRAP();  // ~4 s at 2 GHz
}

__device__ __forceinline__ void cp_async4(float* smem_dst, const float* gsrc) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned s = unsigned(__cvta_generic_to_shared(smem_dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(s), "l"(gsrc) : "memory");
#endif
}
// Asks L2 for the 128-byte line holding p (no register, no wait). HIP: nothing.
__device__ __forceinline__ void prefetch_l2(const void* p) {
#if !defined(LB_MK_HIP)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}
__device__ __forceinline__ void cp_async_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_all;" ::: "memory");
#endif
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

// The 8 weights in w times y[0..7], summed in order (the fused out-projections' rows).
__device__ __forceinline__ float dot8(const uint4& w, const float* y) {
    float f[8];
    unpack8(w, f);
    float d = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) d += f[j] * y[j];
    return d;
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

// LB_MK_TRACE: thread 0 of blocks 0 and gridDim/2 record clock64() at every stage boundary (16 per layer,
// then the LM head's start and end) for the tuning record's per-stage breakdown. The default (fused) path
// stamps, in time order: 0 layer start, 1 in prologue, 2 in GEMV + epilogue, 6 mixer inputs ready, 7 mixer
// step (attention: 14 q/k normalised and roped, 15 warp 0's K/V rows done, 7 chunk record published), 8
// (attention: every chunk in) before the out rows, 4 mixer done,
// 5 barrier, 13 MLP start, 9 MLP prologue, 12 gate/up, 10 down + atomics, 11 barrier; the unfused stages use
// 3-14 in numeric order. scripts/device/mk_trace.py names the intervals.
__device__ __forceinline__ void trace(const Params& p, int l, int k) {
    if (!p.trace || threadIdx.x != 0) return;
    const int half = gridDim.x / 2;
    if (blockIdx.x != 0 && int(blockIdx.x) != half) return;
    p.trace[(blockIdx.x ? 1 : 0) * (p.n_layers * 16 + 2) + l * 16 + k] = clock64();
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
    csync();
    float t = 0.f;
#pragma unroll
    for (int w = 0; w < NW; ++w) t += red[w];
    csync();
    return t;
}
__device__ __forceinline__ float silu(float x) { return x / (1.f + __expf(-x)); }
__device__ __forceinline__ float sigm(float x) { return 1.f / (1.f + __expf(-x)); }

// Counters other blocks wait on (grid barrier, per-head counters): one thread adds `n` with release
// semantics (its block's writes, ordered before by a csync, become visible first; no return value to wait
// for), and one thread of each waiting block polls with acquire loads until the count reaches `target`
// (compared modulo 2^32, so a monotonic counter may wrap).
__device__ __forceinline__ void red_release_add(unsigned* c, unsigned n) {
#if defined(LB_MK_HIP)
    __atomic_fetch_add(c, n, __ATOMIC_RELEASE);
#else
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(c), "r"(n) : "memory");
#endif
}
__device__ __forceinline__ void wait_count(const unsigned* c, unsigned target) {
    long long t0 = 0;
    while (int(ld_acquire(c) - target) < 0) watchdog(&t0);
}

// Grid barrier over all blocks of the launch; writes before it are visible to every block after it (reads
// of such data go through L2). One monotonic arrival counter: each block adds 1 with release semantics (no
// return value to wait for) and polls with acquire loads until the count reaches (barriers passed) x
// blocks; the block that finishes the token resets it in lm_finish, when every block is past the last
// barrier.
struct GridBarrier {
    unsigned* bar;  // the arrival count
    unsigned passed = 0;
    __device__ explicit GridBarrier(unsigned* b) : bar(b) {}
    __device__ __forceinline__ void sync() {
        sync([] {});
    }
    // while_waiting() runs on every thread after the block's arrival, off the chain unless this block
    // arrives last: work that must follow the previous barrier and only precede the next one. Its memory
    // operations are not ordered before the arrival.
    template <class F>
    __device__ __forceinline__ void sync(F while_waiting) {
        csync();
        if (threadIdx.x == 0) red_release_add(bar, 1u);
        while_waiting();
        if (threadIdx.x == 0) wait_count(bar, (++passed) * gridDim.x);
        csync();
    }
};

__device__ __forceinline__ void part_range(int n, int b, int nb, int* r0, int* r1) {
    *r0 = int(int64_t(n) * b / nb);
    *r1 = int(int64_t(n) * (b + 1) / nb);
}

// The kernel's run-time switches (Params), or, in the build for the default configuration (kFixed), the
// same names as compile-time constants: that build drops every path the default never takes (unfused
// stages, the f16 KV cache, head_dim > 256) and their branches and
// register spills: 448 -> 247 KB of sm_90 code, no spills, +3% tg128 on an H200 (docs/megakernel.md's
// experiment table). The host runs it whenever the configuration matches (mk_backend.cu; LB_MK_GENERIC=1 runs
// the run-time build instead).
template <bool kFixed>
struct Knobs {
    int fuse, fuse_out, fuse_in, fuse_att, early, kv_f16, dn_whole, att_rows;
    __device__ explicit Knobs(const Params& p)
        : fuse(p.fuse), fuse_out(p.fuse_out), fuse_in(p.fuse_in), fuse_att(p.fuse_att), early(p.early),
          kv_f16(p.kv_f16), dn_whole(p.dn_whole), att_rows(p.att_rows) {}
};
template <>
struct Knobs<true> : DefaultConfig {  // decode_kernel.cuh
    __device__ explicit Knobs(const Params&) {}
};

// ----------------------------------------------------------------------------------------- GEMV pieces

// acc[r] += W_r[k] . x[k] over the 16-byte vectors [k0, k1) of R rows; each lane keeps 4 * R loads in flight.
template <int R>
__device__ __forceinline__ void dot_rows(const uint4* const* rows, int k0, int k1, const float* xs, float* acc) {
    const int lane = threadIdx.x & 31;
    const float4* x4 = reinterpret_cast<const float4*>(xs);
    for (int i = k0 + lane; i < k1; i += 32 * 4) {
        uint4 w[R][4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int idx = i + 32 * u;
#pragma unroll
            for (int r = 0; r < R; ++r) w[r][u] = idx < k1 ? ldw(rows[r] + idx) : make_uint4(0, 0, 0, 0);
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

// Rows [r0, r1) of W [*, K] times xs. Many rows: each warp takes two rows at a time. Few rows (<= NW):
// each row's K is split over S warps (S a power of two) and the parts are summed in shared memory.
// epi(row, value) runs once per row on one lane. Every thread of the block must call this.
template <class Epi>
__device__ __forceinline__ void gemv_rows(const wtype* W, int K, int r0, int r1, const float* xs, float* red, Epi epi) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n = r1 - r0, kv = K / 8;
    if (n > NW) {
        for (int t = warp; 2 * t < n; t += NW) {
            const int ra = r0 + 2 * t, rb = ra + 1;
            float acc[2] = {0.f, 0.f};
            if (rb < r1) {
                const uint4* rows[2] = {(const uint4*)(W + size_t(ra) * K), (const uint4*)(W + size_t(rb) * K)};
                dot_rows<2>(rows, 0, kv, xs, acc);
            } else {
                const uint4* rows[1] = {(const uint4*)(W + size_t(ra) * K)};
                dot_rows<1>(rows, 0, kv, xs, acc);
            }
            acc[0] = warp_sum(acc[0]);
            acc[1] = warp_sum(acc[1]);
            if (lane == 0) {
                epi(ra, acc[0]);
                if (rb < r1) epi(rb, acc[1]);
            }
        }
        return;
    }
    if (n <= 0) return;
    int S = 1;
    while (S < NW && n * S * 2 <= NW) S *= 2;
    const int part = warp % S, rl = warp / S, rpp = NW / S;
    const int per = (kv + S - 1) / S;
    const int k0 = min(kv, part * per), k1 = min(kv, k0 + per);
    for (int base = r0; base < r1; base += rpp) {
        const int row = base + rl;
        float acc = 0.f;
        if (row < r1) {
            const uint4* rows[1] = {(const uint4*)(W + size_t(row) * K)};
            dot_rows<1>(rows, k0, k1, xs, &acc);
        }
        acc = warp_sum(acc);
        if (S == 1) {
            if (lane == 0 && row < r1) epi(row, acc);
        } else {
            if (lane == 0) red[warp] = acc;
            csync();
            if (part == 0 && lane == 0 && row < r1) {
                float s = 0.f;
                for (int q = 0; q < S; ++q) s += red[warp + q];
                epi(row, s);
            }
            csync();
        }
    }
}

// The fused stages sum across blocks in 64-bit fixed point (core/cuda/fixed_point.cuh).
using gpu::from_fix;
using gpu::to_fix;

// xs[0..H) = rmsnorm(v) * gain, v from the residual (other blocks wrote it) or an embedding row. The gains
// are requested together with v (one round trip, not two: under the weight stream each costs ~1-2 us).
// acc, acc2 (fused MLP / out-projection): outputs still in their fixed-point accumulators are added to v;
// `own` then receives v for this block's residual rows [h0, h1).
__device__ __forceinline__ void norm_to_smem(const float* xg, const wtype* erow, int H, const float* gain, float eps,
                                             float* xs, float* red, const unsigned long long* acc = nullptr,
                                             const unsigned long long* acc2 = nullptr, float* own = nullptr,
                                             int h0 = 0, int h1 = 0) {
    constexpr int NR = 8;  // gains a thread keeps in registers (H <= NR * NT); the rest are read late
    float gr[NR];
#pragma unroll
    for (int k = 0; k < NR; ++k) {
        const int i = threadIdx.x + k * NT;
        gr[k] = i < H ? __ldg(gain + i) : 0.f;
    }
    float ss = 0.f;
    for (int i = threadIdx.x; i < H; i += NT) {
        float v = erow ? gpu::w2f(erow[i]) : ldg(xg + i);
        if (acc) v += from_fix(ldcg(acc + i));
        if (acc2) v += from_fix(ldcg(acc2 + i));
        if ((acc || acc2) && own && i >= h0 && i < h1) own[i - h0] = v;
        xs[i] = v;
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum(ss, red) / float(H) + eps);
#pragma unroll
    for (int k = 0; k < NR; ++k) {
        const int i = threadIdx.x + k * NT;
        if (i < H) xs[i] = xs[i] * inv * gr[k];
    }
    for (int i = threadIdx.x + NR * NT; i < H; i += NT) xs[i] = xs[i] * inv * __ldg(gain + i);
    csync();
}

// ----------------------------------------------------------------------------------------- stages

// The in-projection's per-row epilogue. Attention rows are stored (q|gate, k, v); DeltaNet rows finish
// their element-wise work: causal conv + SiLU (conv state advanced), z kept, beta, g.
// pre (optional): the row's conv state (K-1 floats) then its taps (K floats), staged in shared memory.
__device__ __forceinline__ void in_epilogue(const Params& p, const LayerPtrs& L, int r, float v, const float* pre = nullptr) {
    if (L.full) {
        p.buf_in[r] = v;
        return;
    }
    const int cd = p.cd, vd = p.vd, K = p.conv_k;
    if (r < cd) {  // causal depthwise conv over [state (K-1, oldest first), v] + SiLU; state shifts
        float* st = L.conv_state + size_t(r) * (K - 1);
        const float* w = L.conv_w + size_t(r) * K;
        float win[8];  // K <= 8 (checked at load); unrolled so the window stays in registers
        float acc = (pre ? pre[2 * K - 2] : __ldg(w + K - 1)) * v;
#pragma unroll
        for (int j = 0; j < 7; ++j)
            if (j < K - 1) {
                win[j] = pre ? pre[j] : ldcg(st + j);
                acc += (pre ? pre[K - 1 + j] : __ldg(w + j)) * win[j];
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
}

// Stage 0: RMSNorm + in-projection + in_epilogue. erow: layer 0's embedding row (else null); convpre: the
// rows' conv windows staged by conv_prefetch (sm_80+), else null.
// Fused in-projection -> DeltaNet (Params::fuse_in): the block counts its in-projection rows [r0, r1) in on
// the per-value-head counters, thread h for head h, in parallel (each: fence, then add; the csync before
// makes the block's epilogue stores part of what the fence publishes), so a DeltaNet item waits for its
// own head's 2 dk + 2 dv + 2 rows instead of a grid barrier.
__device__ void publish_head_rows(const Params& p, int r0, int r1, unsigned* cnt) {
    const int dk = p.dk, dv = p.dv, kd = p.hk * dk, group = p.hv / p.hk, zb = p.cd + p.vd;
    auto overlap = [&](int a, int b) { return max(0, min(r1, b) - max(r0, a)); };
    for (int h = threadIdx.x; h < p.hv; h += NT) {
        const int kh = h / group;  // q and k rows belong to the key head, shared by `group` value heads
        const int n = overlap(kh * dk, (kh + 1) * dk) + overlap(kd + kh * dk, kd + (kh + 1) * dk) +
                      overlap(2 * kd + h * dv, 2 * kd + (h + 1) * dv) + overlap(p.cd + h * dv, p.cd + (h + 1) * dv) +
                      overlap(zb + h, zb + h + 1) + overlap(zb + p.hv + h, zb + p.hv + h + 1);
        if (n == 0) continue;
        __threadfence();  // each counting thread publishes the block's stores itself (the csync came before)
        atomicAdd(cnt + h, unsigned(n));
    }
}

// Attention layers (Params::fuse_att): KV head g's items need the q|gate rows of the g-th group of q heads
// and g's k and v rows, (2 group + 2) hd rows in all; counted in as publish_head_rows does.
__device__ void publish_kv_head_rows(const Params& p, int r0, int r1, unsigned* cnt) {
    const int hd = p.hd, group = p.nh / p.nkv, kb = 2 * p.nh * hd, vb = kb + p.nkv * hd;
    auto overlap = [&](int a, int b) { return max(0, min(r1, b) - max(r0, a)); };
    for (int g = threadIdx.x; g < p.nkv; g += NT) {
        const int n = overlap(2 * g * group * hd, 2 * (g + 1) * group * hd) + overlap(kb + g * hd, kb + (g + 1) * hd) +
                      overlap(vb + g * hd, vb + (g + 1) * hd);
        if (n == 0) continue;
        __threadfence();
        atomicAdd(cnt + g, unsigned(n));
    }
}

// l: the layer (for LB_MK_TRACE); x: the residual as the previous layer left it; acc/acc2/own/h0/h1: see
// norm_to_smem; in_cnt (fuse_in: DeltaNet layers, and attention layers with fuse_att): the per-head (per KV
// head) counters this block's rows are counted on.
__device__ void stage_in(const Params& p, const LayerPtrs& L, int l, const float* x, const wtype* erow, float* xs, float* red,
                         const float* convpre, const unsigned long long* acc, const unsigned long long* acc2,
                         float* own, int h0, int h1, unsigned* in_cnt) {
    norm_to_smem(x, erow, p.H, L.input_norm, p.eps, xs, red, acc, acc2, own, h0, h1);
    trace(p, l, 1);
    int r0, r1;
    part_range(L.in_rows, blockIdx.x, gridDim.x, &r0, &r1);
    if (convpre) {
        cp_async_wait_all();
        csync();
    }
    auto epilogue = [&](int r, float v) {  // (an attention row's is its store)
        in_epilogue(p, L, r, v, convpre && !L.full && r < p.cd ? convpre + (r - r0) * 16 : nullptr);
    };
    // A DeltaNet row's epilogue (conv1d + SiLU, conv state, gates: ~0.4 us of dependent work, docs/megakernel.md
    // v12) runs after the GEMV, one thread a row in parallel, instead of on lane 0 between a warp's row pairs; the
    // row values wait in xs past the input vector (the host sizes xs for it). Attention rows are only stored.
    float* rowv = xs + p.H;
    gemv_rows(L.in_w, p.H, r0, r1, xs, red, [&](int r, float v) {
        if (L.full) epilogue(r, v);
        else rowv[r - r0] = v;
    });
    if (!L.full) {
        csync();
        for (int i = threadIdx.x; i < r1 - r0; i += NT) epilogue(r0 + i, rowv[i]);
    }
    if (in_cnt) {
        csync();
        if (L.full) publish_kv_head_rows(p, r0, r1, in_cnt);
        else publish_head_rows(p, r0, r1, in_cnt);
    }
}

// Split-K matrix-vector product into the fixed-point accumulator: acc[i] += sum_j coef[j] * rows[j][i] for
// i < H, j < n, where rows are n consecutive rows of a transposed matrix ([K, H], this block's slice of K)
// and coef is in shared memory. Thread (g, c) sums the 8 outputs [8c, 8c + 8) over rows j = g, g + G, ...;
// the G groups meet in `part` ([G][H] floats of shared memory). Every thread of the block must call this.
// A thread requests its first MJ rows at once: a loop with a run-time count compiles to one dependent DRAM
// round trip per leftover iteration (the fused MLP's 27 rows: 7 a thread, 4 round trips).
__device__ void splitk_accumulate(const wtype* rows, int n, const float* coef, int H, float* part,
                                  unsigned long long* acc) {
    constexpr int MJ = 8;
    const int H8 = H / 8, G = max(1, NT / H8);
    for (int t = threadIdx.x; t < G * H8; t += NT) {
        const int g = t / H8, c = t % H8;
        float a8[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        auto add_row = [&](int j, const uint4& w) {
            float f[8];
            unpack8(w, f);
            const float cj = coef[j];
#pragma unroll
            for (int k = 0; k < 8; ++k) a8[k] += cj * f[k];
        };
        uint4 w[MJ];
#pragma unroll
        for (int u = 0; u < MJ; ++u) {
            const int j = g + u * G;
            w[u] = j < n ? ldw(rows + size_t(j) * H + 8 * c) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < MJ; ++u)
            if (g + u * G < n) add_row(g + u * G, w[u]);
        for (int j = g + MJ * G; j < n; j += G) add_row(j, ldw(rows + size_t(j) * H + 8 * c));
#pragma unroll
        for (int k = 0; k < 8; ++k) part[g * H + 8 * c + k] = a8[k];
    }
    csync();
    for (int i = threadIdx.x; i < H; i += NT) {
        float v = 0.f;
        for (int g = 0; g < G; ++g) v += part[g * H + i];
        atomicAdd(acc + i, to_fix(v));  // no return value used: a reduction (RED) at L2
    }
}

// Stage 1 (DeltaNet): item = (value head h, columns [j0, j0 + 16)). Columns of the state are independent:
//   S' = e^g S;  kv = S'^T k;  delta = beta (v - kv);  S'' = S' + k delta^T;  o = S''^T q.
// Thread (rg = tid / 16, c = tid % 16) holds rows rg + 32 r of column j0 + c.
// This block's first item's state can be loaded ahead (deltanet_state_load, before the grid barrier that
// precedes the stage: the state only depends on the previous token) and passed as `pre`.
__device__ __forceinline__ void deltanet_state_load(const Params& p, const LayerPtrs& L, int it, float (&s)[DN_MAXR]) {
    const int per_head = p.dv / DN_COLS;
    const int h = it / per_head, j0 = (it % per_head) * DN_COLS;
    const int c = threadIdx.x & (DN_COLS - 1), rg = threadIdx.x >> 4;
    const float* S = L.ssm + size_t(h) * p.dk * p.dv + j0 + c;
#pragma unroll
    for (int r = 0; r < DN_MAXR; ++r) {
        const int i = rg + 32 * r;
        s[r] = i < p.dk && it < p.hv * per_head ? ldcg(S + size_t(i) * p.dv) : 0.f;
    }
}
// The fused out-projection of one DeltaNet item (head h, column group k of per_head): ys holds its 16
// outputs. The gated RMSNorm needs the head's sum of squares over all per_head groups: each block writes
// its part to head_ss[h][k] and counts itself in (release); once all parts are in (acquire) every block
// of the head sums them in the same order, so the result does not depend on arrival order.
__device__ void out_fused(const Params& p, const LayerPtrs& L, int h, int k, unsigned* cnt, float* ys, float* part,
                          unsigned long long* acc) {
    const int dv = p.dv, per_head = dv / DN_COLS, j0 = k * DN_COLS;
    __shared__ float s_inv;
    if (threadIdx.x == 0) {
        float ss = 0.f;
        for (int j = 0; j < DN_COLS; ++j) ss += ys[j] * ys[j];
        p.head_ss[h * per_head + k] = ss;
        red_release_add(cnt, 1u);
        wait_count(cnt, unsigned(per_head));
        float tot = 0.f;
        for (int q = 0; q < per_head; ++q) tot += ldg(p.head_ss + h * per_head + q);
        s_inv = rsqrtf(tot / float(dv) + p.eps);
    }
    csync();
    if (threadIdx.x < DN_COLS) {
        const int e = h * dv + j0 + threadIdx.x;
        ys[threadIdx.x] = __ldg(L.ssm_norm + j0 + threadIdx.x) * (ys[threadIdx.x] * s_inv) * silu(ldg(p.buf_in + p.cd + e));
    }
    csync();
    splitk_accumulate(L.out_t + size_t(h * dv + j0) * p.H, DN_COLS, ys, p.H, part, acc);
}

// fused (Params::fuse_out, one item per block): the item's 16 outputs go straight through the gated RMSNorm
// and this block's 16 columns of the out-projection (out_t rows) into acc; the head's sum of squares is
// met through a per-head counter (cnt) among the head's blocks instead of a grid barrier. ys: 16 floats,
// part: [G][H] floats of shared memory. in_cnt (fuse_in): the item first waits for its head's
// in-projection rows (publish_head_rows).
__device__ __forceinline__ void stage_deltanet(const Params& p, const LayerPtrs& L, float* aux, const float* pre,
                                               unsigned* cnt = nullptr, unsigned long long* acc = nullptr,
                                               float* ys = nullptr, float* part = nullptr, const unsigned* in_cnt = nullptr) {
    const int nb = gridDim.x, b = blockIdx.x;
    const int dk = p.dk, dv = p.dv, per_head = dv / DN_COLS, items = p.hv * per_head;
    const int group = p.hv / p.hk, kd = p.hk * dk;
    float* qn = aux;            // [dk]
    float* kn = aux + dk;       // [dk]
    float* red1 = kn + dk;      // [NW * 16]
    float* red2 = red1 + NW * DN_COLS;
    float* red = red2 + NW * DN_COLS;  // [2 NW]
    const int c = threadIdx.x & (DN_COLS - 1), rg = threadIdx.x >> 4;  // 32 row groups
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int it = b; it < items; it += nb) {
        const int h = it / per_head, j0 = (it % per_head) * DN_COLS, kh = h / group;
        if (in_cnt) {  // fuse_in: wait for this head's in-projection rows, not for every block
            if (threadIdx.x == 0) wait_count(in_cnt + h, unsigned(2 * dk + 2 * dv + 2));
            csync();
        }
        // every input of the item in one round trip: q, k (other blocks wrote them), g, beta, v, the state
        const float gh = ldg(p.g + h), bt = ldg(p.beta + h);
        const float vj = ldg(p.conv_out + 2 * kd + size_t(h) * dv + j0 + c);
        float s[DN_MAXR];
        if (pre && it == b) {
#pragma unroll
            for (int r = 0; r < DN_MAXR; ++r) s[r] = pre[r];
        } else {
            deltanet_state_load(p, L, it, s);
        }
        float sq = 0.f, sk = 0.f;
        for (int i = threadIdx.x; i < dk; i += NT) {
            const float q = ldg(p.conv_out + size_t(kh) * dk + i);
            const float k = ldg(p.conv_out + kd + size_t(kh) * dk + i);
            qn[i] = q;
            kn[i] = k;
            sq += q * q;
            sk += k * k;
        }
        sq = warp_sum(sq);
        sk = warp_sum(sk);
        if (lane == 0) { red[2 * warp] = sq; red[2 * warp + 1] = sk; }
        csync();
        float tq = 0.f, tk = 0.f;
#pragma unroll
        for (int w = 0; w < NW; ++w) { tq += red[2 * w]; tk += red[2 * w + 1]; }
        const float iq = rsqrtf(tq + 1e-6f) * rsqrtf(float(dk)), ik = rsqrtf(tk + 1e-6f);
        const float decay = expf(gh);
        float* S = L.ssm + size_t(h) * dk * dv + j0 + c;
        float kr[DN_MAXR];
        float kv = 0.f;
#pragma unroll
        for (int r = 0; r < DN_MAXR; ++r) {
            const int i = rg + 32 * r;
            kr[r] = 0.f;
            s[r] *= decay;
            if (i < dk) {
                kr[r] = kn[i] * ik;
                kv += s[r] * kr[r];
            }
        }
        kv += __shfl_xor_sync(0xffffffffu, kv, 16);
        if (lane < DN_COLS) red1[warp * DN_COLS + lane] = kv;
        csync();
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
        csync();
        if (threadIdx.x < DN_COLS) {
            float ot = 0.f;
#pragma unroll
            for (int w = 0; w < NW; ++w) ot += red2[w * DN_COLS + threadIdx.x];
            if (acc) ys[threadIdx.x] = ot;
            else p.o[size_t(h) * dv + j0 + threadIdx.x] = ot;
        }
        csync();
        if (acc) out_fused(p, L, h, it % per_head, cnt + h, ys, part, acc);
    }
}

// Whole-head DeltaNet item (Params::dn_whole, the default; `ar`'s delta_out_kernel design, docs/megakernel.md
// v8). Block b is item (value head h, part k), k < per_head = dv / 16. It runs the head's whole step, the same
// arithmetic as the head's other per_head blocks (the state is read per_head times, from L2 after the first),
// so it has all dv outputs for the gated RMSNorm and waits for no other block's result (the split item above
// meets them through head_ss and a counter: a round trip and the slowest of 8 blocks on the chain). One pass
// over the state gives both products, since with the decayed state g S and u = beta (v - g S^T k):
//   o = (g S + k u^T)^T q = g S^T q + u (k . q).
//   thread (warp w, lane c): state columns 4c .. 4c + 3 at rows w + 16 m, m < 8 (dk = dv = 128, 16 warps).
// Its share of the out-projection: output rows [k W, (k + 1) W) (W = H / per_head) over the head's 128 inputs,
// half a warp a row (16 lanes x 8 inputs), out_proj rows requested before the wait for the head's
// in-projection rows; the sums go to acc as fixed point (16 heads add into each row). The updated state
// columns [16 k, 16 k + 16) go to `slice` (dk x 16 floats); dn_whole_writeback stores them after the next grid
// barrier, when every block of the head has read the old state.
// vecs: 5 x 128 floats of shared memory (q, k, v/u, z, o); red: 2 NW x 128 floats.
constexpr int DNW_D = 128, DNW_M = DNW_D / NW, DNW_MAXP = 4;  // DNW_MAXP: row pairs a warp (W <= 2 NW DNW_MAXP)
__device__ void stage_deltanet_whole(const Params& p, const LayerPtrs& L, int l, float* vecs, float* red, float* slice,
                                     unsigned long long* acc, const unsigned* in_cnt) {
    const int b = blockIdx.x, per_head = p.dv / DN_COLS;
    if (b >= p.hv * per_head) return;
    const int h = b / per_head, k = b % per_head, kh = h / (p.hv / p.hk), kd = p.hk * DNW_D;
    const int W = p.H / per_head, pairs = W / (2 * NW);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, e8 = 8 * (lane & 15);
    // weights and gains first: they depend on nothing this token computed
    uint4 wv[DNW_MAXP];
    const wtype* wrow = L.out_w + size_t(k * W + warp * 2 * pairs + (lane >> 4)) * p.vd + size_t(h) * DNW_D + e8;
#pragma unroll
    for (int i = 0; i < DNW_MAXP; ++i)
        if (i < pairs) wv[i] = ldw(wrow + size_t(2 * i) * p.vd);
    float gain[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) gain[j] = __ldg(L.ssm_norm + e8 + j);
    if (in_cnt) {
        if (tid == 0) wait_count(in_cnt + h, unsigned(4 * DNW_D + 2));
        csync();
    }
    trace(p, l, 6);
    float* qn = vecs;
    float* kn = qn + DNW_D;
    float* vu = kn + DNW_D;  // v, then u
    float* zz = vu + DNW_D;
    float* oo = zz + DNW_D;
    // every input in one round trip: q, k, v, z of the head (a quarter of the threads each), g, beta, the state
    {
        const int vec = tid / DNW_D, e = tid % DNW_D;  // NT = 4 x 128
        const float* src = vec == 0   ? p.conv_out + size_t(kh) * DNW_D
                           : vec == 1 ? p.conv_out + kd + size_t(kh) * DNW_D
                           : vec == 2 ? p.conv_out + 2 * kd + size_t(h) * DNW_D
                                      : p.buf_in + p.cd + size_t(h) * DNW_D;
        vecs[vec * DNW_D + e] = ldg(src + e);
    }
    const float gh = ldg(p.g + h), bt = ldg(p.beta + h);
    const float* S = L.ssm + size_t(h) * DNW_D * DNW_D + 4 * lane;
    float4 s[DNW_M];
#pragma unroll
    for (int m = 0; m < DNW_M; ++m) s[m] = ldg4f(S + size_t(warp + NW * m) * DNW_D);
    csync();
    trace(p, l, 7);
    // the q and k norms and k . q: every warp for itself, no block reduction
    float sq = 0.f, sk = 0.f, qk = 0.f;
    for (int i = lane; i < DNW_D; i += 32) {
        const float q = qn[i], kk = kn[i];
        sq += q * q;
        sk += kk * kk;
        qk += q * kk;
    }
    sq = warp_sum(sq);
    sk = warp_sum(sk);
    qk = warp_sum(qk);
    const float iq = rsqrtf(sq + 1e-6f) * rsqrtf(float(DNW_D)), ik = rsqrtf(sk + 1e-6f);
    const float decay = expf(gh);
    float4 pk = make_float4(0.f, 0.f, 0.f, 0.f), pq = pk;
#pragma unroll
    for (int m = 0; m < DNW_M; ++m) {
        const float kr = kn[warp + NW * m] * ik, qr = qn[warp + NW * m] * iq;
        pk.x += s[m].x * kr; pk.y += s[m].y * kr; pk.z += s[m].z * kr; pk.w += s[m].w * kr;
        pq.x += s[m].x * qr; pq.y += s[m].y * qr; pq.z += s[m].z * qr; pq.w += s[m].w * qr;
    }
    *reinterpret_cast<float4*>(red + warp * DNW_D + 4 * lane) = pk;
    *reinterpret_cast<float4*>(red + (NW + warp) * DNW_D + 4 * lane) = pq;
    csync();
    if (tid < DNW_D) {
        float kv = 0.f, sqv = 0.f;
#pragma unroll
        for (int w = 0; w < NW; ++w) { kv += red[w * DNW_D + tid]; sqv += red[(NW + w) * DNW_D + tid]; }
        const float u = bt * (vu[tid] - decay * kv);
        oo[tid] = decay * sqv + u * (qk * iq * ik);
        vu[tid] = u;
    }
    csync();
    // this item's state columns, decayed and updated, for the write-back after the barrier
    if ((lane >> 2) == k) {
        const float4 u4 = *reinterpret_cast<const float4*>(vu + 4 * lane);
#pragma unroll
        for (int m = 0; m < DNW_M; ++m) {
            const int row = warp + NW * m;
            const float kr = kn[row] * ik;
            const float4 n = make_float4(decay * s[m].x + kr * u4.x, decay * s[m].y + kr * u4.y,
                                         decay * s[m].z + kr * u4.z, decay * s[m].w + kr * u4.w);
            *reinterpret_cast<float4*>(slice + row * DN_COLS + 4 * (lane & 3)) = n;
        }
    }
    // gated RMSNorm over the head's 128 outputs (every warp for itself), then the out-projection rows
    float ss = 0.f;
    for (int i = lane; i < DNW_D; i += 32) ss += oo[i] * oo[i];
    const float inv = rsqrtf(warp_sum(ss) / float(DNW_D) + p.eps);
    float y[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) y[j] = gain[j] * (oo[e8 + j] * inv) * silu(zz[e8 + j]);
    trace(p, l, 8);
#pragma unroll
    for (int i = 0; i < DNW_MAXP; ++i) {
        if (i >= pairs) break;
        float d = dot8(wv[i], y);
#pragma unroll
        for (int o = 8; o; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
        if ((lane & 15) == 0) atomicAdd(acc + k * W + warp * 2 * pairs + 2 * i + (lane >> 4), to_fix(d));
    }
}

// After the grid barrier that follows stage_deltanet_whole: this item's updated state columns to L.ssm.
__device__ __forceinline__ void dn_whole_writeback(const Params& p, const LayerPtrs& L, const float* slice) {
    const int b = blockIdx.x, per_head = p.dv / DN_COLS;
    if (b >= p.hv * per_head) return;
    float* S = L.ssm + size_t(b / per_head) * DNW_D * DNW_D + DN_COLS * (b % per_head);
    for (int t = threadIdx.x; t < DNW_D * (DN_COLS / 4); t += NT) {
        const int row = t / (DN_COLS / 4), q = t % (DN_COLS / 4);
        *reinterpret_cast<float4*>(S + size_t(row) * DNW_D + 4 * q) = *reinterpret_cast<const float4*>(slice + row * DN_COLS + 4 * q);
    }
}

// RoPE of the pair (i, i + rot / 2) of a head row in shared memory (the rotated half of a partial rotary head).
__device__ __forceinline__ void rope_pair(float* dst, int i, int rot, float theta, int pos) {
    const int half = rot / 2;
    const float inv_freq = 1.0f / powf(theta, float(2 * i) / float(rot));
    const float angle = float(pos) * inv_freq;
    float sn, cs;
    sincosf(angle, &sn, &cs);
    const float a = dst[i], bb = dst[i + half];
    dst[i] = a * cs - bb * sn;
    dst[i + half] = bb * cs + a * sn;
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
    csync();
    for (int i = threadIdx.x; i < rot / 2; i += NT) rope_pair(dst, i, rot, theta, pos);
    csync();
}

// head_norm_rope for the q head (threads [0, NT / 2)) and, with ksrc, the KV head's new key (threads [NT / 2, NT))
// at once, for hd <= NT / 2: the rows and their gains requested together, one block reduction for both sums (each
// the same sum, in the same order, as head_norm_rope's), one round trip where the two calls took four. With vsrc
// the key half also loads the new value row: element i of it is returned to thread NT / 2 + i.
__device__ float qk_norm_rope(const float* qsrc, const float* ksrc, const float* vsrc, const float* qgain, const float* kgain,
                              int hd, int rot, float theta, float eps, int pos, float* qdst, float* kdst, float* red) {
    constexpr int HALF = NT / 2;
    const int warp = threadIdx.x >> 5;
    const bool key = threadIdx.x >= HALF;
    const int i = threadIdx.x - (key ? HALF : 0);
    const bool on = i < hd && (!key || ksrc);
    float v = 0.f, g = 0.f, vv = 0.f;
    if (on) {
        v = ldg((key ? ksrc : qsrc) + i);
        g = __ldg((key ? kgain : qgain) + i);
        if (key && vsrc) vv = ldg(vsrc + i);
    }
    const float ss = warp_sum(v * v);
    if ((threadIdx.x & 31) == 0) red[warp] = ss;
    csync();
    float t = 0.f;
#pragma unroll
    for (int w = 0; w < NW / 2; ++w) t += red[(key ? NW / 2 : 0) + w];
    const float inv = rsqrtf(t / float(hd) + eps);
    float* dst = key ? kdst : qdst;
    if (on) dst[i] = v * inv * g;
    csync();
    if (on && i < rot / 2) rope_pair(dst, i, rot, theta, pos);
    csync();
    return vv;
}

// Shared memory of the attention stages (aux): the q head, the new K/V row, per-warp softmax state and
// outputs. The fused stage reuses `wacc` for its merge once the chunk is done.
struct AttAux {
    float *qs, *kn, *vn, *wm, *wl, *red, *wacc;
    __device__ AttAux(float* aux, int hd) {
        qs = aux;            // [hd]
        kn = qs + hd;        // [hd] new key (normed, roped, rounded to the cache type)
        vn = kn + hd;        // [hd] new value (rounded)
        wm = vn + hd;        // [NW]
        wl = wm + NW;        // [NW]
        red = wl + NW;       // [NW]
        wacc = red + NW;     // [NW, hd]
    }
};

// One chunk [s0, s1) of positions for q head h. Each warp runs an online softmax over every NW-th position;
// on return (every thread) M and Lsum are the block's merged max and sum, and chunk_out(e) gives element e of
// the chunk's unnormalised output. The chunk that holds position pos also writes the new K/V row (the
// first q head of each KV group) and uses it from shared memory.
constexpr int ATT_BATCH = 2;  // K/V rows a lane requests at once in attention_chunk (positions x MAXC)
template <int MAXC, class Kn>
__device__ void attention_chunk(const Params& p, const Kn& K, const LayerPtrs& L, int pos, int h, int s0, int s1,
                                const AttAux& a, float* M_out, float* L_out, int l) {
    const int hd = p.hd, nh = p.nh, nkv = p.nkv, group = nh / nkv, kvh = h / group;
    const int ctx = pos + 1;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int chunks8 = hd / 8;
    const size_t row_elems = size_t(nkv) * hd;
    const float scale = rsqrtf(float(hd));
    const float* qkv = p.buf_in;
    const float* ksrc = qkv + size_t(2 * nh) * hd + size_t(kvh) * hd;
    const float* vsrc = qkv + size_t(2 * nh + nkv) * hd + size_t(kvh) * hd;
    const bool new_row = s1 == ctx;  // this chunk holds the new position: its K/V row is computed here
    const bool writer = (h % group) == 0;
    unsigned short* krow = (unsigned short*)L.kc + (size_t(pos) * nkv + kvh) * hd;
    unsigned short* vrow = (unsigned short*)L.vc + (size_t(pos) * nkv + kvh) * hd;
    // q normalised and roped into a.qs; the chunk holding the new position also computes the new K/V row (rounded to
    // the cache type) into a.kn / a.vn, and the first q head of the KV group stores it in the cache.
    auto store_kv = [&](int i, float k, float v) {
        float kb, vb;
        const unsigned short kbits = kv_round(k, K.kv_f16, &kb);
        const unsigned short vbits = kv_round(v, K.kv_f16, &vb);
        a.kn[i] = kb;
        a.vn[i] = vb;
        if (writer) { krow[i] = kbits; vrow[i] = vbits; }
    };
    if (MAXC == 1 || 2 * hd <= NT) {  // MAXC == 1: hd <= 256 (one 8-element chunk a lane)
        const float v = qk_norm_rope(qkv + size_t(h) * 2 * hd, new_row ? ksrc : nullptr, new_row ? vsrc : nullptr, L.q_norm,
                                     L.k_norm, hd, p.rot, p.theta, p.eps, pos, a.qs, a.kn, a.red);
        if (new_row) {
            const int i = threadIdx.x - NT / 2;  // the thread that holds element i of the new row
            if (i >= 0 && i < hd) store_kv(i, a.kn[i], v);
            csync();
        }
    } else {
        head_norm_rope(qkv + size_t(h) * 2 * hd, L.q_norm, hd, p.rot, p.theta, p.eps, pos, a.qs, a.red);
        if (new_row) {
            head_norm_rope(ksrc, L.k_norm, hd, p.rot, p.theta, p.eps, pos, a.kn, a.red);
            for (int i = threadIdx.x; i < hd; i += NT) store_kv(i, a.kn[i], ldg(vsrc + i));
            csync();
        }
    }
    if (K.fuse_att) trace(p, l, 14);  // the fused stage's stamps (slots 14 and 15 are the unfused stages' otherwise)
    float q[MAXC][8], acc[MAXC][8];
#pragma unroll
    for (int m = 0; m < MAXC; ++m) {
        const int e8 = lane + 32 * m;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            q[m][j] = e8 < chunks8 ? a.qs[e8 * 8 + j] : 0.f;
            acc[m][j] = 0.f;
        }
    }
    float mx = -FLT_MAX, lsum = 0.f;
    // A warp's positions s0 + warp + NW i, ATT_BATCH / MAXC at a time: their K and V rows are requested together
    // (one dependent round trip a batch instead of one a position), then folded in order.
    constexpr int U = ATT_BATCH / MAXC > 0 ? ATT_BATCH / MAXC : 1;
    for (int s = s0 + warp; s < s1; s += NW * U) {
        uint4 kraw[U][MAXC], vraw[U][MAXC];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int su = s + NW * u;
            const uint4* kr = (const uint4*)((const unsigned short*)L.kc + (size_t(su) * row_elems + size_t(kvh) * hd));
            const uint4* vr = (const uint4*)((const unsigned short*)L.vc + (size_t(su) * row_elems + size_t(kvh) * hd));
#pragma unroll
            for (int m = 0; m < MAXC; ++m) {
                const int e8 = lane + 32 * m;
                if (su < s1 && su != pos && e8 < chunks8) {
                    kraw[u][m] = ldg4(kr + e8);
                    vraw[u][m] = ldg4(vr + e8);
                } else {
                    kraw[u][m] = make_uint4(0u, 0u, 0u, 0u);
                    vraw[u][m] = kraw[u][m];
                }
            }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int su = s + NW * u;
            if (su >= s1) break;
            float kf[MAXC][8], vf[MAXC][8];
#pragma unroll
            for (int m = 0; m < MAXC; ++m) {
                const int e8 = lane + 32 * m;
                if (e8 < chunks8) {
                    if (su == pos) {  // the new row, from shared memory
#pragma unroll
                        for (int j = 0; j < 8; ++j) { kf[m][j] = a.kn[e8 * 8 + j]; vf[m][j] = a.vn[e8 * 8 + j]; }
                    } else {
                        unpack8_kv(kraw[u][m], kf[m], K.kv_f16);
                        unpack8_kv(vraw[u][m], vf[m], K.kv_f16);
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
    }
    if (K.fuse_att) trace(p, l, 15);  // warp 0's positions done
    if (lane == 0) { a.wm[warp] = mx; a.wl[warp] = lsum; }
#pragma unroll
    for (int m = 0; m < MAXC; ++m) {
        const int e8 = lane + 32 * m;
        if (e8 < chunks8)
#pragma unroll
            for (int j = 0; j < 8; ++j) a.wacc[warp * hd + e8 * 8 + j] = acc[m][j];
    }
    csync();
    float M = -FLT_MAX;
    for (int w = 0; w < NW; ++w) M = fmaxf(M, a.wm[w]);
    float Lsum = 0.f;
    for (int w = 0; w < NW; ++w) Lsum += a.wl[w] * __expf(a.wm[w] - M);
    *M_out = M;
    *L_out = Lsum;
}
__device__ __forceinline__ float chunk_out(const AttAux& a, int hd, float M, int e) {
    float ov = 0.f;
    for (int w = 0; w < NW; ++w) ov += a.wacc[w * hd + e] * __expf(a.wm[w] - M);
    return ov;
}

// Chunks of positions per q head: at least 16 positions each, at most `limit` chunks.
__device__ __forceinline__ void att_chunks(int ctx, int limit, int* nch, int* cs) {
    int n = max(1, min((ctx + 15) / 16, limit));
    *cs = (ctx + n - 1) / n;
    *nch = (ctx + *cs - 1) / *cs;
}

// Stage 1 (full attention). Block b runs at most one chunk of positions of one q head; a head has nch
// chunks (att_chunks, at most blocks / nh).
//  - Unfused: chunk (h, c) = (b / nch, b % nch). The last chunk of a head to finish (atomic ticket) merges
//    the chunks and writes the gated output to p.o for the out-projection stage.
//  - Fused (Params::fuse_att; in_cnt, cnt, acc, ys, part given): no grid barrier before or after. Q head h
//    owns blocks [h bph, (h + 1) bph), bph = blocks / nh, and its first nch blocks run its chunks: each
//    waits for its KV head's in-projection rows (in_cnt), runs its chunk and publishes the record (max,
//    sum, unnormalised output) in att_part, counted in on the head's counter (cnt). Then every block of
//    the head merges its cpb columns of the head output over the chunks, in chunk order (the result does
//    not depend on arrival order), applies the output gate and adds its columns of o_proj (out_t rows
//    h hd + j) times them into acc. Blocks past nh bph have nothing to do in this stage.
//  - att_rows (Params::att_rows, the default where it fits: head_dim 256, at most NW chunks, H / bph <= 4 NW):
//    instead of its columns, every block of the head merges the head's whole output (one thread a column,
//    all chunks' records in one round trip) and applies its H / bph rows of o_proj (out_w, one warp a row of
//    256 inputs, requested before the wait for the other chunks): H / bph atomics a block instead of H.
// One call site for attention_chunk in both modes: two inlined copies cost the kernel registers.
// The fused attention's merge of a q head's chunks for its columns [j0, j0 + nc): every chunk's record (max,
// sum, unnormalised values: hp[k] = [M, L, values of hd columns]) and the output gates in one round trip into
// shared memory (sM, sL: nch floats, sV: nch x nc), then per column the records in chunk order (the result does
// not depend on arrival order), gated: out[j] for j < nc; complete on return.
__device__ __forceinline__ void merge_chunk_records(const float* hp, const float* gate, int hd, int nch, int j0, int nc,
                                                    float* sM, float* sL, float* sV, float* out) {
    const int tid = threadIdx.x;
#pragma unroll 4
    for (int t = tid; t < nch * nc; t += NT) sV[t] = ldg(hp + size_t(t / nc) * (hd + 2) + 2 + j0 + t % nc);
    if (tid < nch) { sM[tid] = ldg(hp + size_t(tid) * (hd + 2)); sL[tid] = ldg(hp + size_t(tid) * (hd + 2) + 1); }
    const float g = tid < nc ? ldg(gate + j0 + tid) : 0.f;
    csync();
    if (tid < nc) {
        float MM = -FLT_MAX;
        for (int k = 0; k < nch; ++k) MM = fmaxf(MM, sM[k]);
        float LL = 0.f, ov = 0.f;
        for (int k = 0; k < nch; ++k) {
            const float w = __expf(sM[k] - MM);
            LL += sL[k] * w;
            ov += sV[k * nc + tid] * w;
        }
        out[tid] = ov / LL * sigm(g);
    }
    csync();
}
constexpr int ATT_ROWS_MAXR = 4;
template <int MAXC, class Kn>
__device__ void stage_attention(const Params& p, const Kn& K, const LayerPtrs& L, int l, int pos, float* aux,
                                const unsigned* in_cnt = nullptr, unsigned* cnt = nullptr,
                                unsigned long long* acc = nullptr, float* ys = nullptr, float* part = nullptr) {
    const int nb = gridDim.x, b = blockIdx.x;
    const int hd = p.hd, nh = p.nh, group = nh / p.nkv, bph = nb / nh;
    const bool fused = acc != nullptr;
    const int ctx = pos + 1;
    int nch, cs;
    att_chunks(ctx, bph, &nch, &cs);
    const int h = fused ? b / bph : b / nch, c = fused ? b % bph : b % nch;
    const bool runs_chunk = fused ? (b < nh * bph && c < nch) : b < nh * nch;
    const AttAux a(aux, hd);
    const float* gate = p.buf_in + size_t(h) * 2 * hd + hd;
    float* hp = p.att_part + size_t(h) * nb * (hd + 2);  // the head's chunk records [nch][hd + 2]
    __shared__ int s_last;
    if (runs_chunk) {
        if (fused) {
            if (threadIdx.x == 0) wait_count(in_cnt + h / group, unsigned((2 * group + 2) * hd));
            csync();
            trace(p, l, 6);
        }
        float M, Lsum;
        attention_chunk<MAXC>(p, K, L, pos, h, c * cs, min(ctx, c * cs + cs), a, &M, &Lsum, l);
        if (!fused && nch == 1) {
            for (int e = threadIdx.x; e < hd; e += NT) p.o[size_t(h) * hd + e] = chunk_out(a, hd, M, e) / Lsum * sigm(ldg(gate + e));
            csync();
            return;
        }
        float* rec = hp + size_t(c) * (hd + 2);
        for (int e = threadIdx.x; e < hd; e += NT) rec[2 + e] = chunk_out(a, hd, M, e);
        if (threadIdx.x == 0) { rec[0] = M; rec[1] = Lsum; }
        if (fused) {
            csync();
            if (threadIdx.x == 0) red_release_add(cnt + h, 1u);
            trace(p, l, 7);
        } else {
            __threadfence();
            csync();
            if (threadIdx.x == 0) s_last = atomicAdd(p.tickets + l * nh + h, 1u) == unsigned(nch - 1);
            csync();
            if (s_last) {
                __threadfence();
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
            csync();
            return;
        }
    }
    if (!fused || b >= nh * bph) return;
    if (K.att_rows) {  // the head's whole output merged here, then this block's H / bph rows of o_proj
        const int Wr = p.H / bph, rpw = Wr / NW, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
        const int row0 = c * Wr + warp * rpw;
        uint4 wv[ATT_ROWS_MAXR];  // requested before the wait for the other chunks: they depend on nothing
        const wtype* wrow = L.out_w + size_t(row0) * L.out_in + size_t(h) * hd + 8 * lane;
#pragma unroll
        for (int i = 0; i < ATT_ROWS_MAXR; ++i)
            if (i < rpw) wv[i] = ldw(wrow + size_t(i) * L.out_in);
        if (tid == 0) wait_count(cnt + h, unsigned(nch));
        csync();
        trace(p, l, 8);
        // the whole head (the chunk is done with wm, wl, wacc and qs): the gated output into qs
        float* yo = a.qs;
        merge_chunk_records(hp, gate, hd, nch, 0, hd, a.wm, a.wl, a.wacc, yo);
        float y[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) y[j] = yo[8 * lane + j];
#pragma unroll
        for (int i = 0; i < ATT_ROWS_MAXR; ++i) {
            if (i >= rpw) break;
            const float d = warp_sum(dot8(wv[i], y));
            if (lane == 0) atomicAdd(acc + row0 + i, to_fix(d));
        }
        return;
    }
    const int cpb = (hd + bph - 1) / bph, j0 = min(hd, c * cpb), nc = min(hd, j0 + cpb) - j0;
    if (nc <= 0) return;
    if (threadIdx.x == 0) wait_count(cnt + h, unsigned(nch));
    csync();
    // these columns (the chunk is done with wacc: [bph] maxima, [bph] sums, [nch][nc] values)
    merge_chunk_records(hp, gate, hd, nch, j0, nc, a.wacc, a.wacc + bph, a.wacc + 2 * bph, ys);
    splitk_accumulate(L.out_t + size_t(h * hd + j0) * p.H, nc, ys, p.H, part, acc);
}

// xs = the out-projection's input: the mixer output, for DeltaNet through the per-head gated RMSNorm.
// z (the gate) is read in the same round trip as o.
__device__ void out_prologue(const Params& p, const LayerPtrs& L, float* xs, float* aux) {
    const int in = L.out_in;
    constexpr int ZR = 8;  // z values a thread keeps in registers (in <= ZR * NT), the rest read later
    float zr[ZR], nr[ZR];  // z and the norm gain of this thread's elements, with o in one round trip
#pragma unroll
    for (int k = 0; k < ZR; ++k) {
        const int e = threadIdx.x + k * NT;
        zr[k] = !L.full && e < in ? ldg(p.buf_in + p.cd + e) : 0.f;
        nr[k] = !L.full && e < in ? __ldg(L.ssm_norm + e % p.dv) : 0.f;
    }
    for (int e = threadIdx.x; e < in; e += NT) xs[e] = ldg(p.o + e);
    csync();
    if (!L.full) {
        const int dv = p.dv;
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
        for (int h = warp; h < p.hv; h += NW) {
            float ss = 0.f;
            for (int j = lane; j < dv; j += 32) ss += xs[h * dv + j] * xs[h * dv + j];
            ss = warp_sum(ss);
            if (lane == 0) aux[h] = rsqrtf(ss / float(dv) + p.eps);
        }
        csync();
#pragma unroll
        for (int k = 0; k < ZR; ++k) {
            const int e = threadIdx.x + k * NT;
            if (e < in) xs[e] = nr[k] * (xs[e] * aux[e / dv]) * silu(zr[k]);
        }
        for (int e = threadIdx.x + ZR * NT; e < in; e += NT) {
            const float z = ldg(p.buf_in + p.cd + e);
            xs[e] = __ldg(L.ssm_norm + e % dv) * (xs[e] * aux[e / dv]) * silu(z);
        }
    }
    csync();
}

// Stage 2: (gated RMSNorm of the DeltaNet output) + out-projection + residual.
// own: this block's rows of the residual (it alone writes them), kept in shared memory.
__device__ void stage_out(const Params& p, const LayerPtrs& L, int l, float* x, float* xs, float* aux, float* red, float* own) {
    out_prologue(p, L, xs, aux);
    trace(p, l, 6);
    int r0, r1;
    part_range(p.H, blockIdx.x, gridDim.x, &r0, &r1);
    gemv_rows(L.out_w, L.out_in, r0, r1, xs, red, [&](int r, float v) {
        own[r - r0] += v;
        x[r] = own[r - r0];
    });
}

// SiLU(gate_r . xs) * (up_r . xs) for rows [r0, r1) of the intermediate, out(r, value) on lane 0.
template <class Out>
__device__ __forceinline__ void gate_up_rows(const Params& p, const LayerPtrs& L, int r0, int r1, const float* xs, Out out) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, kv = p.H / 8;
    for (int r = r0 + warp; r < r1; r += NW) {
        const uint4* rows[2] = {(const uint4*)(L.gate_up + size_t(r) * p.H), (const uint4*)(L.gate_up + size_t(p.I + r) * p.H)};
        float acc[2] = {0.f, 0.f};
        dot_rows<2>(rows, 0, kv, xs, acc);
        acc[0] = warp_sum(acc[0]);
        acc[1] = warp_sum(acc[1]);
        if (lane == 0) out(r, silu(acc[0]) * acc[1]);
    }
}

// Stage 3: RMSNorm + gate/up rows together + SiLU(gate) * up.
__device__ void stage_gate_up(const Params& p, const LayerPtrs& L, int l, const float* x, float* xs, float* red) {
    norm_to_smem(x, nullptr, p.H, L.post_norm, p.eps, xs, red);
    trace(p, l, 9);
    int r0, r1;
    part_range(p.I, blockIdx.x, gridDim.x, &r0, &r1);
    gate_up_rows(p, L, r0, r1, xs, [&](int r, float v) { p.act[r] = v; });
}

// Stage 4: down-projection + residual.
__device__ void stage_down(const Params& p, const LayerPtrs& L, int l, float* x, float* xs, float* red, float* own) {
    for (int e = threadIdx.x; e < p.I; e += NT) xs[e] = ldg(p.act + e);
    csync();
    trace(p, l, 12);
    int r0, r1;
    part_range(p.H, blockIdx.x, gridDim.x, &r0, &r1);
    gemv_rows(L.down, p.I, r0, r1, xs, red, [&](int r, float v) {
        own[r - r0] += v;
        x[r] = own[r - r0];
    });
}

// Stages 3 + 4 fused (LB_MK_FUSE): no grid barrier between gate/up and down. This block's slice [r0, r1) of
// the intermediate (act = SiLU(gate) * up, kept in shared memory) times the matching rows of the transposed
// down-projection (down_t [I, H]) is its share of every one of the H outputs; the shares meet in `acc`
// (64-bit fixed point, see to_fix), which the next stage's prologue adds to the residual.
// out_acc: the fused out-projection's output (null where the layer ran a separate out stage); own/h0/h1:
// this block's residual rows, updated with it.
__device__ void stage_mlp_fused(const Params& p, const LayerPtrs& L, int l, const float* x, float* xs, float* red, float* actv,
                                unsigned long long* acc, const unsigned long long* out_acc, float* own, int h0, int h1) {
    trace(p, l, 13);
    norm_to_smem(x, nullptr, p.H, L.post_norm, p.eps, xs, red, out_acc, nullptr, own, h0, h1);
    trace(p, l, 9);
    int r0, r1;
    part_range(p.I, blockIdx.x, gridDim.x, &r0, &r1);
    const int n = r1 - r0, H = p.H;
    gate_up_rows(p, L, r0, r1, xs, [&](int r, float v) { actv[r - r0] = v; });
    csync();  // actv complete; xs free for the partial sums below
    trace(p, l, 12);
    // this block's rows of the transposed down-projection; xs (with red and aux: the host checks the size)
    // holds the partial sums
    splitk_accumulate(L.down_t + size_t(r0) * H, n, actv, H, xs, acc);
}

// Greedy argmax step: (v, i) replaces (bv, bi) if larger, or equal with a lower index. Starting from
// (-FLT_MAX, INT_MAX), any order of steps gives the sequential scan's winner (NaN never wins).
__device__ __forceinline__ void argmax_take(float& bv, int& bi, float v, int i) {
    if (v > bv || (v == bv && i < bi)) { bv = v; bi = i; }
}
// argmax_take over the warp's lanes: every lane ends with the warp's winner.
__device__ __forceinline__ void warp_argmax(float& bv, int& bi) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        argmax_take(bv, bi, ov, oi);
    }
}

// The argmax's end: every warp's lane 0 holds its (best, bidx); the block's winner goes to lm_val/lm_idx and
// the last block to finish (ticket) reduces over blocks, writes the token and advances the sequence state.
// That reduction ends the token (the next launch waits for it): warp 0 of the last block requests every
// block's winner at once, one round trip (thread 0's scan took nb / 4 dependent ones), and reduces them.
template <class Kn>
__device__ void lm_finish(const Params& p, const Kn& K, int pos, float best, int bidx) {
    const int nb = gridDim.x, b = blockIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __shared__ float s_val[NW];
    __shared__ int s_idx[NW];
    __shared__ int s_last;
    if (lane == 0) { s_val[warp] = best; s_idx[warp] = bidx; }
    csync();
    if (threadIdx.x == 0) {
        float bv = -FLT_MAX;
        int bi = 0x7fffffff;
        for (int w = 0; w < NW; ++w) argmax_take(bv, bi, s_val[w], s_idx[w]);
        p.lm_val[b] = bv;
        p.lm_idx[b] = bi;
        __threadfence();
        s_last = atomicAdd(p.tickets + p.n_layers * p.nh, 1u) == unsigned(nb - 1);
    }
    csync();
    if (!s_last || warp != 0) return;  // s_last is uniform over the block
    __threadfence();
    // Warp 0: up to 8 winners a lane, the step counter and the eos ids requested at once; then a scan of the
    // rest. The token's last work runs on this warp's lanes, not on one thread: the next launch waits for it.
    constexpr int PER = 8;
    float bv = -FLT_MAX, vr[PER];
    int bi = 0x7fffffff, ir[PER];
#pragma unroll
    for (int u = 0; u < PER; ++u) {
        const int k = lane + 32 * u;
        vr[u] = k < nb ? ldg(p.lm_val + k) : -FLT_MAX;
        ir[u] = k < nb ? ldcg(p.lm_idx + k) : 0x7fffffff;
    }
    const int st = *p.step;
    static_assert(MAX_EOS <= 2 * 32, "two eos ids a lane");
    const int eos0 = lane < p.n_eos ? p.eos[lane] : -1, eos1 = lane + 32 < p.n_eos ? p.eos[lane + 32] : -1;
#pragma unroll
    for (int u = 0; u < PER; ++u) argmax_take(bv, bi, vr[u], ir[u]);
    for (int k = lane + 32 * PER; k < nb; k += 32) argmax_take(bv, bi, ldg(p.lm_val + k), ldcg(p.lm_idx + k));
    warp_argmax(bv, bi);
    bi = __shfl_sync(0xffffffffu, bi, 0);
    if (bi == 0x7fffffff) bi = 0;  // all NaN: keep a valid id
    int is_eos = eos0 == bi || eos1 == bi;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) is_eos |= __shfl_xor_sync(0xffffffffu, is_eos, o);
    if (lane == 0) {
        p.out_tokens[st] = bi;
        *p.step = st + 1;
        *p.tok = bi;
        *p.pos = pos + 1;
        if (is_eos) *p.done = 1;
        atomicExch(p.tickets + p.n_layers * p.nh, 0u);
        atomicExch(p.bar, 0u);  // every block is past the token's last grid barrier
    }
    if (K.fuse_out)  // and past every fused out-projection's (and in-projection's) per-head wait
        for (int i = lane; i < p.n_layers * p.hv; i += 32) {
            p.head_cnt[i] = 0u;
            if (K.fuse_in) p.in_cnt[i] = 0u;
        }
    __threadfence();
}

// LM head + greedy argmax (lowest index on ties).
template <class Kn>
__device__ void stage_lm(const Params& p, const Kn& K, int pos, const float* x, float* xs, float* red, const unsigned long long* acc,
                         const unsigned long long* acc2) {
    norm_to_smem(x, nullptr, p.H, p.final_norm, p.eps, xs, red, acc, acc2);
    int r0, r1;
    part_range(p.V, blockIdx.x, gridDim.x, &r0, &r1);
    float best = -FLT_MAX;
    int bidx = 0x7fffffff;
    gemv_rows(p.lm_head, p.H, r0, r1, xs, red, [&](int r, float v) {
        argmax_take(best, bidx, v, r);
    });
    // gemv_rows calls epi on lane 0 of the owning warp (n > NW) or of the part-0 warp (n <= NW).
    lm_finish(p, K, pos, best, bidx);
}

// Stages layer L's conv state and taps for this block's in-projection rows [r0, r1) (DeltaNet rows < cd)
// into shared memory (16 floats per row: K-1 state values, then K taps) with cp.async; they land while
// the block works on the stage before. in_epilogue reads them after cp_async_wait_all and a csync.
__device__ void conv_prefetch(const Params& p, const LayerPtrs& L, int r0, int r1, float* convpre) {
    if (L.full) return;
    const int K = p.conv_k, per = 2 * K - 1, n = min(r1, p.cd) - r0;
    for (int e = threadIdx.x; e < n * per; e += NT) {
        const int i = e / per, j = e % per, r = r0 + i;
        const float* src = j < K - 1 ? L.conv_state + size_t(r) * (K - 1) + j : L.conv_w + size_t(r) * K + (j - (K - 1));
        cp_async4(convpre + i * 16 + j, src);
    }
}

template <bool kFixed>
__global__ void __launch_bounds__(NT, 1) decode_kernel(const Params p) {
    const Knobs<kFixed> K(p);
    extern __shared__ float4 smem4[];
    float* xs = reinterpret_cast<float*>(smem4);
    float* red = xs + p.xs_floats;  // 64 floats
    float* aux = red + 64;
    float* own = aux + p.aux_floats;      // this block's residual rows
    float* convpre = own + p.own_floats;  // conv windows of this block's in-projection rows [row][16]
    float* dnslice = convpre + p.convpre_floats;  // dn_whole: this item's updated state columns [dk][16]
    float* actv = dnslice + p.dnslice_floats;     // LB_MK_FUSE: this block's slice of the MLP activation
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    constexpr bool kConvPre = true;  // cp.async
#else
    constexpr bool kConvPre = false;
#endif
    // The sequence state is requested first and tested last: with the layer table's loads, one round trip.
    const int done = *(volatile int*)p.done, pos = *(volatile int*)p.pos, tok = *(volatile int*)p.tok;
    // Every layer's pointers into shared memory, once a token, in the round trip of the sequence state. Read
    // from global memory, each stage's first use of a layer's fields went to L2 (the entry is used once a
    // token; the layer's other L1 traffic evicts it) on the stage's dependency chain.
    __shared__ LayerPtrs layers[MAX_LAYERS];
    static_assert(sizeof(LayerPtrs) % 8 == 0, "LayerPtrs is copied as 8-byte words");
    for (int i = threadIdx.x; i < p.n_layers * int(sizeof(LayerPtrs) / 8); i += NT)
        reinterpret_cast<unsigned long long*>(layers)[i] = __ldg(reinterpret_cast<const unsigned long long*>(p.layers) + i);
    if (done) return;  // the chain already produced an eos token
    // The token's embedding row (a DRAM miss): asked of L2 as soon as the token is known, so that layer 0's
    // prologue reads it from there.
    if (threadIdx.x * 128 < p.H * int(sizeof(wtype)))
        prefetch_l2(reinterpret_cast<const char*>(p.embed + size_t(tok) * p.H) + threadIdx.x * 128);
    csync();
    const int b = blockIdx.x, nb = gridDim.x, H = p.H;
    int h0, h1, r0, r1;
    part_range(H, b, nb, &h0, &h1);
    GridBarrier gb(p.bar);
    const int n_layers = p.n_layers;
    const bool conv_pre = kConvPre && (K.early & 2), state_pre = K.early & 1;
    auto request_conv_windows = [&](int l) {  // layer l's, for this block's in-projection rows
        if (!conv_pre || l >= n_layers) return;
        part_range(layers[l].in_rows, b, nb, &r0, &r1);
        conv_prefetch(p, layers[l], r0, r1, convpre);
    };
    request_conv_windows(0);
    for (int l = 0; l < n_layers; ++l) {
        const LayerPtrs& L = layers[l];
        trace(p, l, 0);
        // the state of this block's first DeltaNet item: loads in flight through the in-projection
        float spre[DN_MAXR];
        if (state_pre && !L.full && !K.dn_whole) deltanet_state_load(p, L, b, spre);
        // The residual: with fuse_in a DeltaNet layer writes it while slower blocks may still read the
        // previous layer's in their in-projection prologue, so layers alternate between two buffers.
        float* xw = p.x2 && (l & 1) ? p.x2 : p.x;                                   // layer l's
        const float* xr = l > 0 && p.x2 && ((l - 1) & 1) ? p.x2 : (l > 0 ? p.x : xw);  // layer l - 1's
        const bool in_fused_here = K.fuse_in && (!L.full || K.fuse_att);
        const wtype* erow = l == 0 ? p.embed + size_t(tok) * H : nullptr;
        if (erow)  // each block writes its own residual rows (read by others only after the next barrier)
            for (int i = threadIdx.x; i < h1 - h0; i += NT) {
                own[i] = gpu::w2f(erow[h0 + i]);
                xw[h0 + i] = own[i];
            }
        // Fused MLP / out-projection: layer l - 1's outputs are still in their fixed-point accumulators
        // (half (l - 1) % 2 of each; zero where the layer had no such stage).
        const size_t prev = size_t((l + 1) & 1) * H, cur = size_t(l & 1) * H;
        const unsigned long long* mlp_prev = K.fuse && l > 0 ? p.mlp_acc + prev : nullptr;
        const unsigned long long* out_prev = K.fuse_out && l > 0 ? p.out_acc + prev : nullptr;
        unsigned* in_cnt = in_fused_here ? p.in_cnt + size_t(l) * p.hv : nullptr;
        stage_in(p, L, l, xr, erow, xs, red, conv_pre ? convpre : nullptr, mlp_prev, out_prev, own, h0, h1, in_cnt);
        trace(p, l, 2);
        if (!in_fused_here) gb.sync();  // fuse_in: the DeltaNet items wait on their heads' counters instead
        trace(p, l, 3);
        // This layer's MLP half was last read in layer l - 1's prologue: this block clears its rows of it.
        // (Slower blocks may still be reading the other half when fuse_in skipped the barrier above.)
        if (K.fuse)
            for (int i = h0 + threadIdx.x; i < h1; i += NT) p.mlp_acc[cur + i] = 0ull;
        const bool out_fused_here = K.fuse_out && (!L.full || K.fuse_att);
        if (L.full) {
            // fuse_att: as for DeltaNet below, the o_proj output stays in out_acc until the MLP's prologue adds it
            unsigned* cnt = K.fuse_att ? p.head_cnt + size_t(l) * p.hv : nullptr;
            unsigned long long* acc = K.fuse_att ? p.out_acc + cur : nullptr;
            if (K.fuse_att)
                for (int i = threadIdx.x; i < h1 - h0; i += NT) xw[h0 + i] = own[i];
            if (kFixed || p.hd <= DefaultConfig::max_head_dim) stage_attention<1>(p, K, L, l, pos, aux, in_cnt, cnt, acc, actv, xs);
            else stage_attention<ATT_MAXC>(p, K, L, l, pos, aux, in_cnt, cnt, acc, actv, xs);
        } else if (out_fused_here) {
            // the residual as this layer found it: the out-projection's output stays in out_acc until the
            // MLP's prologue adds it (nobody reads xw in this stage)
            for (int i = threadIdx.x; i < h1 - h0; i += NT) xw[h0 + i] = own[i];
            if (K.dn_whole)
                stage_deltanet_whole(p, L, l, xs, aux, dnslice, p.out_acc + cur, in_cnt);
            else
                stage_deltanet(p, L, aux, state_pre ? spre : nullptr, p.head_cnt + size_t(l) * p.hv, p.out_acc + cur,
                               actv, xs, in_cnt);
        } else {
            stage_deltanet(p, L, aux, state_pre ? spre : nullptr);
        }
        trace(p, l, 4);
        // With the fused MLP, the next layer's conv windows are requested while this block waits here (they
        // land during the MLP; stage_in waits for them), not after the barrier on every block's chain.
        gb.sync([&] {
            if (K.fuse) request_conv_windows(l + 1);
        });
        trace(p, l, 5);
        // The whole-head DeltaNet state write-back needs the barrier above (every block of the head has read the
        // old state) and nothing after it before the next token: with the fused MLP it waits for the next barrier.
        const bool writeback = K.dn_whole && out_fused_here && !L.full;
        if (writeback && !K.fuse) dn_whole_writeback(p, L, dnslice);
        if (!out_fused_here) {
            stage_out(p, L, l, xw, xs, aux, red, own);
            trace(p, l, 7);
            gb.sync();
            trace(p, l, 8);
        }
        if (K.fuse) {
            // every block is past layer l's in-projection prologue, the last reader of the out half `prev`
            // (whose next user is layer l + 1's mixer): this block clears its rows of it
            if (K.fuse_out)
                for (int i = h0 + threadIdx.x; i < h1; i += NT) p.out_acc[prev + i] = 0ull;
            stage_mlp_fused(p, L, l, xw, xs, red, actv, p.mlp_acc + cur, out_fused_here ? p.out_acc + cur : nullptr,
                            own, h0, h1);
            trace(p, l, 10);
            gb.sync([&] {
                if (writeback) dn_whole_writeback(p, L, dnslice);
            });
            trace(p, l, 11);
            continue;
        }
        stage_gate_up(p, L, l, xw, xs, red);
        trace(p, l, 10);
        gb.sync();
        trace(p, l, 11);
        request_conv_windows(l + 1);  // they land during the down stage
        stage_down(p, L, l, xw, xs, red, own);
        trace(p, l, 13);
        gb.sync();
        trace(p, l, 14);
    }
    trace(p, p.n_layers, 0);
    const size_t last = size_t((n_layers + 1) & 1) * H;  // the halves the last layer accumulated into
    const float* x_last = p.x2 && n_layers > 0 && ((n_layers - 1) & 1) ? p.x2 : p.x;
    stage_lm(p, K, pos, x_last, xs, red, K.fuse && n_layers > 0 ? p.mlp_acc + last : nullptr,
             K.fuse_out && n_layers > 0 ? p.out_acc + last : nullptr);
    trace(p, p.n_layers, 1);
}

}  // namespace

const void* decode_kernel_ptr(bool fixed) {
    return fixed ? (const void*)decode_kernel<true> : (const void*)decode_kernel<false>;
}

}  // namespace lb::mk
