// The Gated DeltaNet decode step (delta_decode) and the step fused with its gated out-projection
// (delta_out). CPU reference: delta_rule_recurrent, l2norm, gated_rmsnorm, matmul (../cpu/) composed.
#include "common.cuh"

namespace lb::gpu {

namespace {

// Gated DeltaNet decode step; grid (hv, dv / 32), 256 threads. Thread (rg = tid / 8, cq = tid % 8) owns
// columns c0 + 4 cq .. + 3 of the state at rows rg + 32 m (m < MR, dk = 32 MR), held in registers: the
// state slice is read once (before the dependency wait) and written once.
template <int MR>
__global__ __launch_bounds__(256) void delta_decode_kernel(const float* conv, const float* proj, int b_off,
                                                           const float* negA, const float* dt_bias, int hk, int hv,
                                                           int dv, float* state, float* out) {
    constexpr int dk = 32 * MR;
    const int h = blockIdx.x, c0 = blockIdx.y * 32, kh = h / (hv / hk);
    const int tid = threadIdx.x, cq = tid & 7, rg = tid >> 3, lane = tid & 31, warp = tid >> 5;
    float* S = state + size_t(h) * dk * dv + c0 + 4 * cq;
    float4 s[MR];
#pragma unroll
    for (int m = 0; m < MR; ++m) s[m] = *(const float4*)(S + size_t(rg + 32 * m) * dv);
    const float neg_a = negA[h], dtb = dt_bias[h];
    griddep_launch();
    griddep_wait();
    // every input of the step in one round trip: q, k, this thread's v columns, the b and a projections
    const float b = proj[b_off + h], a_raw = proj[b_off + hv + h];
    const float4 v = *(const float4*)(conv + size_t(2 * hk) * dk + size_t(h) * dv + c0 + 4 * cq);
    __shared__ float qs[dk], ks[dk], red[2][8][32], nrm[8][2];
    float sq = 0, sk = 0;
    for (int i = tid; i < dk; i += 256) {
        const float q = conv[size_t(kh) * dk + i], k = conv[size_t(hk) * dk + size_t(kh) * dk + i];
        qs[i] = q;
        ks[i] = k;
        sq += q * q;
        sk += k * k;
    }
    sq = warp_sum(sq);
    sk = warp_sum(sk);
    if (lane == 0) { nrm[warp][0] = sq; nrm[warp][1] = sk; }
    __syncthreads();
    sq = 0; sk = 0;
    for (int w = 0; w < 8; ++w) { sq += nrm[w][0]; sk += nrm[w][1]; }
    const float inv_q = rsqrtf(sq + 1e-6f) * rsqrtf(float(dk)), inv_k = rsqrtf(sk + 1e-6f);
    const float sp = softplus(a_raw + dtb);
    const float beta = sigmoidf(b), decay = __expf(neg_a * sp);
    float kr[MR], qr[MR];
#pragma unroll
    for (int m = 0; m < MR; ++m) { kr[m] = ks[rg + 32 * m] * inv_k; qr[m] = qs[rg + 32 * m] * inv_q; }
    float4 p = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int m = 0; m < MR; ++m) {
        s[m].x *= decay; s[m].y *= decay; s[m].z *= decay; s[m].w *= decay;
        p.x += s[m].x * kr[m]; p.y += s[m].y * kr[m]; p.z += s[m].z * kr[m]; p.w += s[m].w * kr[m];
    }
    for (int o = 8; o < 32; o <<= 1) {
        p.x += __shfl_xor_sync(0xffffffff, p.x, o); p.y += __shfl_xor_sync(0xffffffff, p.y, o);
        p.z += __shfl_xor_sync(0xffffffff, p.z, o); p.w += __shfl_xor_sync(0xffffffff, p.w, o);
    }
    if (lane < 8) *(float4*)&red[0][warp][4 * cq] = p;
    __syncthreads();
    float4 kv = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int w = 0; w < 8; ++w) {
        const float4 r = *(const float4*)&red[0][w][4 * cq];
        kv.x += r.x; kv.y += r.y; kv.z += r.z; kv.w += r.w;
    }
    const float4 u = make_float4(beta * (v.x - kv.x), beta * (v.y - kv.y), beta * (v.z - kv.z), beta * (v.w - kv.w));
    float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int m = 0; m < MR; ++m) {
        s[m].x += kr[m] * u.x; s[m].y += kr[m] * u.y; s[m].z += kr[m] * u.z; s[m].w += kr[m] * u.w;
        o.x += s[m].x * qr[m]; o.y += s[m].y * qr[m]; o.z += s[m].z * qr[m]; o.w += s[m].w * qr[m];
        *(float4*)(S + size_t(rg + 32 * m) * dv) = s[m];
    }
    for (int off = 8; off < 32; off <<= 1) {
        o.x += __shfl_xor_sync(0xffffffff, o.x, off); o.y += __shfl_xor_sync(0xffffffff, o.y, off);
        o.z += __shfl_xor_sync(0xffffffff, o.z, off); o.w += __shfl_xor_sync(0xffffffff, o.w, off);
    }
    if (lane < 8) *(float4*)&red[1][warp][4 * cq] = o;
    __syncthreads();
    if (tid < 8) {
        float4 r = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int w = 0; w < 8; ++w) {
            const float4 q = *(const float4*)&red[1][w][4 * tid];
            r.x += q.x; r.y += q.y; r.z += q.z; r.w += q.w;
        }
        *(float4*)(out + size_t(h) * dv + c0 + 4 * tid) = r;
    }
}

