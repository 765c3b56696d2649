// The device context of the GPU ops (gpu_ops.h): the limits decode_setup reads, the scratch buffers, and the
// binding of a context to the calling thread.
#include "common.cuh"

namespace lb::gpu {

namespace {
thread_local DeviceContext* t_bound = nullptr;  // the calling thread's context (ContextScope)
}  // namespace

DeviceContext::DeviceContext(int dev) : device(dev) {
    gpuDeviceProp p;
    GPU_CHECK(gpuGetDeviceProperties(&p, dev));
    sms = p.multiProcessorCount;
#if defined(LB_CUDA)
    smem_optin = int(p.sharedMemPerBlockOptin);
#endif
}

ContextScope::ContextScope(DeviceContext& ctx) : prev_(t_bound) { t_bound = &ctx; }
ContextScope::~ContextScope() { t_bound = prev_; }

DeviceContext& context() {
    if (!t_bound) lb::fail("internal", "a GPU op ran with no device context bound (gpu::ContextScope)");
    return *t_bound;
}

float* GrowBuffer::get(size_t floats, gpuStream_t s) {
    // Refused during capture even when no growth is needed: a later growth frees p, which a captured graph
    // would still use, and the path a captured launch takes must not depend on what ran before it. HIP as
    // well: its decode step is a captured graph too (the unfused step's delta_rule asks for delta_prep).
#if defined(LB_CUDA)
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    GPU_CHECK(cudaStreamIsCapturing(s, &st));
    if (st != cudaStreamCaptureStatusNone) return nullptr;
#else
    hipStreamCaptureStatus st = hipStreamCaptureStatusNone;
    GPU_CHECK(hipStreamIsCapturing(s, &st));
    if (st != hipStreamCaptureStatusNone) return nullptr;
#endif
    if (floats <= cap) return p;
    GPU_CHECK(gpuStreamSynchronize(s));
    if (p) GPU_CHECK(gpuFree(p));
    p = nullptr;
    GPU_CHECK(gpuMalloc(&p, floats * sizeof(float)));
    cap = floats;
    return p;
}
GrowBuffer::~GrowBuffer() {
    if (p) (void)gpuFree(p);
}


// The attention kernels built for a bf16 K and V cache (the default) carry that path alone; any other cache
// type takes the kernels that switch on the type at run time.
bool kv_bf16_kernels(DType kt, DType vt) { return kt == DType::BF16 && vt == DType::BF16; }

void decode_setup(int device) {
    gpuDeviceProp p;
    GPU_CHECK(gpuGetDeviceProperties(&p, device));
    dec().sms = p.multiProcessorCount;
#if defined(LB_CUDA)
    // dynamic shared memory a GEMV block may take: the opt-in limit less room for its static arrays
    dec().smem_block = p.sharedMemPerBlockOptin - 2048;
    dec().smem_sm = p.sharedMemPerMultiprocessor;
    dec().pdl = p.major >= 9 && tuning().gpu_pdl;
#else
    dec().smem_block = p.sharedMemPerBlock;
    dec().smem_sm = p.maxSharedMemoryPerMultiProcessor;
    dec().pdl = false;
#endif
    gemv_fused_setup(p);
    mlp_fused_setup(p);
    dec().tile = size_t(tuning().gemv_tile_bytes);
    dec().max_per_sm = tuning().gemv_blocks_per_sm;
    dec().prewait = tuning().gemv_prewait;  // 0 .. GV_STAGES (3)
    dec().ready = true;
}
bool decode_pdl() { return dec().pdl; }

}  // namespace lb::gpu
