// GPU versions of the operations in ../cpu/ops.h (same math, same layouts; fp32 activations, weights
// in wtype, fp32 accumulation and fp32 DeltaNet state). Every launcher enqueues on `s` and returns.
// Positions come from device memory (`d_pos`: tokens already in the sequence) so that a decode step
// can be captured once in a graph and replayed.
#pragma once
#include "../quant.h"
#include "gpu_compat.h"

namespace lb::gpu {

// ----------------------------------------------------------------------------------------- device context
// What the ops keep between calls: the device's limits, the decode kernels' launch shapes and the scratch
// buffers that prefill kernels grow. One context per backend (per model), so that two models in one process
// share no buffer: the launchers read the context bound to the calling thread, which each backend binds
// (ContextScope) around every call into the ops. The decode graph and its counters are the backend's own.

// The device's limits and the decode kernels' launch shapes, set by decode_setup.
struct DecodeCfg {
    bool ready = false, pdl = false;
    int sms = 1;
    size_t smem_block = 48 * 1024, smem_sm = 64 * 1024;
    size_t tile = 16 * 1024;  // GEMV weight tile bytes (Tuning::gemv_tile_bytes)
    int max_per_sm = 8;       // GEMV blocks per SM cap (Tuning::gemv_blocks_per_sm)
    int prewait = 1;          // GEMV tiles requested before the dependency wait, of GV_STAGES (Tuning::gemv_prewait)
    size_t mlp_smem_block = 48 * 1024, mlp_static = 0;  // fused MLP: dynamic shared memory a block may take
};

// A device buffer that only grows, for prefill scratch (split-K partials, delta-rule chunk data). Growing
// synchronises the stream and frees the old buffer, so during graph capture it is refused (nullptr) whatever
// its size: a captured graph never holds a pointer that a later growth would free. Callers then fall back.
struct GrowBuffer {
    float* p = nullptr;
    size_t cap = 0;  // floats
    float* get(size_t floats, gpuStream_t s);
    GrowBuffer() = default;
    GrowBuffer(const GrowBuffer&) = delete;
    GrowBuffer& operator=(const GrowBuffer&) = delete;
    ~GrowBuffer();
};

struct DeviceContext {
    explicit DeviceContext(int device);  // reads the device's multiprocessors and shared memory limit
    DeviceContext(const DeviceContext&) = delete;
    DeviceContext& operator=(const DeviceContext&) = delete;
    int device = 0;
    int sms = 1;                 // multiprocessors
    int smem_optin = 48 * 1024;  // the most dynamic shared memory a block may opt into
    DecodeCfg dec;               // decode_setup
    GrowBuffer splitk;           // matmul: split-K partials
    GrowBuffer gemm_x, gemm_w;   // gemm_tc: activations as bf16 (n x in), a bf16 panel of W (~128 MB)
    GrowBuffer delta_prep;       // delta_rule: chunk data (delta_chunk_prep_kernel)
};

// Binds `ctx` to the calling thread for the scope's life (the previous binding comes back after it).
class ContextScope {
public:
    explicit ContextScope(DeviceContext& ctx);
    ~ContextScope();
    ContextScope(const ContextScope&) = delete;
    ContextScope& operator=(const ContextScope&) = delete;

private:
    DeviceContext* prev_;
};
// The context bound to the calling thread; throws EngineError("internal") when there is none.
DeviceContext& context();

void embed(const int* d_tokens, int n, const wtype* E, int H, float* x, gpuStream_t s);
// y[n, out] (=|+=) x[n, in] @ W[out, in]^T: GEMV (128-bit weight loads) for n <= 8, tensor-core GEMM above.
void matmul(const float* x, int n, int in, const wtype* W, int out, float* y, bool accumulate, gpuStream_t s);
void rmsnorm(const float* x, const float* gain, float* y, int rows, int dim, float eps, gpuStream_t s);
// Matrices kept in GGUF's block formats (matmul_quant.cu): q4_K, q5_K, q6_K, q8_0, q4_0, and the backend's wtype
// (DType::BF16, or F16 in an LB_GPU_FP16 build) for the f32/f16/bf16 parts of a matrix stored next to them.
// y[t * ldy + c] (=|+=) x[n, in] @ W[out, in]^T, W rows as the file stores them (dtype_row_bytes(t, in) each):
// a GEMV for n <= kQuantGemvMax, above it tensor-core GEMMs on weights dequantised to bf16 (gemm_tc.cu for
// prefill); q4_K and q6_K take qmv_kernel up to kQuantGemvMax rows and qmma_kernel (CUDA bf16 builds: tensor
// cores on weights dequantised in registers) from there up to kQmmaMaxRows rows; without qmma_kernel (fp16,
// HIP) qmv_kernel up to kQmvMaxRows.
constexpr int kQuantGemvMax = 4;
constexpr int kQmvMaxRows = 32;
constexpr int kQmmaMaxRows = 72;
// From this many rows matmul_quant's GEMM is gemm_tc.cu's (W dequantised to bf16 panels, CUDA), below it
// qgemm_kernel (each block read once per 64 tokens, no bf16 copy of W).
constexpr int kGemmTcMinRows = 64;
#if defined(LB_GPU_FP16)
constexpr DType kWtypeDType = DType::F16;  // wtype as a DType (a run of a matrix converted to it)
#else
constexpr DType kWtypeDType = DType::BF16;
#endif
bool quant_type_ok(DType t);  // a block type matmul_quant reads
// gemv: a test hook (the op check and its --time-quant compare the kernels on one matrix); the engines pass 0,
// the dispatch above. 1: qmv_kernel where it applies (q4_K, q6_K, n <= kQmvMaxRows; 3 / 4: with 2 / 4 rows a
// warp where that applies); 2: qmma_kernel where it applies (q4_K, q6_K, n <= kQmmaMaxRows, CUDA; 5: in one K
// split, as under graph capture, where the partials' scratch cannot grow); 8: neither, the path of the other
// types (qgemv_kernel, qgemm_kernel / gemm_tc above kQuantGemvMax).
void matmul_quant(const float* x, int n, int in, const void* W, DType t, int out, float* y, int ldy, bool accumulate,
                  gpuStream_t s, int gemv = 0);
// One token: y (=|+=) rmsnorm(x, gain, eps) W^T, the norm computed in the GEMV (qmv_kernel; bitwise the
// output of rmsnorm then matmul_quant). swiglu: W is an MLP's gate rows then up rows (out / 2 each) and y gets
// silu(gate) * up (out / 2 floats; bitwise rmsnorm, matmul_quant, silu_mul). false (nothing launched) where
// qmv_kernel does not take W (q4_K / q6_K, in % 256 == 0, in <= 11,264; swiglu: out % 4 == 0, not accumulate).
bool matmul_quant_rmsnorm(const float* x, const float* gain, float eps, int in, const void* W, DType t, int out,
                          float* y, int ldy, bool accumulate, gpuStream_t s, bool swiglu = false);
// embed from a table of block rows.
void embed_quant(const int* d_tokens, int n, const void* E, DType t, int H, float* x, gpuStream_t s);
// y[n, nv * per_head] = x with its value heads reordered grouped -> tiled (llama.cpp's order; see model.h).
void heads_to_tiled(const float* x, int n, int nk, int nv, int per_head, float* y, gpuStream_t s);
// Causal depthwise conv + SiLU over channels [0, C) of x (row stride ldx), state [C, K-1] advanced.
void conv1d_silu(const float* x, int ldx, int n, int C, int K, const float* w, float* state, float* y, gpuStream_t s);
// In place on y = conv output [n, 2*hk*dk + ...]: L2-normalise q and k heads, scale q by 1/sqrt(dk);
// beta = sigmoid(b), g = negA * softplus(a + dt_bias) from the projection rows (b at col b_off, a at b_off + hv).
void deltanet_prep(float* y, int ldy, const float* proj, int ldp, int b_off, const float* negA, const float* dt_bias,
                   int n, int hk, int dk, int hv, float* g, float* beta, gpuStream_t s);
// Chunked gated delta rule (see ../cpu/delta_rule.cpp); n == 1 is the recurrent step.
void delta_rule(const float* qkv, int ld, int n, int hk, int hv, int dk, int dv, const float* g, const float* beta,
                float* state, float* out, gpuStream_t s);
// tiled_nk > 0: each row's heads written in heads_to_tiled's order for tiled_nk key heads (value head
// kh * r + j at j * tiled_nk + kh, r = heads / tiled_nk), so that a tiled out_proj needs no reorder.
void gated_rmsnorm(const float* x, const float* z, int ldz, const float* gain, float* y, int n, int heads, int dim,
                   float eps, gpuStream_t s, int tiled_nk = 0);
// Full attention prologue, in place on qkv rows [n, ld]: per-head RMSNorm of q and k, partial RoPE,
// then K and V appended to the caches at positions *d_pos + t. gated: q_proj rows per head are [query,
// gate] (Qwen3.5); otherwise queries only (Qwen3). K and V follow the q_proj rows.
void attn_prep(float* qkv, int ld, int n, int nh, int nkv, int hd, int rot, float theta, const float* q_gain,
               const float* k_gain, float eps, const int* d_pos, void* kcache, DType kt, void* vcache, DType vt,
               gpuStream_t s, bool gated = true);
// Block-sparse prefill attention (the PFlash drafter's option, docs/engines.md "PFlash"): each query tile of
// the prefill attention kernel (flash_attention_kernel: 128 query vectors, rows = 128 / G rows times the G heads
// of one KV head; the wmma kernel's 64 in fp16 builds) reads only some 128-position key blocks.
// block_sparse_select scores key block j for a tile by mean(tile's queries) . mean(block's cached keys) /
// sqrt(hd) (both rotated) and keeps the first `sinks` blocks, the `recent` blocks up to the tile's own (its
// diagonal), and the blocks whose score is within ln(alpha) of the tile's best, at most ceil(budget x the
// blocks the tile sees) of these (the top-scoring; budget >= 1: no bound); tiles whose last row is at or past
// dense_from read every block. Causal masking inside the kept blocks is unchanged. Scratch (device memory the
// caller owns, sized by size_for):
struct BlockSparse {
    float alpha = 0.85f;
    float budget = 1.f;                 // fraction of the seen key blocks kept beyond sinks and recent (1: no bound)
    int sinks = 2, recent = 4;
    int dense_from = 0;                 // absolute position: query rows from here on attend densely
    int* tiles = nullptr;               // [query tiles, nkv, max_tiles]: kept key tiles (64 positions), ascending
    int* counts = nullptr;              // [query tiles, nkv]
    float* kmean = nullptr;             // [key blocks, nkv, hd]
    unsigned long long* stats = nullptr;  // optional, 2: += key tiles read, key tiles the dense walk reads
    int rows = 0;                       // query rows a tile (set by size_for)
    int max_tiles = 0;
    size_t tiles_ints = 0, counts_ints = 0, kmean_floats = 0;
    void size_for(int chunk, int nh, int nkv, int hd, int ctx);  // sets rows, max_tiles and the three sizes
};
// Fills bs.tiles / bs.counts for the n rows at positions pos0.. (their K already in the cache); false (and
// nothing launched) where attention() would not take the block-sparse kernel for this shape: run it dense.
bool block_sparse_select(const float* qkv, int ld, int n, int nh, int nkv, int hd, bool gated, int pos0,
                         const void* kcache, DType kt, const BlockSparse& bs, gpuStream_t s);
// Device scratch of the split attention forms (flash-decoding for one row, split-KV for a few rows at a long
// context), owned by a forward's or a verify's workspace: `part` holds attention_scratch_floats(nh, nkv, hd)
// floats, enough for any split attention_splits picks and for attention_decode's `decode_blocks`; `counters`
// holds nkv ints, zero at set-up (attention_decode leaves them zero). Nothing is allocated per call, so a
// captured graph may use them.
struct AttnScratch {
    float* part = nullptr;
    size_t floats = 0;
    int* counters = nullptr;
    int decode_blocks = 0;
};
size_t attention_scratch_floats(int nh, int nkv, int hd);  // after decode_setup
// Causal GQA attention (online softmax) of the q heads in qkv over cache rows [0, *d_pos + t], times
// sigmoid(gate) when gated; out [n, nh * hd]. sparse: the tile lists block_sparse_select filled (else dense).
// split (dense only): one row takes attention_decode; more rows take attention_split where attention_splits(n,
// ..., len) gives 2 or more ranges (a few rows after 8 or more key tiles), len being the host's *d_pos (a guess
// that only sets the split count: the kernels read *d_pos). Null: the single-pass kernels.
void attention(const float* qkv, int ld, int n, int nh, int nkv, int hd, const int* d_pos, const void* kcache, DType kt,
               const void* vcache, DType vt, float* out, gpuStream_t s, bool gated = true,
               const BlockSparse* sparse = nullptr, const AttnScratch* split = nullptr, int len = 0);
// Split-KV attention (flash-decoding's split for a few rows): flash_attention_kernel on grid (query tiles,
// nkv, splits), block z over the z-th range of the key tiles before the rows (cache rows [0, p0), seen by
// every row), writes a partial (O, m, l) per row and head to sc.part; then one block per row and head takes
// the rows' own keys p0 + j (j <= t, or visible[t * n + j] where visible, the verify tree's [n, n] mask, is
// given) and merges the ranges in order. p0 = *d_pos, or len where d_pos is null. CUDA bf16 builds, head_dim
// 128 / 256, G <= 16. attention_splits: the ranges for n rows after len cached keys (1: one range, the single
// pass being as good where the caller has it; 0: the split form does not take the shape or the build).
int attention_splits(int n, int nh, int nkv, int hd, int ld, int len);
size_t attention_split_scratch(int n, int nh, int hd, int splits);
void attention_split(const float* qkv, int ld, int n, int nh, int nkv, int hd, const int* d_pos, int len,
                     const void* kcache, DType kt, const void* vcache, DType vt, const unsigned char* visible,
                     int splits, const AttnScratch& sc, float* out, gpuStream_t s, bool gated = true);
// The prefill attention kernels (attention.cu says which serves which shape). attention_with runs a named
// one (fails where it does not take the shape): for the op check and the attention benchmark, which compare
// them; the engines call attention().
enum class AttentionKernel { Auto, Flash, Wmma, Tiled, Rows };
AttentionKernel attention_kernel_for(int n, int nh, int nkv, int hd, int ld);
void attention_with(AttentionKernel k, const float* qkv, int ld, int n, int nh, int nkv, int hd, const int* d_pos,
                    const void* kcache, DType kt, const void* vcache, DType vt, float* out, gpuStream_t s,
                    bool gated = true, const BlockSparse* sparse = nullptr);
void silu_mul(const float* gu, int n, int I, float* out, gpuStream_t s);
// PFlash importance (backend.h, TailScores) of one attention layer: the last n_tail rows of qkv (after
// attn_prep: normalised, rotated; gated as attn_prep's) against cache keys [0, ctx), both un-rotated, at
// positions ctx - n_tail + t and s; probs [n_tail, ctx]. scratch: tail_scores_scratch floats.
size_t tail_scores_scratch(int n_tail, int nh, int hd, int ctx);
void tail_scores(const float* qkv, int ld, bool gated, int n_tail, int nh, int nkv, int hd, int rot, float theta,
                 const void* kcache, DType kt, int ctx, float* scratch, float* probs, gpuStream_t s);
void argmax(const float* x, int n, int* d_out, gpuStream_t s);
// *d_pos += n. host_ring (pinned host memory, or null): *token also goes to host_ring[(new *d_pos - 1) &
// ring_mask] (the unfused decode graph's decode_finish).
void add_pos(int* d_pos, int n, gpuStream_t s, const int* token = nullptr, int* host_ring = nullptr,
             int ring_mask = 0);

// ----------------------------------------------------------------------------------------- fused decode
// One-token (decode) kernels for the captured decode graph. They fuse the norms into the GEMVs and the
// conv into the projection's epilogue, stream weight tiles through shared memory (cp.async, 3 stages)
// and, on sm_90+, use programmatic dependent launch: each kernel prefetches its weights (and the DeltaNet
// state) before waiting for the previous kernel, so launch gaps and ramp-up overlap the previous kernel.

// Reads the device (SM count, shared memory) and the knobs (../tuning.h: gpu_pdl, the GEMV tiles) into the
// bound DeviceContext (below). Call once a context before decode kernels run.
void decode_setup(int device);
bool decode_pdl();

enum GemvPro { GV_PLAIN = 0, GV_RMSNORM = 1, GV_GATED = 2, GV_SILU = 3 };
enum GemvEpi { GV_STORE = 0, GV_ADD = 1, GV_CONV = 2, GV_ARGMAX = 3 };
struct FusedGemv {
    int pro = GV_PLAIN, epi = GV_STORE;
    // input: PLAIN x[in]; RMSNORM rmsnorm(x)*gain; GATED gain[i % head_dim] * rmsnorm_head(x) * silu(z);
    // SILU silu(x[i]) * x[in + i]
    const float* x = nullptr;
    int in = 0;
    const wtype* W = nullptr;  // [out, in]
    int out = 0;
    float* y = nullptr;        // STORE y = Wx; ADD y += Wx; CONV / ARGMAX: y = Wx and more
    const float* gain = nullptr;
    float eps = 0.f;
    const float* z = nullptr;
    int head_dim = 0;
    // CONV: rows < conv_rows also get the causal conv + SiLU into conv_out, conv_state [conv_rows, K-1] advanced
    int conv_rows = 0, conv_k = 0;
    const float* conv_w = nullptr;
    float* conv_state = nullptr;
    float* conv_out = nullptr;
    // ARGMAX: atomicMax of (ordered value << 32 | ~index) into *key (reset by embed_decode)
    unsigned long long* key = nullptr;
    // Fused MLP (mlp_fused): the previous MLP's output still sits in its fixed-point accumulator [out], and
    // after a fused DeltaNet layer (delta_out) that layer's mixer output in a second one.
    // RMSNORM: normalises x + acc + acc2. ADD (fold): y[row] = ((y[row] + fold[row]) + fold2[row]) + Wx, then
    // fold[row] = fold2[row] = 0. Each of the four may be null.
    const unsigned long long* acc = nullptr;
    const unsigned long long* acc2 = nullptr;
    unsigned long long* fold = nullptr;
    unsigned long long* fold2 = nullptr;
};
// Whether gemv_fused handles this shape (in % 8 == 0, the input fits in shared memory).
bool gemv_fused_ok(int in, int pro, int head_dim);
void gemv_fused(const FusedGemv& a, gpuStream_t s);
// embed for one token; also zeroes *key and, when given, the accumulators acc[n_acc * H] (the fused MLP's,
// then the DeltaNet mixers' two).
void embed_decode(const int* d_token, const wtype* E, int H, float* x, unsigned long long* key,
                  unsigned long long* acc, int n_acc, gpuStream_t s);

// The SwiGLU MLP of one token in one kernel (instead of the gate_up and down GEMVs):
//   acc[i] += fix(sum_r down_t[r][i] * silu(gate_r . xs) * (up_r . xs)),  xs = rmsnorm(x) * gain.
// Block b takes a contiguous slice of the I intermediate rows; its gate, up and down_t rows are copied to
// shared memory before the dependency wait (PDL), then act for the slice, then its share of all H outputs,
// added into acc with one 64-bit integer atomic per output: 2^-32 fixed point, so the sum does not depend on
// the order in which blocks finish. acc must be zero on entry; the output reaches the residual through
// FusedGemv::acc (next RMSNORM prologue, LM head) and FusedGemv::fold (next out-projection, which zeroes it).
struct FusedMlp {
    const float* x = nullptr;            // residual [H], complete when the kernel runs
    const unsigned long long* x_acc = nullptr;  // null, or the mixer's output still in its accumulator: x + x_acc
    const float* gain = nullptr;         // post-attention norm [H]
    float eps = 0.f;
    const wtype* gate_up = nullptr;      // [2I, H]: gate rows, then up rows
    const wtype* down_t = nullptr;       // [I, H]: down_proj transposed (gpu::transpose)
    unsigned long long* acc = nullptr;   // [H], zero on entry
    int H = 0, I = 0;
};
bool mlp_fused_ok(int H, int I);  // after decode_setup
void mlp_fused(const FusedMlp& a, gpuStream_t s);
// out[cols, rows] = in[rows, cols]^T (load time: the fused MLP's down_t).
void transpose(const wtype* in, int rows, int cols, wtype* out, gpuStream_t s);
// Gated DeltaNet decode step: conv = conv+SiLU output row [q | k | v] (q, k not yet L2-normalised),
// proj = projection row (b at b_off, a at b_off + hv). out[hv * dv] = S^T q (before the gated norm).
bool delta_decode_ok(int dk, int dv);
void delta_decode(const float* conv, const float* proj, int b_off, const float* negA, const float* dt_bias, int hk,
                  int hv, int dk, int dv, float* state, float* out, gpuStream_t s);
// Gated DeltaNet decode step and its gated out-projection in one kernel, with no block waiting on another's
// result (delta_out_ok: dk = dv = 128, R = H / 128 row groups, R in 1, 2, 4, 8, 16). Block (h, r) runs head
// h's whole step, so it holds the head's outputs for the gated RMSNorm, and adds its 128 x 128 tile of
// out_proj times them into acc (fixed point, like the fused MLP). It also folds rows of the residual:
// x += fold_a + fold_b, which it then zeroes (the accumulators the in-projection added to x). counters: hv
// unsigned a layer, zero at first use (which blocks of a head have used their copy of the state).
struct DeltaOut {
    const float* conv = nullptr;         // conv + SiLU row [q | k | v] (q, k not yet L2-normalised)
    const float* proj = nullptr;         // in-projection row: z at z_off, b at b_off, a at b_off + hv
    int z_off = 0, b_off = 0;
    const float* negA = nullptr;
    const float* dt_bias = nullptr;
    const float* gain = nullptr;         // gated RMSNorm weight [dv]
    float eps = 0.f;
    int hk = 0, hv = 0, H = 0;
    float* state = nullptr;              // [hv, dk, dv] fp32, advanced one step
    const wtype* W = nullptr;            // out_proj [H, hv * dv]
    unsigned long long* acc = nullptr;   // [H], zero on entry: += W o
    float* x = nullptr;                  // residual [H]
    unsigned long long* fold_a = nullptr;
    unsigned long long* fold_b = nullptr;
    unsigned* counters = nullptr;
};
bool delta_out_ok(int H, int dk, int dv, int hk, int hv);
void delta_out(const DeltaOut& a, gpuStream_t s);
// Decode attention (flash-decoding): grid (nkv, blocks); the context is cut into at most `blocks` chunks per
// KV head (fewer for a short context), each block merges its warps, the last block of a KV head merges the
// chunks in order.
// scratch: attention_decode_scratch(nh, hd, blocks) floats; counters: nkv ints, zero at first use.
bool attention_decode_ok(int nh, int nkv, int hd);
int attention_decode_blocks(int nkv, int max_ctx);  // the default `blocks` (after decode_setup)
size_t attention_decode_scratch(int nh, int hd, int blocks);
void attention_decode(const float* qkv, int nh, int nkv, int hd, const int* d_pos, const void* kcache, DType kt,
                      const void* vcache, DType vt, int blocks, float* scratch, int* counters, float* out,
                      gpuStream_t s, bool gated = true);
// Decode attention at a short context with attn_prep folded in (one block per query head, no cross-block
// step; CUDA, bf16 K and V, head_dim 256): o as attention_decode gives it, the caches written as attn_prep
// writes them. attn_decode_short_ctx: the largest context the decode graph should take it for (0: never;
// the attn_short_ctx knob sets it). The kernel reads *d_pos and the cached rows before its dependency wait:
// whatever wrote them must have finished before the launch (in the decode graph: an earlier graph launch).
int attn_decode_short_ctx(int nh, int nkv, int hd, int rot, DType kt, DType vt);
void attn_decode_short(const float* qkv, int nh, int nkv, int rot, float theta, const float* q_gain,
                       const float* k_gain, float eps, const int* d_pos, void* kcache, void* vcache, float* out,
                       gpuStream_t s);
// *d_next = argmax index from *key; *d_pos += 1. host_ring (pinned host memory, or null): the token also
// goes to host_ring[old *d_pos & ring_mask], so that the host reads each step's token without a copy
// between graph launches.
void decode_finish(const unsigned long long* key, int* d_next, int* d_pos, int* host_ring, int ring_mask,
                   gpuStream_t s);

}  // namespace lb::gpu
