// The device state of the GPU ops: the limits decode_setup reads once, shared by the kernel files.
#include "common.cuh"

namespace lb::gpu {

DecodeCfg g_dec;

#if defined(LB_CUDA)
int current_device_attr(cudaDeviceAttr attr) {
    int dev = 0, v = 0;
    GPU_CHECK(cudaGetDevice(&dev));
    GPU_CHECK(cudaDeviceGetAttribute(&v, attr, dev));
    return v;
}
#endif
// The most dynamic shared memory a block may opt into (one device per process: read once).
int smem_optin_limit() {
#if defined(LB_CUDA)
    static const int limit = current_device_attr(cudaDevAttrMaxSharedMemoryPerBlockOptin);
    return limit;
#else
    return 48 * 1024;
#endif
}

// The attention kernels built for a bf16 K and V cache (the default) carry that path alone; any other cache
// type takes the kernels that switch on the type at run time.
bool kv_bf16_kernels(DType kt, DType vt) { return kt == DType::BF16 && vt == DType::BF16; }

void decode_setup(int device) {
    gpuDeviceProp p;
    GPU_CHECK(gpuGetDeviceProperties(&p, device));
    g_dec.sms = p.multiProcessorCount;
#if defined(LB_CUDA)
    // dynamic shared memory a GEMV block may take: the opt-in limit less room for its static arrays
    g_dec.smem_block = p.sharedMemPerBlockOptin - 2048;
    g_dec.smem_sm = p.sharedMemPerMultiprocessor;
    g_dec.pdl = p.major >= 9 && tuning().gpu_pdl;
#else
    g_dec.smem_block = p.sharedMemPerBlock;
    g_dec.smem_sm = p.maxSharedMemoryPerMultiProcessor;
    g_dec.pdl = false;
#endif
    gemv_fused_setup(p);
    mlp_fused_setup(p);
    g_dec.tile = size_t(tuning().gemv_tile_bytes);
    g_dec.max_per_sm = tuning().gemv_blocks_per_sm;
    g_dec.prewait = tuning().gemv_prewait;  // 0 .. GV_STAGES (3)
    g_dec.ready = true;
}
bool decode_pdl() { return g_dec.pdl; }

}  // namespace lb::gpu
