// What a compute backend (cpu, cuda, hip) provides to the engines: the forward pass of a model (model.h)
// over a sequence held in the backend's caches (KV cache for attention layers, recurrent and conv state
// for DeltaNet layers), plus device timing. Engines (ar, speculative ones) drive it.
//
// Two ways to run tokens:
//  * forward(): append-only prefill / decode, returning the last row's greedy token;
//  * verify() + commit(): a forward over n candidate tokens (a chain or a tree) that leaves the committed
//    sequence untouched, then the accepted root-to-node path made part of the sequence (KV rows
//    compacted to contiguous positions, DeltaNet and conv state set to the accepted node's).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model.h"
#include "qwen35_model.h"
#include "quant.h"
#include "errors.h"
#include "tensor_source.h"

namespace lb {

struct DeviceInfo {
    std::string name;
    int index = 0;
    uint64_t memory_bytes = 0;
};

// A verify forward: n tokens at explicit positions. Row i attends to the committed cache, its ancestors
// and itself: parents[i] is an earlier row (parents before children) or -1 for a row hung directly on the
// committed sequence; no parents means a chain (row i's parent is i - 1, row 0's is -1).
struct VerifyRequest {
    std::vector<int> tokens;
    std::vector<int> positions;       // rotary position of each row (a tree: length + depth)
    std::vector<int> parents;         // empty: a chain
    std::vector<int> out_rows;        // rows whose outputs are returned; empty: every row
    bool want_logits = false;         // raw logits of the out rows
    int top_k = 0;                    // > 0: the k largest log-probabilities of each out row
    std::vector<int> feature_layers;  // layer ids whose output (the residual stream after the layer,
                                      // HF's hidden_states[id + 1]) is returned at the out rows
    bool features_on_device = false;  // GPU backends: leave the features in device memory
                                      // (VerifyResult::device_features) instead of copying them to the host
};

struct VerifyResult {
    std::vector<int> argmax;             // [out rows]: greedy token (lowest index on ties)
    std::vector<float> logits;           // [out rows, vocab] when asked
    std::vector<int> top_ids;            // [out rows, top_k], largest first
    std::vector<float> top_logprobs;     // [out rows, top_k]
    std::vector<float> features;         // [out rows, feature layers, hidden]
    // features_on_device: [distinct feature layers (first-appearance order), every row of the verify,
    // hidden] fp32 in the backend's device memory, valid until its next verify or forward.
    const float* device_features = nullptr;
};

// What a second model on the same GPU (a speculative draft) borrows from the target, as device operations
// on the backend's stream (the draft enqueues on that stream too, so nothing waits across streams). The
// target's embedding and LM head run as the backend stores them, whatever their format.
struct DeviceHead {
    void* stream = nullptr;  // the backend's gpuStream_t
    int device = 0;
    std::function<void(const int* d_tokens, int n, float* d_x)> embed;      // d_x[n, hidden] = embedding rows
    std::function<void(const float* d_x, int n, float* d_logits)> lm_head;  // d_logits[n, vocab] = LM head of d_x
};

// PFlash importance (docs/engines.md, "PFlash"): a forward that also returns, for every attention layer,
// the attention probabilities of its last `n_tail` rows over every position of the sequence,
// softmax(q k^T / sqrt(head_dim)) causally masked (a row sees positions up to its own), reduced by the
// max over query heads, with q and k as they are before RoPE (after the per-head norms). The keys of
// earlier forwards are un-rotated from the cache, so they carry the KV cache type's rounding.
struct TailScores {
    int n_tail = 0, ctx = 0;   // rows scored; positions scored (the sequence length after the forward)
    std::vector<int> layers;   // the attention layers, in order
    std::vector<float> probs;  // [layers, n_tail, ctx]; positions after a row's own are 0
};

// The committed sequence state, decoded to fp32 (tests compare it with an autoregressive run's).
struct SequenceState {
    int length = 0;
    std::vector<std::vector<float>> k, v;  // per layer: [length, n_kv_heads, head_dim] (empty for DeltaNet)
    std::vector<std::vector<float>> recurrent, conv;  // per layer: [hv, dk, dv] and [conv_dim, K - 1]
};

// Device memory the backend holds, reported at load (ready line "memory").
struct MemoryReport {
    uint64_t weights = 0;             // weights as stored by the backend
    uint64_t kv_cache = 0;            // KV cache for max_ctx tokens (verify rows use its tail)
    uint64_t recurrent_state = 0;     // DeltaNet recurrent + conv state of the committed sequence
    uint64_t verify_bytes_per_node = 0;  // speculative state one verify row keeps for commit
    int max_verify_rows = 0;          // rows one verify may have (0: no verify forward)
};

class Backend {
public:
    virtual ~Backend() = default;
    virtual std::string name() const = 0;  // "cpu", "cuda", "hip"
    virtual DeviceInfo device() const = 0;

    // Loads and converts the weights (see model.h). Throws EngineError("load"/"oom"/"unsupported").
    virtual void load(const TensorSource& src, const ModelConfig& cfg, LoadStats* stats) = 0;
    // Sizes the caches: max_ctx tokens of KV cache with the given K and V element types.
    virtual void allocate(int max_ctx, DType kv_k, DType kv_v) = 0;

