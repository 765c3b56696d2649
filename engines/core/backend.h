// What a compute backend (cpu, cuda, hip) provides to the engines: the Qwen3.5 forward pass over a
// sequence held in the backend's caches (KV cache for full-attention layers, recurrent and conv state
// for DeltaNet layers), plus device timing. Engines (ar, and later speculative ones) drive it.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "qwen35_model.h"
#include "quant.h"
#include "tensor_source.h"

namespace lb {

struct DeviceInfo {
    std::string name;
    int index = 0;
    uint64_t memory_bytes = 0;
};

class Qwen35Backend {
public:
    virtual ~Qwen35Backend() = default;
    virtual std::string name() const = 0;  // "cpu", "cuda", "hip"
    virtual DeviceInfo device() const = 0;

    // Loads and converts the weights (see qwen35_model.h). Throws EngineError("load"/"oom").
    virtual void load(const TensorSource& src, const Qwen35Config& cfg, LoadStats* stats) = 0;
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
};

std::unique_ptr<Qwen35Backend> make_cpu_backend();
#if defined(LB_HAVE_GPU)
std::unique_ptr<Qwen35Backend> make_gpu_backend(int device);  // cuda or hip, as built
#endif

}  // namespace lb
