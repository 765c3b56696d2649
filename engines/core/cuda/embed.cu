// Token in and token out: the embedding lookup, the greedy argmax, the position counter, and their one-token
// decode forms (embed_decode also clears the accumulators; decode_finish takes the argmax and advances the
// position). CPU reference: lb::cpu::argmax (../cpu/norms.cpp); embed is a row copy.
#include "common.cuh"

namespace lb::gpu {

namespace {

__global__ void embed_kernel(const int* tokens, const wtype* E, int H, float* x) {
    const int t = blockIdx.x;
    const wtype* row = E + size_t(tokens[t]) * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x) x[size_t(t) * H + i] = w2f(row[i]);
}

// One block; ties go to the lowest index.
__global__ void argmax_kernel(const float* x, int n, int* result) {
    __shared__ float bv[1024];
    __shared__ int bi[1024];
    float best = -FLT_MAX;
    int idx = 0x7fffffff;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        if (x[i] > best) { best = x[i]; idx = i; }
    bv[threadIdx.x] = best;
    bi[threadIdx.x] = idx;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            const float ov = bv[threadIdx.x + s];
            const int oi = bi[threadIdx.x + s];
            if (ov > bv[threadIdx.x] || (ov == bv[threadIdx.x] && oi < bi[threadIdx.x])) { bv[threadIdx.x] = ov; bi[threadIdx.x] = oi; }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) *result = bi[0];
}

__global__ void add_pos_kernel(int* pos, int n, const int* token, int* host_ring, int ring_mask) {
    const int p = *pos + n;
    *pos = p;
    if (host_ring) host_ring[(p - 1) & ring_mask] = *token;  // a posted write over the bus
}

__global__ void embed_decode_kernel(const int* token, const wtype* E, int H, float* x, unsigned long long* key,
                                    unsigned long long* acc, int n_acc) {
    griddep_launch();
    griddep_wait();
    const wtype* row = E + size_t(*token) * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x) x[i] = w2f(row[i]);
    if (threadIdx.x == 0) *key = 0ull;
    // The accumulators (the fused MLP's, the DeltaNet mixers'): the previous token's LM head read the last
    // layers' outputs from them and nothing folded them; layer 0 needs them zero.
    for (int i = threadIdx.x; i < n_acc * H; i += blockDim.x) acc[i] = 0ull;
}

__global__ void decode_finish_kernel(const unsigned long long* key, int* next, int* pos, int* host_ring,
                                     int ring_mask) {
    griddep_wait();
    const int token = int(0xffffffffu - unsigned(*key & 0xffffffffull)), p = *pos;
    *next = token;
    *pos = p + 1;
    if (host_ring) host_ring[p & ring_mask] = token;  // a posted write over the bus: the kernel does not wait
}

}  // namespace

void embed(const int* d_tokens, int n, const wtype* E, int H, float* x, gpuStream_t s) {
    embed_kernel<<<n, 256, 0, s>>>(d_tokens, E, H, x);
}

void argmax(const float* x, int n, int* d_out, gpuStream_t s) { argmax_kernel<<<1, 1024, 0, s>>>(x, n, d_out); }

void add_pos(int* d_pos, int n, gpuStream_t s, const int* token, int* host_ring, int ring_mask) {
    add_pos_kernel<<<1, 1, 0, s>>>(d_pos, n, token, host_ring, ring_mask);
}

void embed_decode(const int* d_token, const wtype* E, int H, float* x, unsigned long long* key,
                  unsigned long long* acc, int n_acc, gpuStream_t s) {
    embed_decode_kernel<<<1, 256, 0, s>>>(d_token, E, H, x, key, acc, acc ? n_acc : 0);
}

void decode_finish(const unsigned long long* key, int* d_next, int* d_pos, int* host_ring, int ring_mask,
                   gpuStream_t s) {
    launch_k(decode_finish_kernel, dim3(1), dim3(1), 0, s, key, d_next, d_pos, host_ring, ring_mask);
}

}  // namespace lb::gpu
