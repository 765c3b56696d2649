// The prefill GEMM on the tensor cores, y (=|+=) x W^T for bf16 weights and every GGUF block type the engine
// keeps quantised (CUDA, bf16 builds). CPU reference: ../cpu/matmul.cpp (after decode_row, ../quant.cpp).
//
// Three steps, each at its own hardware limit:
//  1. stage_x_kernel: the fp32 activations rounded to bf16 (round to nearest even, as the older GEMMs did) into
//     scratch, rows of ldk = in rounded up to 8 (zero padding), so that the GEMM reads 16-byte chunks.
//  2. dequant_kernel<T> (quantised W only): a panel of W's rows dequantised to bf16 exactly as ggml does (dq8,
//     quant_blocks.cuh: fp32 d * scale * q - dmin * min, then rounded to bf16), bandwidth-bound. Panels of
//     at most kPanelElems + 256 rows (~128 MB), so a 248,320-row LM head takes a bounded scratch.
//  3. gemm_tc_kernel<BM, BN>: one bf16 GEMM, fp32 accumulation. A CTA of 8 warps (2 x 4) owns a BM x BN tile
//     of y; the K loop runs in steps of 32 through a 4-stage cp.async pipeline in shared memory (rows of 64
//     bytes, the 16-byte chunks XOR-swizzled so that ldmatrix reads are free of bank conflicts); each warp
//     runs mma.sync m16n8k16 on fragments loaded with ldmatrix. Tiles run in groups of kGroupM token tiles
//     (all of a group's tiles of a column band before the next band) so that concurrent CTAs share x and W
//     through L2. Split-K (partials summed in split order: no dependence on scheduling) only when the tiles
//     do not fill the GPU.
// Tile shapes: 128 x 256 (warp tiles 64 x 64) where its tiles fill the GPU, else 128 x 128, else 64 x 128.
//
// Scratch (the device context's GrowBuffers, grown once, kept): gemm_x, n x ldk bf16 (half the fp32 input
// the caller already holds); gemm_w, one panel, ~kPanelElems bf16 (128 MB; none for bf16 W read in place);
// splitk, the partials when split. A GrowBuffer is refused during graph capture: gemm_tc then returns false
// and the caller takes its fallback.
#include "common.cuh"
#include "mma.cuh"
#include "quant_blocks.cuh"

#if defined(LB_CUDA) && !defined(LB_GPU_FP16)

namespace lb::gpu {

namespace {

using bf16 = __nv_bfloat16;
constexpr int BK = 32, STAGES = 4, THREADS = 256, kGroupM = 16;
constexpr size_t kPanelElems = size_t(64) << 20;

__device__ __forceinline__ uint32_t pack_bf16(float a, float b) {
    const __nv_bfloat162 p = __floats2bfloat162_rn(a, b);
    return *(const uint32_t*)&p;
}

// x [n][in] fp32 -> xb [n][ldk] bf16, zeros past in. vec: x 16-byte aligned and in % 4 == 0.
template <bool vec>
__global__ void stage_x_kernel(const float* __restrict__ x, int n, int in, int ldk, bf16* __restrict__ xb) {
    const unsigned per_row = ldk / 8, chunks = unsigned(n) * per_row;  // < 2^32 (gemm_tc checks)
    for (unsigned c = blockIdx.x * blockDim.x + threadIdx.x; c < chunks; c += gridDim.x * blockDim.x) {
        const size_t row = c / per_row;
        const int k = int(c % per_row) * 8;
        const float* src = x + row * in + k;
        float v[8];
        if (vec && k + 8 <= in) {
            const float4 a = *(const float4*)src, b = *(const float4*)(src + 4);
            v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
        } else {
#pragma unroll
            for (int i = 0; i < 8; ++i) v[i] = k + i < in ? src[i] : 0.f;
        }
        *(uint4*)(xb + row * ldk + k) = make_uint4(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]), pack_bf16(v[4], v[5]),
                                                   pack_bf16(v[6], v[7]));
    }
}

template <DType T>
size_t wrow_bytes(int in) {
    if constexpr (T == kWtypeDType) return size_t(in) * sizeof(wtype);
    else return dtype_row_bytes(T, size_t(in));
}