    // Starts a new sequence: empty KV cache, zero recurrent and conv state.
    virtual void reset() = 0;
    // Runs `n` tokens at positions [length, length + n) of the current sequence, appending them to the
    // caches. Prefill passes the whole prompt (processed in parallel), decode passes one token.
    // Returns the greedy next token (argmax of the last position's logits, lowest index on ties);
    // copies those logits to `last_logits` when it is not null.
    virtual int forward(const int* tokens, int n, std::vector<float>* last_logits) = 0;
    virtual int length() const = 0;  // tokens in the current sequence

    // Greedy decode: appends up to n_steps tokens to `out`, each the next token after out->back() (which
    // must be the last token forwarded, or the one forward() just returned), and stops after a token for
    // which stop(token) is true. This default runs forward() once a step; a backend may keep several
    // steps in flight (the GPU backend does) as long as `out` and the timing end at the stop: steps run
    // past it leave the caches longer than the tokens returned (length() counts them), which only a
    // reset() makes consistent again.
    virtual void decode(int n_steps, const std::function<bool(int)>& stop, std::vector<int>* out) {
        for (int i = 0; i < n_steps; ++i) {
            out->push_back(forward(&out->back(), 1, nullptr));
            if (stop(out->back())) break;
        }
    }

    // forward() that also fills *scores (see TailScores) for its last n_tail rows (1 <= n_tail <= n).
    virtual int forward_scored(const int* tokens, int n, int n_tail, TailScores* scores) {
        fail("unsupported", "the " + name() + " backend has no scored forward (PFlash importance)");
    }

    // Block-sparse prefill attention (PFlash's drafter; docs/engines.md, "PFlash"): forwards whose sequence
    // reaches `from` tokens run each attention layer over the key blocks gpu::BlockSparse keeps (alpha: its
    // threshold; 2 sink blocks, 4 recent, the forward's last 256 rows dense; budget: the fraction of the blocks
    // a query tile sees that it may keep beyond those, the top-scoring, 1: no bound); from = 0: dense (the default).
    virtual void set_block_sparse(int from, float alpha, float budget = 1.f) {
        if (from > 0) fail("unsupported", "the " + name() + " backend has no block-sparse attention");
    }
    // The share of the key tiles (64 positions) block-sparse attention read since reset(), over the tiles dense
    // causal attention reads in the same forwards (all layers and chunks; waits for the device); -1 when none
    // ran sparse.
    virtual double block_sparse_read_fraction() { return -1.0; }

    // Device timing: wall clock on CPU, events on GPU. stop() waits for the device.
    virtual void timer_start() = 0;
    virtual double timer_stop_ms() = 0;
    virtual void synchronize() = 0;
    virtual uint64_t peak_mem_bytes() const = 0;
    // Bytes one decode step reads and writes in device memory at context length `ctx`: every weight
    // matrix once (the LM head included; the embedding row is negligible), the KV cache read up to
    // ctx, the new K/V written, DeltaNet recurrent state read and written, conv state.
    virtual uint64_t decode_bytes(int ctx) const = 0;
    // What the build was compiled with (compiler, flags, arch, source hash).
    virtual std::string weight_dtype() const = 0;  // dtype the backend computes matrices in

    // Verify forward (see VerifyRequest): writes the rows' K/V after the committed length and keeps what
    // commit() needs; the committed sequence is unchanged until commit(). A later forward() or verify()
    // discards it. Throws EngineError("context_overflow") when length() + n exceeds the cache,
    // ("bad_request") for a malformed request, ("unsupported") where the backend has none.
    virtual void verify(const VerifyRequest& req, VerifyResult* out) {
        fail("unsupported", "the " + name() + " backend has no verify forward");
    }
    // Appends the rows `path` of the last verify to the sequence: path[0] is a row with parent -1, each
    // next row a child of the previous, at positions length(), length() + 1, ... (checked). A GPU backend
    // returns without waiting for the device: its later operations run after the commit on its stream.
    virtual void commit(const std::vector<int>& path) {
        fail("unsupported", "the " + name() + " backend has no verify forward");
    }
    // Drops the sequence's tail down to `length` tokens. Only attention-only models can: a DeltaNet
    // state cannot go back (speculative engines use verify + commit instead).
    virtual void truncate(int length) { fail("unsupported", "the " + name() + " backend cannot truncate"); }
    virtual void export_state(SequenceState* out) const {
        fail("unsupported", "the " + name() + " backend cannot export its state");
    }
    virtual MemoryReport memory() const { return {}; }
    // GPU backends: the target's embedding and LM head for a draft on the same device (DeviceHead).
    virtual DeviceHead device_head() { fail("unsupported", "the " + name() + " backend has no device head"); }
};

using Qwen35Backend = Backend;  // the name the Qwen3.5-only GPU code uses

std::unique_ptr<Backend> make_cpu_backend();
#if defined(LB_HAVE_GPU)
std::unique_ptr<Backend> make_gpu_backend(int device);  // cuda or hip, as built
#endif

}  // namespace lb
