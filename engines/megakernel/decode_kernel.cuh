// The persistent decode kernel: one launch = one token through all layers, the LM head and the argmax.
//
// Work split. Every stage spreads its rows (or heads) over all resident blocks; stages that depend on a
// whole vector produced by the previous one are separated by a grid barrier; a stage whose result is a
// reduction over blocks (attention chunks, the argmax) finishes it in the last block to arrive (an atomic
// ticket), which needs no barrier. Per layer:
//   0 in-proj   RMSNorm (recomputed per block) + GEMV of lin_in / attn_qkv; DeltaNet rows finish in place:
//               conv1d + SiLU (conv state advanced), z kept, beta = sigmoid(b), g = -A softplus(a + dt_bias)
//   1 mixer     DeltaNet: (head, 16 value columns) per block: q/k L2 norm, state decay, delta update, output
//               attention: (q head, chunk of positions) per block, split softmax merged by the last chunk
//               (fused, the default: every block of a q head merges its columns and applies them to o_proj)
//   2 out-proj  gated RMSNorm (DeltaNet) + GEMV out_proj / o_proj, residual add
//   3 gate_up   RMSNorm + GEMV of gate and up rows together, SiLU(gate) * up
//   4 down      GEMV down_proj, residual add
// then the LM head (RMSNorm + GEMV over the vocabulary, per-block argmax, last block reduces).
// By default stages fuse (Params::fuse, fuse_out, fuse_in, fuse_att): every layer runs in-proj -> mixer +
// out-proj (per-head counters, no grid barrier) -> barrier -> gate/up + down -> barrier: 48 barriers a token.
//
// Memory. Weights are read once with 128-bit non-coherent loads that skip L1 (ld.global.nc.L1::no_allocate);
// activations written by other blocks in this launch are read through L2 (ld.global.cg) since L1 is not
// coherent. While a stage runs, each block asks L2 for its share of the NEXT stage's weights (and DeltaNet
// state / KV rows), so DRAM keeps streaming while blocks wait at the barrier.
#pragma once
#include <cfloat>
#include <cstdint>

#include "core/cuda/gpu_compat.h"