// rows x in of W (type T, rows of rb bytes) -> wb [rows][ldk] bf16 (zeros past in), 8 elements a thread.
// For wtype rows (a bf16 matrix whose rows are not 16-byte aligned) a plain element copy.
template <DType T>
__global__ void dequant_kernel(const uint8_t* __restrict__ W, size_t rb, int rows, int in, int ldk, bf16* __restrict__ wb) {
    const unsigned per_row = ldk / 8, chunks = unsigned(rows) * per_row;  // <= kPanelElems / 8
    for (unsigned c = blockIdx.x * blockDim.x + threadIdx.x; c < chunks; c += gridDim.x * blockDim.x) {
        const size_t row = c / per_row;
        const int k = int(c % per_row) * 8;
        float v[8];
        if constexpr (T == kWtypeDType) {
            const wtype* w = (const wtype*)(W + row * rb);
#pragma unroll
            for (int i = 0; i < 8; ++i) v[i] = k + i < in ? w2f(w[k + i]) : 0.f;
        } else {
            dq8<T>(W + row * rb, k, v);  // in % 32 == 0: no padding
        }
        *(uint4*)(wb + row * ldk + k) = make_uint4(pack_bf16(v[0], v[1]), pack_bf16(v[2], v[3]), pack_bf16(v[4], v[5]),
                                                   pack_bf16(v[6], v[7]));
    }
}

__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
// Byte offset of 16-byte chunk c (0..3) of row r in a tile of 64-byte rows: the chunk XOR (r / 2) % 4, so
// that the 8 rows an ldmatrix reads at one chunk fall in 8 distinct 16-byte bank groups.
__device__ __forceinline__ uint32_t swz(int r, int c) { return uint32_t(r * 64 + ((c ^ ((r >> 1) & 3)) << 4)); }

template <int BM, int BN>
constexpr size_t smem_bytes() { return size_t(STAGES) * (BM + BN) * BK * sizeof(bf16); }

// y[m * ldy + c] (=|+=) sum_k A[m][k] B[c][k] for m < M, c < N, k < K; A rows of lda bf16, B rows of ldb
// (lda, ldb, K multiples of 8). Grid: (tiles, K splits); a split takes K steps [z * ksteps, (z + 1) * ksteps)
// and, when part is set, writes its partial sums to part[z][M][N] instead of y.
template <int BM, int BN>
__global__ __launch_bounds__(THREADS, BN == 256 ? 1 : 2) void gemm_tc_kernel(
    const bf16* __restrict__ A, int lda, const bf16* __restrict__ B, int ldb, int M, int N, int K,
    float* __restrict__ y, int ldy, bool accumulate, int ksteps, float* __restrict__ part) {
    constexpr int WM = BM / 2, WN = BN / 4, MI = WM / 16, NI = WN / 8;
    extern __shared__ __align__(128) unsigned char smem[];
    const uint32_t s0 = uint32_t(__cvta_generic_to_shared(smem));
    constexpr uint32_t kA = BM * BK * 2, kStage = (BM + BN) * BK * 2;

    // tile of this block: groups of kGroupM token tiles, column bands in order inside a group
    const int tiles_m = (M + BM - 1) / BM, tiles_n = (N + BN - 1) / BN;
    const int b = blockIdx.x, per_group = kGroupM * tiles_n, group = b / per_group;
    const int first_m = group * kGroupM, gsize = min(kGroupM, tiles_m - first_m), in_group = b % per_group;
    const int m0 = (first_m + in_group % gsize) * BM, n0 = (in_group / gsize) * BN;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int wm = warp >> 2, wn = warp & 3;
    const int ktiles = (K + BK - 1) / BK, kt0 = blockIdx.y * ksteps, kt1 = min(ktiles, kt0 + ksteps);

    auto load = [&](int stage, int kt) {
        const int k0 = kt * BK;
        const uint32_t sa = s0 + stage * kStage, sb = sa + kA;
#pragma unroll
        for (int i = 0; i < BM * 4 / THREADS; ++i) {
            const int idx = tid + i * THREADS, r = idx >> 2, c = idx & 3;
            const bool ok = m0 + r < M && k0 + 8 * c < K;
            cp_async16(sa + swz(r, c), ok ? A + size_t(m0 + r) * lda + k0 + 8 * c : A, ok);
        }
#pragma unroll
        for (int i = 0; i < BN * 4 / THREADS; ++i) {
            const int idx = tid + i * THREADS, r = idx >> 2, c = idx & 3;
            const bool ok = n0 + r < N && k0 + 8 * c < K;
            cp_async16(sb + swz(r, c), ok ? B + size_t(n0 + r) * ldb + k0 + 8 * c : B, ok);
        }
    };

    float acc[MI][NI][4];
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;

#pragma unroll
    for (int st = 0; st < STAGES - 1; ++st) {
        if (kt0 + st < kt1) load(st, kt0 + st);
        cp_async_commit();
    }
    // ldmatrix rows: A x4 = rows 0-15 of a 16 x 16 block (lanes 0-15: k chunk 0, lanes 16-31: chunk 1);
    // B x4 = two n8 tiles (lanes 0-7, 8-15: first tile, k chunks 0, 1; lanes 16-31: second tile)
    const int a_row = wm * WM + (lane & 15), a_c = lane >> 4;
    const int b_row = wn * WN + (lane & 7) + ((lane >> 4) << 3), b_c = (lane >> 3) & 1;
    for (int kt = kt0; kt < kt1; ++kt) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();  // the stage about to be refilled was read by every warp in the previous iteration
        const int nxt = kt + STAGES - 1;
        if (nxt < kt1) load((nxt - kt0) % STAGES, nxt);
        cp_async_commit();
        const uint32_t sa = s0 + ((kt - kt0) % STAGES) * kStage, sb = sa + kA;
#pragma unroll
        for (int kk = 0; kk < BK / 16; ++kk) {
            uint32_t af[MI][4], bfr[NI][2];
#pragma unroll
            for (int i = 0; i < MI; ++i) ldmatrix_x4(af[i], sa + swz(a_row + 16 * i, 2 * kk + a_c));
#pragma unroll
            for (int j = 0; j < NI / 2; ++j) {
                uint32_t r[4];
                ldmatrix_x4(r, sb + swz(b_row + 16 * j, 2 * kk + b_c));
                bfr[2 * j][0] = r[0]; bfr[2 * j][1] = r[1]; bfr[2 * j + 1][0] = r[2]; bfr[2 * j + 1][1] = r[3];
            }
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < NI; ++j) mma_bf16_16816(acc[i][j], af[i], bfr[j][0], bfr[j][1]);
        }
    }
    cp_async_wait<0>();

    // C fragment: acc[i][j][0, 1]: row lane / 4, columns 2 (lane % 4) + 0, 1 of the 16 x 8 block; [2, 3]: row + 8
    // a lane's two columns are written as one float2 where the row start keeps them 8-byte aligned
    float* dst0 = part ? part + size_t(blockIdx.y) * M * N : y;
    const int ld = part ? N : ldy;
    const bool acc_y = accumulate && !part, pair = ((uintptr_t(dst0) | (size_t(ld) * 4)) & 7) == 0;
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int m = m0 + wm * WM + 16 * i + (lane >> 2) + 8 * h;
                const int c = n0 + wn * WN + 8 * j + 2 * (lane & 3);
                if (m >= M || c >= N) continue;
                float* dst = dst0 + size_t(m) * ld + c;
                float v0 = acc[i][j][2 * h], v1 = acc[i][j][2 * h + 1];
                if (pair && c + 1 < N) {
                    if (acc_y) {
                        const float2 o = *(const float2*)dst;
                        v0 += o.x;
                        v1 += o.y;
                    }
                    *(float2*)dst = make_float2(v0, v1);
                } else {
                    dst[0] = acc_y ? dst[0] + v0 : v0;
                    if (c + 1 < N) dst[1] = acc_y ? dst[1] + v1 : v1;
                }
            }
}