// Gated DeltaNet decode step and its gated out-projection (DeltaOut in gpu_ops.h); grid (hv, R = H / 128),
// 512 threads, dk = dv = 128. In ar's earlier graph the step (delta_decode_kernel) and the out-projection
// (a GATED gemv_fused_kernel) were two kernels with a boundary and three dependent round trips between
// them for 5 MB of bytes; a fusion that split the head over blocks had to exchange the head's sums of
// squares through a counter and gained nothing (docs/archive/engines-tuning-record.md). Here the R blocks of a head each
// run the head's whole step, the same arithmetic on the same inputs (the state is read R times, from L2),
// so each has all 128 outputs for the norm and no block waits for another's result. One pass over the
// state gives both products the step needs, since with the decayed state g S and u = beta (v - g S^T k):
//   o = (g S + k u^T)^T q = g S^T q + u (k . q).
//   thread (warp w, lane c): state columns 4c .. 4c + 3 at rows w + 16 m, m < 8 (registers, read before
//     the dependency wait: an earlier graph launch wrote it); out_proj row r * 128 + tid / 4, columns
//     32 (tid % 4) .. + 31 of the head's 128 (64 bytes in registers, also before the wait).
//   block (h, r) writes back state columns [r 128 / R, (r + 1) 128 / R) only, once every block of the head has
//     used its copy: each block counts itself in on counters[h] after its pass over the state (a ticket),
//     and the writers wait for the count of their round (complete long before in practice).
// At most 80 registers (40 K of an SM's 64 K), so that the next kernel's blocks (the fused MLP: 512 threads,
// 44 registers, 176 KB of shared memory) fit beside a block of this one and start their weight copies early
// (a first version at 120 registers delayed the MLP by 1.5 us a layer: docs/archive/engines-tuning-record.md).
#if defined(LB_CUDA)
#define LB_DO_BOUNDS __maxnreg__(80)
#else
#define LB_DO_BOUNDS __launch_bounds__(512)
#endif
constexpr int DO_THREADS = 512, DO_D = 128, DO_ROWS = 128, DO_WARPS = DO_THREADS / 32, DO_M = DO_D / DO_WARPS;
__global__ LB_DO_BOUNDS void delta_out_kernel(DeltaOut a) {
    const int h = blockIdx.x, r = blockIdx.y, R = gridDim.y, kh = h / (a.hv / a.hk);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    float* S = a.state + size_t(h) * DO_D * DO_D + 4 * lane;
    float4 s[DO_M];
#pragma unroll
    for (int m = 0; m < DO_M; ++m) s[m] = *(const float4*)(S + size_t(warp + DO_WARPS * m) * DO_D);
    const int orow = r * DO_ROWS + tid / 4, oq = tid % 4;
    const uint4* wp = (const uint4*)(a.W + size_t(orow) * a.hv * DO_D + size_t(h) * DO_D + 32 * oq);
    uint4 w[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) w[j] = wp[j];
    const float neg_a = a.negA[h], dtb = a.dt_bias[h], gain = tid < DO_D ? a.gain[tid] : 0.f;
    griddep_launch();
    griddep_wait();

    // one round trip for every input: q, k, v, z (a quarter of the block each), b and a, the folded rows
    __shared__ float qkvz[4][DO_D], us[DO_D], ons[DO_D], nrm[DO_WARPS], kqw[DO_WARPS];
    __shared__ float4 red[2][DO_WARPS][32];
    const int part = tid / DO_D, e = tid % DO_D;
    const float* src = part == 0   ? a.conv + size_t(kh) * DO_D
                       : part == 1 ? a.conv + size_t(a.hk + kh) * DO_D
                       : part == 2 ? a.conv + size_t(2 * a.hk + h) * DO_D
                                   : a.proj + a.z_off + size_t(h) * DO_D;
    const float val = src[e];
    const float b = a.proj[a.b_off + h], a_raw = a.proj[a.b_off + a.hv + h];
    // rows [f0, f1) of the residual: x + fold_a + fold_b, in the order the in-projection summed them
    const int nb = a.hv * R, bi = r * a.hv + h, f0 = int((long long)bi * a.H / nb), f1 = int((long long)(bi + 1) * a.H / nb);
    const bool folds = tid < f1 - f0 && (a.fold_a || a.fold_b);
    float xf = 0.f;
    if (folds) {
        xf = a.x[f0 + tid];
        if (a.fold_a) xf += from_fix(ld_cg(a.fold_a + f0 + tid));
        if (a.fold_b) xf += from_fix(ld_cg(a.fold_b + f0 + tid));
    }
    qkvz[part][e] = val;
    const float sq = warp_sum(part < 2 ? val * val : 0.f);  // warps 0-3: q, 4-7: k
    if (lane == 0) nrm[warp] = sq;
    __syncthreads();
    const float inv_q = rsqrtf(nrm[0] + nrm[1] + nrm[2] + nrm[3] + 1e-6f) * rsqrtf(float(DO_D));
    const float inv_k = rsqrtf(nrm[4] + nrm[5] + nrm[6] + nrm[7] + 1e-6f);
    // the pass over the state: p = S^T k and t = S^T q for this thread's columns over its rows, k . q
    float4 p = make_float4(0.f, 0.f, 0.f, 0.f), t = p;
    float kq = 0.f;
#pragma unroll
    for (int m = 0; m < DO_M; ++m) {
        const float kk = qkvz[1][warp + DO_WARPS * m] * inv_k, qq = qkvz[0][warp + DO_WARPS * m] * inv_q;
        p.x += s[m].x * kk; p.y += s[m].y * kk; p.z += s[m].z * kk; p.w += s[m].w * kk;
        t.x += s[m].x * qq; t.y += s[m].y * qq; t.z += s[m].z * qq; t.w += s[m].w * qq;
        kq += kk * qq;
    }
    red[0][warp][lane] = p;
    red[1][warp][lane] = t;
    if (lane == 0) kqw[warp] = kq;
    __syncthreads();  // every thread has used its state copy: the block's ticket (thread 0 reads it at the end)
    unsigned ticket = 0;
    if (tid == 0) {
        __threadfence();
        ticket = atomicAdd(a.counters + h, 1u);
    }
    const float sp = softplus(a_raw + dtb);
    const float beta = sigmoidf(b), decay = __expf(neg_a * sp);
    // the head's output c = tid < 128 (column c: lane c / 4, component c % 4 of every warp's partials), its
    // sum of squares over warps 0-3, then the gated RMSNorm into ons
    float oc = 0.f;
    if (tid < DO_D) {
        float pc = 0.f, tc = 0.f, kqs = 0.f;
#pragma unroll
        for (int v = 0; v < DO_WARPS; ++v) {
            pc += ((const float*)red[0][v])[tid];
            tc += ((const float*)red[1][v])[tid];
            kqs += kqw[v];
        }
        const float u = beta * (qkvz[2][tid] - decay * pc);
        us[tid] = u;
        oc = decay * tc + u * kqs;
    }
    const float ss = warp_sum(oc * oc);
    if (lane == 0 && warp < DO_D / 32) nrm[warp] = ss;
    __syncthreads();
    if (tid < DO_D) {
        float n2 = 0.f;
#pragma unroll
        for (int v = 0; v < DO_D / 32; ++v) n2 += nrm[v];
        ons[tid] = gain * oc * silu(qkvz[3][tid]) * rsqrtf(n2 / DO_D + a.eps);
    }
    __syncthreads();
    // the out-projection tile: row orow's 32 columns of this thread, summed over the row's 4 threads
    float d = 0.f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        float wf[8];
        unpack8(w[j], wf);
        const float4 xa = ((const float4*)ons)[8 * oq + 2 * j], xb = ((const float4*)ons)[8 * oq + 2 * j + 1];
        d += wf[0] * xa.x + wf[1] * xa.y + wf[2] * xa.z + wf[3] * xa.w + wf[4] * xb.x + wf[5] * xb.y +
             wf[6] * xb.z + wf[7] * xb.w;
    }
    d += __shfl_xor_sync(0xffffffff, d, 1);
    d += __shfl_xor_sync(0xffffffff, d, 2);
    if (oq == 0) atomicAdd(a.acc + orow, to_fix(d));
    if (folds) {
        a.x[f0 + tid] = xf;
        if (a.fold_a) a.fold_a[f0 + tid] = 0ull;
        if (a.fold_b) a.fold_b[f0 + tid] = 0ull;
    }
    // the state, g S + k u^T: this block's columns, once the head's R blocks of this round have counted in
    if (tid == 0) {
        const unsigned target = (ticket / unsigned(R) + 1u) * unsigned(R);
        while (int(ld_acquire(a.counters + h) - target) < 0) {}
    }
    __syncthreads();
    const int cpb = DO_D / R;
    if (4 * lane >= r * cpb && 4 * lane < (r + 1) * cpb) {
        const float4 u = ((const float4*)us)[lane];
#pragma unroll
        for (int m = 0; m < DO_M; ++m) {
            const float kk = qkvz[1][warp + DO_WARPS * m] * inv_k;
            const float4 n = make_float4(decay * s[m].x + kk * u.x, decay * s[m].y + kk * u.y,
                                         decay * s[m].z + kk * u.z, decay * s[m].w + kk * u.w);
            *(float4*)(S + size_t(warp + DO_WARPS * m) * DO_D) = n;
        }
    }
}

}  // namespace

