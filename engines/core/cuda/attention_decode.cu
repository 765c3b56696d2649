// Decode attention for one token: flash-decoding over the cache, and the short-context kernel with the
// attention prologue folded in. CPU reference: ../cpu/attention.cpp (with rope and the norms).
#include "common.cuh"

namespace lb::gpu {

namespace {

// One position of a warp's online softmax for decode attention: the lanes hold PER elements each of the
// (scaled) query q, the position's k and v; m, l and acc (the lane's PER outputs) are updated in place.
template <int PER>
__device__ __forceinline__ void online_softmax_step(const float* q, const float* kf, const float* vf, float& m,
                                                    float& l, float* acc) {
    float d = 0.f;
#pragma unroll
    for (int k = 0; k < PER; ++k) d += q[k] * kf[k];
    const float score = warp_sum(d);
    const float m_new = fmaxf(m, score);
    const float corr = __expf(m - m_new), p = __expf(score - m_new);
    l = l * corr + p;
#pragma unroll
    for (int k = 0; k < PER; ++k) acc[k] = acc[k] * corr + p * vf[k];
    m = m_new;
}

// PER consecutive elements of a KV row starting at e0 (PER a multiple of 4: 16-byte loads of 2-byte types
// where PER is a multiple of 8, 8-byte loads where it is 4, as for head_dim 128). FIX >= 0: the element type
// is DType(FIX), known at compile time, and `t` is ignored: the kernel then holds one path only.
template <int PER, int FIX = -1>
__device__ __forceinline__ void kv_load_run(const void* row, DType t, int e0, float* f) {
    static_assert(PER % 4 == 0, "a lane's run of a KV row is a multiple of 4 elements");
    if (FIX >= 0) t = DType(FIX);
    if (PER % 8 != 0 && (t == DType::BF16 || t == DType::F16)) {  // PER == 4: one 8-byte load
        const uint2 u = *(const uint2*)((const unsigned short*)row + e0);
        if (t == DType::BF16) {
            f[0] = __uint_as_float(u.x << 16);
            f[1] = __uint_as_float(u.x & 0xffff0000u);
            f[2] = __uint_as_float(u.y << 16);
            f[3] = __uint_as_float(u.y & 0xffff0000u);
        } else {
            const __half* hh = (const __half*)&u;
#pragma unroll
            for (int j = 0; j < 4; ++j) f[j] = __half2float(hh[j]);
        }
    } else if (t == DType::BF16) {
#pragma unroll
        for (int c = 0; c < PER / 8; ++c) {
            const uint4 u = ((const uint4*)((const unsigned short*)row + e0))[c];
            const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                f[8 * c + 2 * j] = __uint_as_float(w[j] << 16);
                f[8 * c + 2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
            }
        }
    } else if (t == DType::F16) {
#pragma unroll
        for (int c = 0; c < PER / 8; ++c) {
            const uint4 u = ((const uint4*)((const __half*)row + e0))[c];
            const __half* hh = (const __half*)&u;
#pragma unroll
            for (int j = 0; j < 8; ++j) f[8 * c + j] = __half2float(hh[j]);
        }
    } else if (t == DType::F32) {
#pragma unroll
        for (int c = 0; c < PER / 4; ++c) {
            const float4 u = ((const float4*)((const float*)row + e0))[c];
            f[4 * c] = u.x; f[4 * c + 1] = u.y; f[4 * c + 2] = u.z; f[4 * c + 3] = u.w;
        }
    } else {
#pragma unroll
        for (int k = 0; k < PER; ++k) f[k] = kv_load(row, t, e0 + k);
    }
}

// Flash-decoding attention for one token: grid (nkv, nb), AF_WARPS warps. q heads in qkv at stride qs x hd
// (2: [query, gate] per head, the output times sigmoid(gate); 1: queries only). The context 0..last is cut into
// `active` chunks of `per` = max(AF_MIN_PER, ceil(ctx / nb)) positions, so a short context takes a few blocks
// and a long one all nb; block b < active takes chunk b, the others return at once. Warp w takes positions
// w, w + AF_WARPS, ... of the chunk, U at a time (all U K and V rows requested before any is used, so a lane
// has 2U loads in flight), for all G <= GM query heads of its KV head. The block merges its warps in shared
// memory into one partial (m, l, acc) per query head; the last of the `active` blocks of a KV head (counter)
// merges the partials in block order and applies the sigmoid gate. The split depends only on the context
// length and nb, and every sum runs in a fixed order, so the result is the same whichever block ends last.
// KVF >= 0: K and V are both DType(KVF) (the bf16 default), fixed at compile time. Machine code is time here:
// the kernel runs once a layer, its code cold (the weight stream evicts it from L2), and the version that
// switched on the type at run time (every type's path, unrolled 2U times; 117 KB of sm_90 code against 52 KB
// now) took 17 us a call at short context against ~11 (CUPTI timeline, docs/archive/engines-tuning-record.md).
constexpr int AF_WARPS = 8, AF_MIN_PER = 32, AF_MAX_NB = 256, AF_GMAX = 8;
template <int PER, int GM, int U, int KVF>
__global__ __launch_bounds__(AF_WARPS * 32) void attn_decode_flash_kernel(const float* qkv, int nh, int nkv,
                                                                          const int* d_pos, const void* kcache,
                                                                          DType kt, const void* vcache, DType vt,
                                                                          float* scratch, int* counters, float* out,
                                                                          int qs) {
    constexpr int hd = 32 * PER;
    if (KVF >= 0) kt = vt = DType(KVF);
    __shared__ float s_ml[AF_WARPS][GM][2];
    __shared__ __align__(16) float s_acc[AF_WARPS][hd];
    __shared__ float s_w[GM][AF_MAX_NB];
    __shared__ float s_L[GM];
    __shared__ int s_last;
    griddep_launch();
    griddep_wait();
    const int kvh = blockIdx.x, b = blockIdx.y, nb = gridDim.y;
    const int G = nh / nkv, warp = threadIdx.x / 32, lane = threadIdx.x % 32, e0 = lane * PER;
    const int ctx = *d_pos + 1;
    const int per = max(AF_MIN_PER, (ctx + nb - 1) / nb), active = (ctx + per - 1) / per;
    if (b >= active) return;
    const int p0 = b * per, p1 = min(ctx, p0 + per);

    float q[GM][PER], acc[GM][PER], m[GM], l[GM];
    const float scale = rsqrtf(float(hd));
#pragma unroll
    for (int g = 0; g < GM; ++g) {
        m[g] = -FLT_MAX;
        l[g] = 0.f;
#pragma unroll
        for (int k = 0; k < PER; ++k) {
            q[g][k] = g < G ? qkv[size_t(kvh * G + g) * qs * hd + e0 + k] * scale : 0.f;
            acc[g][k] = 0.f;
        }
    }
    const size_t krow = kv_row_bytes(kt, hd), vrow = kv_row_bytes(vt, hd);
    for (int s = p0 + warp; s < p1; s += U * AF_WARPS) {
        float kf[U][PER], vf[U][PER];
#pragma unroll
        for (int u = 0; u < U; ++u) {  // positions past the chunk load row s again (cached) and are skipped
            const int su = s + u * AF_WARPS < p1 ? s + u * AF_WARPS : s;
            kv_load_run<PER, KVF>((const uint8_t*)kcache + (size_t(su) * nkv + kvh) * krow, kt, e0, kf[u]);
            kv_load_run<PER, KVF>((const uint8_t*)vcache + (size_t(su) * nkv + kvh) * vrow, vt, e0, vf[u]);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (s + u * AF_WARPS >= p1) break;
#pragma unroll
            for (int g = 0; g < GM; ++g) {
                if (g >= G) break;
                online_softmax_step<PER>(q[g], kf[u], vf[u], m[g], l[g], acc[g]);
            }
        }
    }

    // block merge, one query head at a time: the warps' accumulators rescaled to the block maximum, summed
    // in warp order. Partials: acc [nh][nb][hd], then (m, l) [nh][nb][2].
    float* ml = scratch + size_t(nh) * nb * hd;
    if (lane == 0) {
#pragma unroll
        for (int g = 0; g < GM; ++g) { s_ml[warp][g][0] = m[g]; s_ml[warp][g][1] = l[g]; }
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < GM; ++g) {
        if (g >= G) break;
        float M = -FLT_MAX;
#pragma unroll
        for (int w = 0; w < AF_WARPS; ++w) M = fmaxf(M, s_ml[w][g][0]);
        const float f = __expf(m[g] - M);  // 0 for a warp that had no position (m = -FLT_MAX)
#pragma unroll
        for (int k = 0; k < PER; ++k) s_acc[warp][e0 + k] = acc[g][k] * f;
        __syncthreads();
        const int h = kvh * G + g;
#pragma unroll 1  // one pass for hd <= 256; unrolled, this loop was half the kernel's machine code
        for (int e = threadIdx.x; e < hd; e += AF_WARPS * 32) {
            float o = 0.f;
#pragma unroll
            for (int w = 0; w < AF_WARPS; ++w) o += s_acc[w][e];
            scratch[(size_t(h) * nb + b) * hd + e] = o;
        }
        if (threadIdx.x == 0) {
            float L = 0.f;
            for (int w = 0; w < AF_WARPS; ++w) L += s_ml[w][g][1] * __expf(s_ml[w][g][0] - M);
            ml[(size_t(h) * nb + b) * 2] = M;
            ml[(size_t(h) * nb + b) * 2 + 1] = L;
        }
        __syncthreads();
    }
    __threadfence();
    if (threadIdx.x == 0) s_last = atomicAdd(&counters[kvh], 1) == active - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();

    // final merge: warp g computes head g's chunk weights exp(m_p - M) and L; then each thread takes
    // 4 consecutive outputs of one head and sums the chunks in order.
    if (warp < G) {
        const int h = kvh * G + warp;
        const float2* hml = (const float2*)(ml + size_t(h) * nb * 2);
        float M = -FLT_MAX;
        for (int p = lane; p < active; p += 32) M = fmaxf(M, ld_cg(hml + p).x);
        M = warp_max(M);
        float L = 0.f;
        for (int p = lane; p < active; p += 32) {
            const float2 v = ld_cg(hml + p);
            const float w = __expf(v.x - M);
            s_w[warp][p] = w;
            L += v.y * w;
        }
        L = warp_sum(L);
        if (lane == 0) s_L[warp] = L;
    }
    __syncthreads();
#pragma unroll 1
    for (int i = threadIdx.x; i < G * hd / 4; i += AF_WARPS * 32) {
        const int g = i / (hd / 4), e = 4 * (i % (hd / 4)), h = kvh * G + g;
        float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
        const float* part = scratch + size_t(h) * nb * hd + e;
#pragma unroll 8
        for (int p = 0; p < active; ++p) {
            const float w = s_w[g][p];
            const float4 v = ld_cg((const float4*)(part + size_t(p) * hd));
            o.x += w * v.x; o.y += w * v.y; o.z += w * v.z; o.w += w * v.w;
        }
        const float inv = 1.f / s_L[g];
        const float* gate = qkv + size_t(h) * 2 * hd + hd + e;  // qs == 2 only
        float* dst = out + size_t(h) * hd + e;
        if (qs == 2) {
            dst[0] = o.x * inv * sigmoidf(gate[0]);
            dst[1] = o.y * inv * sigmoidf(gate[1]);
            dst[2] = o.z * inv * sigmoidf(gate[2]);
            dst[3] = o.w * inv * sigmoidf(gate[3]);
        } else {
            dst[0] = o.x * inv; dst[1] = o.y * inv; dst[2] = o.z * inv; dst[3] = o.w * inv;
        }
    }
    if (threadIdx.x == 0) counters[kvh] = 0;
}

// Decode attention at a short context with attn_prep folded in (CUDA, bf16 K and V caches, head_dim 256):
// grid nh, one block of AS_WARPS warps per query head, no step across blocks. At a short context the two
// kernels it stands in for (attn_prep, then the flash kernel: chunks, block merge, last-block merge) took
// ~16 us a layer for about 1 us of work (CUPTI timeline, docs/archive/engines-tuning-record.md): a chain of dependent
// round trips and a kernel boundary. Here:
//  - before the dependency wait, each warp requests the K and V rows of its first AS_U cached positions
//    (w, w + AS_WARPS, ...). Safe: the caches up to the step's position and the position itself were
//    written by earlier graph launches (prefill, or the previous step, whose last kernel advances d_pos),
//    which are complete before this launch starts;
//  - after it, one round trip reads the head's q and gate and its KV head's k and v rows; q and k are
//    normalised (gain) and rotated (partial RoPE) in shared memory as attn_prep does, k and v rounded to
//    bf16 as the cache stores them, and the first query head of each KV head writes them to the caches;
//  - each warp runs an online softmax over its positions (the current one, from shared memory, on warp
//    pos % AS_WARPS), and the warps merge in warp order: o = softmax(q K^T / sqrt(hd)) V * sigmoid(gate).
// Positions past the first AS_WARPS * AS_U are loaded batch by batch after the wait (the host takes this
// kernel up to a context of attn_decode_short_ctx()).
constexpr int AS_WARPS = 16, AS_U = 8, AS_HD = 256;
__global__ __launch_bounds__(AS_WARPS * 32) void attn_decode_short_kernel(const float* qkv, int nh, int nkv, int rot,
                                                                          float theta, const float* q_gain,
                                                                          const float* k_gain, float eps,
                                                                          const int* d_pos, unsigned short* kcache,
                                                                          unsigned short* vcache, float* out) {
    constexpr int hd = AS_HD, PER = hd / 32, BATCH = AS_WARPS * AS_U;  // a lane's elements: e0 .. e0 + 7
    __shared__ __align__(16) float sq[hd], sk[hd], sv[hd];
    __shared__ float s_red[AS_WARPS][2], s_ml[AS_WARPS][2];
    __shared__ __align__(16) float s_acc[AS_WARPS][hd];
    const int h = blockIdx.x, G = nh / nkv, kvh = h / G, half = rot / 2;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, e0 = lane * PER;
    const bool el = tid < hd;  // thread tid holds element tid of the q, k, v and gate rows
    const int pos = *d_pos;    // this step's position (see above); the context is pos + 1
    const float gq = el ? q_gain[tid] : 0.f, gk = el ? k_gain[tid] : 0.f;
    const float inv_freq = tid < half ? rope_inv_freq(tid, rot, theta) : 0.f;
    uint4 kr[AS_U], vr[AS_U];
    auto load_batch = [&](int s0) {
#pragma unroll
        for (int u = 0; u < AS_U; ++u) {
            const int s = s0 + warp + u * AS_WARPS;
            if (s < pos) {
                const size_t at = (size_t(s) * nkv + kvh) * hd + e0;
                kr[u] = *(const uint4*)(kcache + at);
                vr[u] = *(const uint4*)(vcache + at);
            }
        }
    };
    load_batch(0);
    griddep_launch();
    griddep_wait();

    const float* qrow = qkv + size_t(h) * 2 * hd;
    const float* krow = qkv + size_t(2) * nh * hd + size_t(kvh) * hd;
    const float* vrow = krow + size_t(nkv) * hd;
    float xq = 0.f, xk = 0.f, xv = 0.f, gate = 0.f;
    if (el) { xq = qrow[tid]; gate = qrow[hd + tid]; xk = krow[tid]; xv = vrow[tid]; }
    {  // the two RMSNorms' sums of squares, one block reduction, warps summed in order
        const float a = warp_sum(xq * xq), b = warp_sum(xk * xk);
        if (lane == 0) { s_red[warp][0] = a; s_red[warp][1] = b; }
        __syncthreads();
        float ssq = 0.f, ssk = 0.f;
#pragma unroll
        for (int w = 0; w < AS_WARPS; ++w) { ssq += s_red[w][0]; ssk += s_red[w][1]; }
        if (el) {
            sq[tid] = xq * rsqrtf(ssq / hd + eps) * gq;
            sk[tid] = xk * rsqrtf(ssk / hd + eps) * gk;
        }
    }
    __syncthreads();
    if (tid < half) {
        float sn, cs;
        sincosf(float(pos) * inv_freq, &sn, &cs);
        // rope_rotate of q and k with all four loads first (two rope_rotate calls schedule differently
        // from the code measured in docs/archive/engines-tuning-record.md; the arithmetic is the same)
        const float qa = sq[tid], qb = sq[tid + half], ka = sk[tid], kb = sk[tid + half];
        sq[tid] = qa * cs - qb * sn;
        sq[tid + half] = qb * cs + qa * sn;
        sk[tid] = ka * cs - kb * sn;
        sk[tid + half] = kb * cs + ka * sn;
    }
    __syncthreads();
    if (el) {  // this position's k and v as the cache holds them
        const unsigned short kb = bf16_bits(sk[tid]), vb = bf16_bits(xv);
        if (h % G == 0) {
            const size_t at = (size_t(pos) * nkv + kvh) * hd + tid;
            kcache[at] = kb;
            vcache[at] = vb;
        }
        sk[tid] = bf16_value(kb);
        sv[tid] = bf16_value(vb);
    }
    __syncthreads();

    const float scale = rsqrtf(float(hd));
    float q[PER], acc[PER], m = -FLT_MAX, l = 0.f;
#pragma unroll
    for (int k = 0; k < PER; ++k) { q[k] = sq[e0 + k] * scale; acc[k] = 0.f; }
    for (int s0 = 0;; s0 += BATCH) {
#pragma unroll
        for (int u = 0; u < AS_U; ++u) {
            if (s0 + warp + u * AS_WARPS >= pos) break;
            float kf[PER], vf[PER];
            unpack8(kr[u], kf);  // wtype is bf16 in every build that takes this kernel (attn_decode_short_ctx)
            unpack8(vr[u], vf);
            online_softmax_step<PER>(q, kf, vf, m, l, acc);
        }
        if (s0 + BATCH >= pos) break;
        load_batch(s0 + BATCH);
    }
    if (warp == pos % AS_WARPS) {
        float kf[PER], vf[PER];
#pragma unroll
        for (int k = 0; k < PER; ++k) { kf[k] = sk[e0 + k]; vf[k] = sv[e0 + k]; }
        online_softmax_step<PER>(q, kf, vf, m, l, acc);
    }

    // the warps' partials rescaled to the block maximum and summed in warp order
    if (lane == 0) { s_ml[warp][0] = m; s_ml[warp][1] = l; }
    __syncthreads();
    float M = -FLT_MAX;
#pragma unroll
    for (int w = 0; w < AS_WARPS; ++w) M = fmaxf(M, s_ml[w][0]);
    const float f = __expf(m - M);  // 0 for a warp that had no position (m = -FLT_MAX)
#pragma unroll
    for (int k = 0; k < PER; ++k) s_acc[warp][e0 + k] = acc[k] * f;
    __syncthreads();
    if (el) {
        float L = 0.f, o = 0.f;
#pragma unroll
        for (int w = 0; w < AS_WARPS; ++w) {
            L += s_ml[w][1] * __expf(s_ml[w][0] - M);
            o += s_acc[w][tid];
        }
        out[size_t(h) * hd + tid] = o / L * sigmoidf(gate);
    }
}

}  // namespace

bool attention_decode_ok(int nh, int nkv, int hd) {
    return nkv > 0 && nh % nkv == 0 && nh / nkv <= AF_GMAX && (hd == 256 || hd == 128);
}
int attention_decode_blocks(int nkv, int max_ctx) {
    (void)max_ctx;
    if (tuning().attn_decode_blocks > 0) return tuning().attn_decode_blocks;
    // one wave: the flash kernel's 8-warp blocks fit one to a multiprocessor
    return std::clamp((dec().sms + nkv - 1) / nkv, 1, AF_MAX_NB);
}
// a partial (acc, then m and l) per query head and block
size_t attention_decode_scratch(int nh, int hd, int blocks) { return size_t(nh) * blocks * (hd + 2); }

void attention_decode(const float* qkv, int nh, int nkv, int hd, const int* d_pos, const void* kcache, DType kt,
                      const void* vcache, DType vt, int blocks, float* scratch, int* counters, float* out,
                      gpuStream_t s, bool gated) {
    if (hd != 256 && hd != 128) lb::fail("internal", "attention_decode: unsupported head dim");
    const dim3 grid(nkv, std::min(blocks, AF_MAX_NB)), block(AF_WARPS * 32);
    const bool wide = nh / nkv > 4;  // GM = 8 slots hold more registers: two positions in flight, not four
    auto go = [&](auto kernel) {
        launch_k(kernel, grid, block, 0, s, qkv, nh, nkv, d_pos, kcache, kt, vcache, vt, scratch, counters, out,
                 gated ? 2 : 1);
    };
    auto pick = [&](auto kvf) {  // kvf: std::integral_constant of the KV type fixed at compile time, or -1
        constexpr int F = decltype(kvf)::value;
        if (hd == 256) wide ? go(attn_decode_flash_kernel<8, 8, 2, F>) : go(attn_decode_flash_kernel<8, 4, 4, F>);
        else wide ? go(attn_decode_flash_kernel<4, 8, 2, F>) : go(attn_decode_flash_kernel<4, 4, 4, F>);
    };
    if (kv_bf16_kernels(kt, vt)) pick(std::integral_constant<int, int(DType::BF16)>{});
    else pick(std::integral_constant<int, -1>{});
}

int attn_decode_short_ctx(int nh, int nkv, int hd, int rot, DType kt, DType vt) {
#if defined(LB_CUDA)
    // the largest context that takes the kernel (Tuning::attn_short_ctx); default two batches
    const int limit = tuning().attn_short_ctx >= 0 ? tuning().attn_short_ctx : 2 * AS_WARPS * AS_U;
    // The kernel decodes the bf16 cache rows with the build's unpack8: bf16 weight builds only (the sm_75
    // build's wtype is half; it keeps the flash path).
#if defined(LB_GPU_FP16)
    constexpr bool bf16_build = false;
#else
    constexpr bool bf16_build = true;
#endif
    const bool fits = bf16_build && hd == AS_HD && nkv > 0 && nh % nkv == 0 && rot % 2 == 0 && rot <= hd &&
                      kv_bf16_kernels(kt, vt);
    return fits ? limit : 0;
#else
    (void)nh; (void)nkv; (void)hd; (void)rot; (void)kt; (void)vt;
    return 0;  // HIP: not ported (the flash path runs)
#endif
}

void attn_decode_short(const float* qkv, int nh, int nkv, int rot, float theta, const float* q_gain,
                       const float* k_gain, float eps, const int* d_pos, void* kcache, void* vcache, float* out,
                       gpuStream_t s) {
    launch_k(attn_decode_short_kernel, dim3(nh), dim3(AS_WARPS * 32), 0, s, qkv, nh, nkv, rot, theta, q_gain, k_gain,
             eps, d_pos, (unsigned short*)kcache, (unsigned short*)vcache, out);
}

}  // namespace lb::gpu