// y[m * ldy + c] (+)= sum over z of part[z][m][c], in split order.
__global__ void splitk_sum_kernel(const float* __restrict__ part, int splits, int M, int N, float* __restrict__ y,
                                  int ldy, bool accumulate) {
    const size_t count = size_t(M) * N;
    for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += size_t(gridDim.x) * blockDim.x) {
        const size_t m = i / N, c = i % N;
        float a = accumulate ? y[m * ldy + c] : 0.f;
        for (int z = 0; z < splits; ++z) a += part[size_t(z) * count + i];
        y[m * ldy + c] = a;
    }
}

unsigned grid_for(size_t work, int threads) {
    return unsigned(std::min<size_t>((work + threads - 1) / threads, size_t(context().sms) * 16));
}

template <int BM, int BN>
void run_gemm(const bf16* A, int lda, const bf16* B, int ldb, int M, int N, int K, float* y, int ldy, bool accumulate,
              gpuStream_t s) {
    const int tiles = ((M + BM - 1) / BM) * ((N + BN - 1) / BN), ktiles = (K + BK - 1) / BK;
    // split while the tiles leave multiprocessors idle: one 128 x 256 CTA a multiprocessor fits, two of the others
    int splits = splitk_count(tiles, ktiles, 8, BN == 256 ? 1 : 2);
    float* part = nullptr;
    if (splits > 1 && !(part = context().splitk.get(size_t(splits) * M * N, s))) splits = 1;
    const int ksteps = (ktiles + splits - 1) / splits;
    splits = (ktiles + ksteps - 1) / ksteps;  // no empty split
    launch_smem(gemm_tc_kernel<BM, BN>, dim3(tiles, splits), dim3(THREADS), smem_bytes<BM, BN>(), s, A, lda, B, ldb,
                M, N, K, y, ldy, accumulate, ksteps, splits > 1 ? part : nullptr);
    if (splits > 1)
        splitk_sum_kernel<<<grid_for(size_t(M) * N, 256), 256, 0, s>>>(part, splits, M, N, y, ldy, accumulate);
}