bool delta_decode_ok(int dk, int dv) { return (dk == 128 || dk == 64 || dk == 256) && dv % 32 == 0; }

void delta_decode(const float* conv, const float* proj, int b_off, const float* negA, const float* dt_bias, int hk,
                  int hv, int dk, int dv, float* state, float* out, gpuStream_t s) {
    const dim3 grid(hv, dv / 32);
    switch (dk) {
        case 64: launch_k(delta_decode_kernel<2>, grid, dim3(256), 0, s, conv, proj, b_off, negA, dt_bias, hk, hv, dv, state, out); break;
        case 128: launch_k(delta_decode_kernel<4>, grid, dim3(256), 0, s, conv, proj, b_off, negA, dt_bias, hk, hv, dv, state, out); break;
        case 256: launch_k(delta_decode_kernel<8>, grid, dim3(256), 0, s, conv, proj, b_off, negA, dt_bias, hk, hv, dv, state, out); break;
        default: lb::fail("internal", "delta_decode: unsupported key head dim");
    }
}

bool delta_out_ok(int H, int dk, int dv, int hk, int hv) {
    const int R = H / DO_ROWS;
    return dk == DO_D && dv == DO_D && hk > 0 && hv % hk == 0 && H % DO_ROWS == 0 && R >= 1 && R <= 16 &&
           (DO_D / R) % 4 == 0 && DO_D % R == 0;
}

void delta_out(const DeltaOut& a, gpuStream_t s) {
    if (!delta_out_ok(a.H, DO_D, DO_D, a.hk, a.hv)) lb::fail("internal", "delta_out: unsupported shape");
    launch_k(delta_out_kernel, dim3(a.hv, a.H / DO_ROWS), dim3(DO_THREADS), 0, s, a);
}

}  // namespace lb::gpu