namespace lb::mk {

using gpu::wtype;

constexpr int NT = 512;          // threads per block
constexpr int NW = NT / 32;      // warps per block
constexpr int DN_COLS = 16;      // DeltaNet value columns per work item
constexpr int DN_MAXR = 4;       // DeltaNet key rows per thread (dk <= 32 * DN_MAXR)
constexpr int ATT_MAXC = 2;      // 8-element chunks of a head row per lane (head_dim <= 512)
constexpr int MAX_LAYERS = 64;   // the v1 kernel keeps every layer's LayerPtrs in shared memory
constexpr int MAX_EOS = 64;      // eos ids a decode chain stops on (the last block's warp 0 holds two a lane)

struct LayerPtrs {
    int full;
    const float* input_norm;
    const float* post_norm;
    const wtype* in_w;   // lin_in [lin_in_rows, H] or attn_qkv [attn_qkv_rows, H]
    int in_rows;
    const wtype* out_w;  // out_proj [H, vd] or o_proj [H, nh*hd]
    int out_in;
    const wtype* gate_up;  // [2I, H]
    const wtype* down;     // [H, I]
    const wtype* down_t;   // [I, H]: down transposed (fused MLP only, else null)
    const wtype* out_t;    // out_proj [vd, H] / o_proj [nh hd, H] transposed (fused out-projection / attention only, else null)
    // DeltaNet
    const float* conv_w;   // [cd, K]
    const float* neg_A;    // [hv]
    const float* dt_bias;  // [hv]
    const float* ssm_norm; // [dv]
    float* ssm;            // [hv, dk, dv]
    float* conv_state;     // [cd, K-1]
    // attention
    const float* q_norm;   // [hd]
    const float* k_norm;   // [hd]
    void* kc;              // [max_ctx, nkv, hd] (bf16 or f16)
    void* vc;
};

struct Params {
    const LayerPtrs* layers;  // [n_layers] in device memory (the v1 kernel copies it into shared memory a token)
    int n_layers;
    const wtype* embed;
    const wtype* lm_head;
    const float* final_norm;
    int H, I, V;
    int hk, hv, dk, dv, conv_k, cd, vd;
    int nh, nkv, hd, rot;
    float theta, eps;
    int kv_f16;  // KV element type: 0 bf16, 1 f16
    int xs_floats;  // shared-memory vector length (floats)
    int aux_floats;  // shared-memory scratch of the mixer stages (floats)
    int early;       // loads issued a stage early: bit 0 DeltaNet state, bit 1 conv windows (DefaultConfig::early)
    int own_floats;     // shared memory: this block's residual rows
    int convpre_floats; // shared memory: conv windows of this block's in-projection rows
    // Fused MLP (default; LB_MK_FUSE=0 turns it off): gate/up and down in one stage, the down-projection
    // split over the intermediate (down_t) and summed in mlp_acc; one grid barrier per layer fewer.
    int fuse;
    unsigned long long* mlp_acc;  // [2][H] fixed-point MLP outputs (fuse), layer l uses half l % 2
    // Fused DeltaNet out-projection (default with the fused MLP; LB_MK_FUSE_OUT=0 turns it off): the mixer
    // stage's blocks apply the gated RMSNorm and their columns of out_proj to their own outputs, so the
    // DeltaNet layer has no out stage (3 grid barriers instead of 4). Needs one item per block.
    int fuse_out;
    unsigned long long* out_acc;  // [2][H] fixed-point out-projection outputs, layer l uses half l % 2
    float* head_ss;     // [hv][dv / 16] per-head sum-of-squares parts of the gated RMSNorm
    unsigned* head_cnt; // [n_layers][hv] parts arrived (reset by the token's last block)
    // Fused in-projection -> DeltaNet (default with the fused out-projection; LB_MK_FUSE_IN=0 turns it off):
    // no grid barrier between them in DeltaNet layers; an item waits until its head's in-projection rows are
    // counted in (in_cnt), and the residual alternates between x and x2 by layer.
    int fuse_in;
    unsigned* in_cnt;   // [n_layers][hv] in-projection rows of each value head done (reset by the last block)
    float* x2;          // [H] the residual of odd layers (fuse_in), else null
    // Fused attention (default with fuse_in; LB_MK_FUSE_ATT=0 turns it off): attention layers get the
    // DeltaNet treatment, no grid barrier between in-projection, attention and out-projection: items wait
    // on their KV head's in-projection rows (in_cnt), the chunks of a q head meet on head_cnt, and each
    // block of the head applies its columns of o_proj (out_t = o_proj transposed) into out_acc.
    int fuse_att;
    // Whole-head DeltaNet items (default where it fits, LB_MK_DN_WHOLE=0 turns it off; needs fuse_out, dk = dv
    // = 128 and one item per block): item (head h, part k) runs the head's whole step, as `ar`'s delta_out
    // kernel, so the gated RMSNorm needs no per-head exchange; it applies its H / (dv / 16) rows of out_proj
    // to the head's 128 outputs (out_acc) and writes back state columns [16 k, 16 k + 16) after the next grid
    // barrier (every block of the head has read the state by then), kept meanwhile in `dnslice`.
    int dn_whole;
    int dnslice_floats;  // shared memory: dk x 16 floats of updated state (dn_whole), else 0
    // Fused attention's out-projection by rows (default where it fits, LB_MK_ATT_ROWS=0 turns it off; needs
    // fuse_att, head_dim 256, blocks per q head <= NW): see stage_attention.
    int att_rows;
    long long* trace;   // LB_MK_TRACE: [2][n_layers * 16 + 2] clock64 stamps, or null
    // sequence state (device)
    int* pos;         // tokens already in the sequence
    int* tok;         // token to process; overwritten with the next one
    int* out_tokens;  // one per step
    int* step;
    int* done;        // set once an eos token is produced
    const int* eos;
    int n_eos;
    // scratch (device)
    float* x;         // residual [H] (of even layers when x2 is set)
    float* buf_in;    // in-proj output (z, qkv) [max(in_rows)]
    float* conv_out;  // [cd]
    float* g;         // [hv]
    float* beta;      // [hv]
    float* o;         // mixer output [max(vd, nh*hd)]
    float* act;       // [I]
    float* att_part;  // [nh, blocks, hd + 2]
    unsigned* tickets;  // [n_layers * nh + 1]
    float* lm_val;    // [blocks]
    int* lm_idx;      // [blocks]
    unsigned* bar;    // the grid barrier's arrival count (GridBarrier in decode_kernel.cu)
};

// The default configuration. The kernel's fixed build (decode_kernel.cu: Knobs<true>) compiles these values
// in; the host launches that build when Params match them (is_default_config).
struct DefaultConfig {
    static constexpr int fuse = 1, fuse_out = 1, fuse_in = 1, fuse_att = 1, kv_f16 = 0, dn_whole = 1, att_rows = 1;
    static constexpr int early = 3;         // DeltaNet state and conv windows loaded a stage early
    static constexpr int max_head_dim = 256;  // attention built for one 8-element chunk of a head row per lane
};

inline bool is_default_config(const Params& p) {
    using D = DefaultConfig;
    return p.fuse == D::fuse && p.fuse_out == D::fuse_out && p.fuse_in == D::fuse_in && p.fuse_att == D::fuse_att &&
           p.kv_f16 == D::kv_f16 && p.early == D::early && p.dn_whole == D::dn_whole && p.att_rows == D::att_rows &&
           p.hd <= D::max_head_dim;
}

}  // namespace lb::mk