void gemm_bf16(const bf16* A, int lda, const bf16* B, int ldb, int M, int N, int K, float* y, int ldy, bool accumulate,
               gpuStream_t s) {
    const int sms = context().sms;
    auto tiles = [&](int bm, int bn) { return ((M + bm - 1) / bm) * ((N + bn - 1) / bn); };
    if (M > 64 && tiles(128, 256) >= sms) return run_gemm<128, 256>(A, lda, B, ldb, M, N, K, y, ldy, accumulate, s);
    if (M > 64 && tiles(128, 128) >= sms) return run_gemm<128, 128>(A, lda, B, ldb, M, N, K, y, ldy, accumulate, s);
    run_gemm<64, 128>(A, lda, B, ldb, M, N, K, y, ldy, accumulate, s);
}

template <DType T>
void dequant(const uint8_t* W, int rows, int in, int ldk, bf16* wb, gpuStream_t s) {
    dequant_kernel<T><<<grid_for(size_t(rows) * (ldk / 8), 256), 256, 0, s>>>(W, wrow_bytes<T>(in), rows, in, ldk, wb);
}

}  // namespace

int splitk_count(int tiles, int ksteps, int min_ksteps, int per_sm) {
    if (tuning().gemm_splitk_per_sm == 0 || tiles >= per_sm * context().sms) return 1;
    return std::max(1, std::min({(per_sm * context().sms + tiles - 1) / std::max(1, tiles), ksteps / min_ksteps, 8}));
}

bool gemm_tc(const float* x, int n, int in, const void* W, DType t, int out, float* y, int ldy, bool accumulate,
             gpuStream_t s) {
    DeviceContext& ctx = context();
    const int ldk = (in + 7) / 8 * 8;
    // bf16 rows read in place when they are 16-byte chunks; any other W goes through the panel
    const bool direct = t == kWtypeDType && in % 8 == 0 && (uintptr_t(W) & 15) == 0;
    if (size_t(n) * ldk / 8 >= (size_t(1) << 32)) return false;  // stage_x_kernel's 32-bit chunk index
    // the fewest panels under kPanelElems, of equal rows (a multiple of 256, the widest tile), so that no
    // panel is a sliver that leaves most of the GPU idle
    const size_t npanels = direct ? 1 : std::max<size_t>(1, (size_t(out) * ldk + kPanelElems - 1) / kPanelElems);
    const int panel = direct ? out : int(std::min<size_t>(out, ((out + npanels - 1) / npanels + 255) / 256 * 256));
    bf16* xb = (bf16*)ctx.gemm_x.get((size_t(n) * ldk + 1) / 2, s);
    bf16* wb = direct ? nullptr : (bf16*)ctx.gemm_w.get((size_t(panel) * ldk + 1) / 2, s);
    if (!xb || (!direct && !wb)) return false;
    if ((uintptr_t(x) & 15) == 0 && in % 4 == 0)
        stage_x_kernel<true><<<grid_for(size_t(n) * (ldk / 8), 256), 256, 0, s>>>(x, n, in, ldk, xb);
    else
        stage_x_kernel<false><<<grid_for(size_t(n) * (ldk / 8), 256), 256, 0, s>>>(x, n, in, ldk, xb);
    const uint8_t* w = (const uint8_t*)W;
    for (int r0 = 0; r0 < out; r0 += panel) {
        const int rows = std::min(panel, out - r0);
        const bf16* B = (const bf16*)(w + size_t(r0) * in * sizeof(wtype));
        if (!direct) {
            switch (t) {
                case DType::Q4_K: dequant<DType::Q4_K>(w + size_t(r0) * wrow_bytes<DType::Q4_K>(in), rows, in, ldk, wb, s); break;
                case DType::Q5_K: dequant<DType::Q5_K>(w + size_t(r0) * wrow_bytes<DType::Q5_K>(in), rows, in, ldk, wb, s); break;
                case DType::Q6_K: dequant<DType::Q6_K>(w + size_t(r0) * wrow_bytes<DType::Q6_K>(in), rows, in, ldk, wb, s); break;
                case DType::Q8_0: dequant<DType::Q8_0>(w + size_t(r0) * wrow_bytes<DType::Q8_0>(in), rows, in, ldk, wb, s); break;
                case DType::Q4_0: dequant<DType::Q4_0>(w + size_t(r0) * wrow_bytes<DType::Q4_0>(in), rows, in, ldk, wb, s); break;
                default:
                    if (t != kWtypeDType) fail("unsupported", std::string("gemm_tc: element type ") + dtype_name(t));
                    dequant<kWtypeDType>(w + size_t(r0) * wrow_bytes<kWtypeDType>(in), rows, in, ldk, wb, s);
            }
            B = wb;
        }
        gemm_bf16(xb, ldk, B, direct ? in : ldk, n, rows, in, y + r0, ldy, accumulate, s);
    }
    return true;
}

}  // namespace lb::gpu

#endif
