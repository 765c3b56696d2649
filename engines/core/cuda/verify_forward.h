// The verify forward and the commit of an accepted path on the GPU: the layer sequence of
// qwen35_forward.cu with the tree forms of verify_ops.h for the mixers (attention over the committed
// cache + ancestors, the conv and delta rule along each row's path), outputs at every row, and what
// commit needs kept per DeltaNet layer. Mirrors CpuBackend::verify / commit (../cpu/cpu_backend.cpp).
#pragma once
#include <cstddef>
#include <functional>
#include <vector>

#include "../model.h"
#include "gpu_ops.h"
#include "verify_ops.h"

namespace lb::gpu {

// Device buffers of a verify over up to `cap` rows. Buffers only grow.
struct VerifyWorkspace {
    int cap = 0;
    int *tokens = nullptr, *positions = nullptr, *parent = nullptr, *path = nullptr, *argmax = nullptr;
    unsigned char* visible = nullptr;  // [cap, cap]
    float *x = nullptr, *h = nullptr, *big = nullptr, *conv = nullptr, *g = nullptr, *beta = nullptr, *o = nullptr,
          *normed = nullptr, *act = nullptr, *logits = nullptr, *scratch = nullptr;
    AttnScratch attn;  // split-KV attention's partials (the tree attention at a long context)
    // per layer (DeltaNet layers only): what commit reads
    std::vector<float*> keep_k, keep_u, keep_gamma, keep_conv;
    bool ensure(const ModelConfig& cfg, int n, const std::function<void*(size_t)>& alloc);
    // Bytes one row keeps for commit (k, u, gamma, conv input in every DeltaNet layer).
    static size_t commit_bytes_per_row(const ModelConfig& cfg);
};

struct VerifyCaches {
    const std::vector<void*>& k;
    const std::vector<void*>& v;
    DType kt, vt;
    const std::vector<float*>& ssm;
    const std::vector<float*>& conv;
};

// Rows: ws.tokens, ws.positions, ws.parent, ws.visible hold n rows (uploaded by the caller); their K/V
// go to cache slots len..len+n-1. Leaves logits [n, vocab] in ws.logits and the argmax per row in
// ws.argmax; the committed state is read, not written. features: empty, or one pointer a layer, where not
// null a [n, hidden] buffer that receives the residual stream after that layer (HF's hidden_states[l + 1]).
void verify_layers(const ModelConfig& cfg, const ModelWeights& w, VerifyWorkspace& ws, const VerifyCaches& c, int len,
                   int n, gpuStream_t s, const std::vector<float*>& features = {});
// ws.path holds the accepted rows (root first, m of them): KV rows compacted to slots len..len+m-1,
// DeltaNet and conv states set to the last row's.
void commit_path(const ModelConfig& cfg, VerifyWorkspace& ws, const VerifyCaches& c, int len, int m, gpuStream_t s);

}  // namespace lb::gpu
