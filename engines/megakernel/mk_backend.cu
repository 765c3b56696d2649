// The megakernel backend: weights, caches and states on the device; prefill through the core's CUDA
// operations (core/cuda/gpu_ops.h), decode through the persistent kernel of decode_kernel.cu, launched
// cooperatively with as many blocks as can be resident at once.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "core/cuda/gpu_ops.h"
#include "core/tuning.h"
#include "core/cuda/qwen35_forward.h"
#include "core/half.h"
#include "decode_kernel.cuh"
#include "megakernel.h"

#if defined(__HIPCC__)  // the runtime calls of this file under their HIP names (compiled in CI, never run)
#define cudaDeviceProp hipDeviceProp_t
#define cudaDeviceSynchronize hipDeviceSynchronize
#define cudaEventCreate hipEventCreate
#define cudaEventElapsedTime hipEventElapsedTime
#define cudaEventRecord hipEventRecord
#define cudaEventSynchronize hipEventSynchronize
#define cudaEvent_t hipEvent_t
#define cudaFree hipFree
#define cudaFuncAttributeMaxDynamicSharedMemorySize hipFuncAttributeMaxDynamicSharedMemorySize
#define cudaFuncSetAttribute hipFuncSetAttribute
#define cudaGetDeviceProperties hipGetDeviceProperties
#define cudaGetLastError hipGetLastError
#define cudaLaunchCooperativeKernel hipLaunchCooperativeKernel
#define cudaMalloc hipMalloc
#define cudaMemcpy hipMemcpy
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemset hipMemset
#define cudaMemsetAsync hipMemsetAsync
#define cudaOccupancyMaxActiveBlocksPerMultiprocessor hipOccupancyMaxActiveBlocksPerMultiprocessor
#define cudaSetDevice hipSetDevice
#define cudaStreamCreateWithFlags hipStreamCreateWithFlags
#define cudaStreamNonBlocking hipStreamNonBlocking
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaStream_t hipStream_t
#endif

namespace lb::mk {

const void* decode_kernel_ptr(bool fixed);  // decode_kernel.cu (fixed: the default configuration's build)

namespace {

class MegaBackendImpl : public MegaBackend {
public:
    explicit MegaBackendImpl(int device) : ctx_(device), device_(device) {
        GPU_CHECK(cudaSetDevice(device));
        cudaDeviceProp prop;
        GPU_CHECK(cudaGetDeviceProperties(&prop, device));
        prop_name_ = prop.name;
        mem_ = prop.totalGlobalMem;
        sms_ = prop.multiProcessorCount;
        coop_ = prop.cooperativeLaunch;
        cc_ = prop.major * 10 + prop.minor;
#if defined(__HIPCC__)
        smem_optin_ = int(prop.sharedMemPerBlock);
#else
        smem_optin_ = int(prop.sharedMemPerBlockOptin);
#endif
        GPU_CHECK(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
        GPU_CHECK(cudaEventCreate(&ev0_));
        GPU_CHECK(cudaEventCreate(&ev1_));
    }
    ~MegaBackendImpl() override {
        for (void* p : allocations_) (void)cudaFree(p);
    }

    std::string name() const override { return "cuda"; }
    DeviceInfo device() const override { return DeviceInfo{prop_name_, device_, uint64_t(mem_)}; }
    std::string weight_dtype() const override { return LB_WTYPE_NAME; }

    void load(const TensorSource& src, const Qwen35Config& cfg, LoadStats* stats) override {
        gpu::ContextScope bind(ctx_);
        if (!coop_) fail("unsupported", "device " + prop_name_ + " cannot launch cooperative kernels (needed for the grid barrier)");
#if !defined(LB_GPU_FP16)
        if (cc_ < 80) fail("unsupported", "this megakernel build uses bf16 weights (sm_80+); the device is sm_" +
                                              std::to_string(cc_) + ": rebuild for its arch (sm_75 builds use fp16 weights)");
#endif
        check_shape(cfg);
        cfg_ = cfg;
        Uploader up = [this](std::vector<float>&& data, int64_t rows, int64_t cols, bool matrix) {
            Mat m{nullptr, rows, cols};
            if (matrix) {
                std::vector<wtype> conv(data.size());
                for (size_t i = 0; i < data.size(); ++i) conv[i] = wtype(data[i]);
                m.ptr = alloc(conv.size() * sizeof(wtype));
                GPU_CHECK(cudaMemcpy(m.ptr, conv.data(), conv.size() * sizeof(wtype), cudaMemcpyHostToDevice));
            } else {
                m.ptr = alloc(data.size() * sizeof(float));
                GPU_CHECK(cudaMemcpy(m.ptr, data.data(), data.size() * sizeof(float), cudaMemcpyHostToDevice));
            }
            return m;
        };
        w_ = load_qwen35_weights(src, cfg, up, stats);
        // Bytes one decode step reads of the weights: every layer matrix and small vector once, the LM head
        // once, one embedding row (the embedding matrix itself is not streamed).
        auto mbytes = [](const Mat& m) { return uint64_t(m.rows) * uint64_t(m.cols) * sizeof(wtype); };
        auto vbytes = [](const Mat& m) { return m.ptr ? uint64_t(m.rows) * uint64_t(m.cols) * 4 : 0; };
        uint64_t wb = mbytes(w_.lm_head) + uint64_t(cfg_.hidden) * sizeof(wtype) + vbytes(w_.final_norm);
        for (const Qwen35Layer& L : w_.layers) {
            wb += vbytes(L.input_norm) + vbytes(L.post_norm) + mbytes(L.gate_up) + mbytes(L.down);
            if (L.full) wb += mbytes(L.attn_qkv) + mbytes(L.o_proj) + vbytes(L.q_norm) + vbytes(L.k_norm);
            else
                wb += mbytes(L.lin_in) + mbytes(L.out_proj) + vbytes(L.conv_w) + vbytes(L.neg_A) + vbytes(L.dt_bias) +
                      vbytes(L.ssm_norm);
        }
        decode_weight_bytes_ = wb;
    }

    void allocate(int max_ctx, DType kv_k, DType kv_v) override {
        gpu::ContextScope bind(ctx_);
        if (kv_k != kv_v || (kv_k != DType::BF16 && kv_k != DType::F16))
            fail("unsupported", std::string("the megakernel keeps the KV cache in bf16 or f16 (same type for K and V); got ") +
                                    dtype_name(kv_k) + "/" + dtype_name(kv_v));
        max_ctx_ = max_ctx;
        kt_ = kv_k;
        const Qwen35Config& c = cfg_;
        const int hd = c.head_dim;
        const size_t row = size_t(hd) * 2;
        kc_.assign(size_t(c.n_layers), nullptr);
        vc_.assign(size_t(c.n_layers), nullptr);
        ssm_.assign(size_t(c.n_layers), nullptr);
        conv_.assign(size_t(c.n_layers), nullptr);
        for (int l = 0; l < c.n_layers; ++l) {
            if (c.is_full[size_t(l)]) {
                kc_[size_t(l)] = alloc(size_t(max_ctx) * c.n_kv_heads * row);
                vc_[size_t(l)] = alloc(size_t(max_ctx) * c.n_kv_heads * row);
            } else {
                ssm_[size_t(l)] = (float*)alloc(ssm_bytes());
                conv_[size_t(l)] = (float*)alloc(conv_bytes());
            }
        }
        ws_.ensure(cfg_, 1, [this](size_t bytes) { return alloc(bytes); });
        setup_decode();
        reset();
    }

    void reset() override {
        len_ = 0;
        for (int l = 0; l < cfg_.n_layers; ++l) {
            if (ssm_[size_t(l)]) GPU_CHECK(cudaMemsetAsync(ssm_[size_t(l)], 0, ssm_bytes(), s_));
            if (conv_[size_t(l)]) GPU_CHECK(cudaMemsetAsync(conv_[size_t(l)], 0, conv_bytes(), s_));
        }
        GPU_CHECK(cudaMemsetAsync(d_pos_, 0, sizeof(int), s_));
    }
    int length() const override { return len_; }

    int forward(const int* tokens, int n, std::vector<float>* last_logits) override {
        gpu::ContextScope bind(ctx_);
        if (len_ + n > max_ctx_) fail("context_overflow", "sequence would exceed max_ctx " + std::to_string(max_ctx_));
        if (n == 1 && !last_logits && len_ > 0) {  // one decode step through the megakernel
            GPU_CHECK(cudaMemcpyAsync(d_tok_, tokens, sizeof(int), cudaMemcpyHostToDevice, s_));
            std::vector<int> out;
            decode_chain(1, {}, &out);
            return out.at(0);
        }
        prefill(tokens, n);
        int next = 0;
        GPU_CHECK(cudaMemcpyAsync(&next, d_tok_, sizeof(int), cudaMemcpyDeviceToHost, s_));
        if (last_logits) {
            last_logits->resize(size_t(cfg_.vocab));
            GPU_CHECK(cudaMemcpyAsync(last_logits->data(), ws_.logits, sizeof(float) * size_t(cfg_.vocab), cudaMemcpyDeviceToHost, s_));
        }
        GPU_CHECK(cudaStreamSynchronize(s_));
        return next;
    }

    void decode_chain(int n_steps, const std::vector<int>& eos, std::vector<int>* out) override {
        gpu::ContextScope bind(ctx_);
        if (n_steps <= 0) return;
        if (len_ + n_steps > max_ctx_) fail("context_overflow", "sequence would exceed max_ctx " + std::to_string(max_ctx_));
        if (len_ == 0) fail("internal", "decode before prefill");
        const int n_eos = std::min<int>(int(eos.size()), MAX_EOS);
        if (n_eos) GPU_CHECK(cudaMemcpyAsync(d_eos_, eos.data(), sizeof(int) * size_t(n_eos), cudaMemcpyHostToDevice, s_));
        GPU_CHECK(cudaMemsetAsync(d_step_, 0, sizeof(int), s_));
        GPU_CHECK(cudaMemsetAsync(d_done_, 0, sizeof(int), s_));
        params_.n_eos = n_eos;
        void* args[] = {&params_};
        for (int i = 0; i < n_steps; ++i) {
            GPU_CHECK(cudaLaunchCooperativeKernel(kernel_, dim3(unsigned(info_.blocks)), dim3(unsigned(info_.threads)), args,
                                                  size_t(info_.smem_bytes), s_));
        }
        GPU_CHECK(cudaGetLastError());
        int steps = 0;
        std::vector<int> toks(static_cast<size_t>(n_steps));
        GPU_CHECK(cudaMemcpyAsync(&steps, d_step_, sizeof(int), cudaMemcpyDeviceToHost, s_));
        GPU_CHECK(cudaMemcpyAsync(toks.data(), d_out_, sizeof(int) * size_t(n_steps), cudaMemcpyDeviceToHost, s_));
        GPU_CHECK(cudaStreamSynchronize(s_));
        if (steps < 1 || steps > n_steps) fail("internal", "decode kernel reported " + std::to_string(steps) + " steps for " + std::to_string(n_steps));
        for (int i = 0; i < steps; ++i) out->push_back(toks[size_t(i)]);
        if (params_.trace) write_trace();
        len_ += steps;
    }

    LaunchInfo launch_info() const override { return info_; }

    // The last decode step's stage stamps (LB_MK_TRACE): one line per traced block, cycles from its start.
    void write_trace() {
        const size_t per = size_t(cfg_.n_layers * 16 + 2);
        std::vector<long long> t(2 * per);
        GPU_CHECK(cudaMemcpy(t.data(), params_.trace, sizeof(long long) * t.size(), cudaMemcpyDeviceToHost));
        FILE* f = std::fopen(trace_path_.c_str(), "w");
        if (!f) return;
        for (int blk = 0; blk < 2; ++blk) {
            std::fprintf(f, "block %d:", blk ? info_.blocks / 2 : 0);
            for (size_t i = 0; i < per; ++i) std::fprintf(f, " %lld", t[blk * per + i] - t[blk * per]);
            std::fprintf(f, "\n");
        }
        std::fclose(f);
    }

    void timer_start() override { GPU_CHECK(cudaEventRecord(ev0_, s_)); }
    double timer_stop_ms() override {
        GPU_CHECK(cudaEventRecord(ev1_, s_));
        GPU_CHECK(cudaEventSynchronize(ev1_));
        float ms = 0;
        GPU_CHECK(cudaEventElapsedTime(&ms, ev0_, ev1_));
        return ms;
    }
    void synchronize() override { GPU_CHECK(cudaStreamSynchronize(s_)); }
    uint64_t peak_mem_bytes() const override { return allocated_; }
    uint64_t decode_bytes(int ctx) const override {
        // KV rows read (ctx) and written (1), DeltaNet and conv state read and written: the core's count
        // with no matrices, plus the weights this kernel streams.
        return decode_weight_bytes_ + qwen35_decode_bytes(cfg_, 0, 0, kt_, kt_, ctx);
    }

private:
    static void check_shape(const Qwen35Config& c) {
        auto need = [](bool ok, const std::string& what) {
            if (!ok) fail("unsupported", "megakernel: " + what);
        };
        need(c.hidden % 8 == 0 && c.intermediate % 8 == 0, "hidden and intermediate sizes must be multiples of 8");
        need(c.n_layers <= MAX_LAYERS, "at most " + std::to_string(MAX_LAYERS) + " layers (the kernel keeps their pointers in shared memory)");
        need(c.lin_value_dim() % 8 == 0 && (c.n_heads * c.head_dim) % 8 == 0, "attention/DeltaNet widths must be multiples of 8");
        need(c.lin_k_dim <= 32 * DN_MAXR, "DeltaNet key head dim must be <= " + std::to_string(32 * DN_MAXR));
        need(c.lin_v_dim % DN_COLS == 0, "DeltaNet value head dim must be a multiple of " + std::to_string(DN_COLS));
        need(c.lin_v_heads % c.lin_k_heads == 0, "DeltaNet value heads must be a multiple of key heads");
        need(c.head_dim % 8 == 0 && c.head_dim <= 8 * 32 * ATT_MAXC, "head_dim must be a multiple of 8 and <= 512");
        need(c.n_kv_heads > 0 && c.n_heads % c.n_kv_heads == 0, "query heads must be a multiple of KV heads");
        need(c.rope_dims % 2 == 0 && c.rope_dims <= c.head_dim, "rotary dims must be even and <= head_dim");
        need(c.conv_kernel >= 1 && c.conv_kernel <= 8, "conv kernel must be 1..8");
    }

    size_t ssm_bytes() const { return sizeof(float) * size_t(cfg_.lin_v_heads) * cfg_.lin_k_dim * cfg_.lin_v_dim; }
    size_t conv_bytes() const { return sizeof(float) * size_t(cfg_.conv_dim()) * size_t(std::max(1, cfg_.conv_kernel - 1)); }

    void* alloc(size_t bytes) {
        void* p = nullptr;
        GPU_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 256)));
        allocations_.push_back(p);
        allocated_ += bytes;
        return p;
    }
    // Zero-filled device memory (counters, accumulators, trace stamps).
    void* alloc_zeroed(size_t bytes) {
        void* p = alloc(bytes);
        GPU_CHECK(cudaMemset(p, 0, std::max<size_t>(bytes, 1)));
        return p;
    }
    // A device copy of the [rows, cols] matrix m transposed to [cols, rows] (the fused stages read a block's
    // slice of the input dimension as contiguous rows).
    const wtype* transposed(const Mat& m) {
        auto* t = (wtype*)alloc(size_t(m.rows) * size_t(m.cols) * sizeof(wtype));
        gpu::transpose(W(m), int(m.rows), int(m.cols), t, s_);
        return t;
    }
    static const wtype* W(const Mat& m) { return (const wtype*)m.ptr; }
    static const float* F(const Mat& m) { return (const float*)m.ptr; }

    // ---------------------------------------------------------------------------------- decode setup
    void setup_decode() {
        const Qwen35Config& c = cfg_;
        // A block's share of `rows`, sized for one block per SM (more blocks only shrink a block's share).
        auto per = [&](int rows) { return (rows + sms_ - 1) / sms_; };
        const int in_rows_per_block = per(std::max(c.lin_in_rows(), c.attn_qkv_rows()));
        // xs: the widest stage input, and the in-projection's input followed by the block's row values (stage_in)
        const int att_aux = 3 * c.head_dim + 3 * NW + NW * c.head_dim;
        const int dn_aux = 2 * c.lin_k_dim + 2 * NW * DN_COLS + 2 * NW;
        // Whole-head DeltaNet items (Params::dn_whole, docs/megakernel.md v8; the mk_dn_whole knob):
        // the step's reductions take 2 NW x 128 floats of aux, the updated state columns dk x 16 floats of their own,
        // its vectors (q, k, v|u, z, o) 5 x 128 floats of xs
        const Tuning& tu = tuning();
        const bool dn_shape = c.lin_k_dim == 128 && c.lin_v_dim == 128 && NT == 4 * 128 && tu.mk_dn_whole;
        const int xs = std::max({c.hidden + in_rows_per_block, c.intermediate, c.lin_value_dim(), c.n_heads * c.head_dim,
                                 dn_shape ? 5 * 128 : 0});
        const int aux = std::max({att_aux, dn_aux, c.lin_v_heads, dn_shape ? 2 * NW * 128 : 0});
        const int dnslice = dn_shape ? 128 * DN_COLS : 0;
        const int xs_pad = (xs + 3) / 4 * 4;
        // after aux: the block's residual rows and its in-projection rows' conv windows (16 floats each)
        const int own = per(c.hidden);
        const int convpre = 16 * in_rows_per_block;
        // Fused MLP (docs/megakernel.md, v4; the default, the mk_fuse knob turns it off): gate/up and down in
        // one stage; needs the [G][H] partial sums (G = threads per block /
        // (H / 8)) to fit in xs + red + aux
        const int fuse_groups = std::max(1, NT / std::max(1, c.hidden / 8));
        const bool fuse = tu.mk_fuse &&
                          fuse_groups * c.hidden <= xs_pad + 64 + aux;
        const int actv = fuse ? (per(c.intermediate) + 3) / 4 * 4 : 0;
        const int base = int(sizeof(float)) * (xs_pad + 64 + aux + own + convpre + dnslice + actv);
        int smem = base;
        const int threads = NT;
        const void* fn = decode_kernel_ptr(false);
        GPU_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
        int per_sm = 0;
        GPU_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, fn, threads, size_t(smem)));
        if (per_sm < 1) fail("unsupported", "the decode kernel (" + std::to_string(threads) + " threads, " + std::to_string(smem) +
                                                " B shared memory) does not fit on a multiprocessor of " + prop_name_);
        info_.blocks_per_sm = per_sm;
        info_.sms = sms_;
        info_.blocks = per_sm * sms_;
        info_.threads = threads;
        info_.smem_bytes = smem;
        kernel_ = fn;
        // Fused DeltaNet out-projection (docs/megakernel.md, v4; with the fused MLP, the mk_fuse_out knob turns
        // it off): the per-head counters need every DeltaNet item (head, 16 columns) in its own block
        const bool fuse_out = fuse && tu.mk_fuse_out &&
                              c.lin_v_heads * (c.lin_v_dim / DN_COLS) <= info_.blocks;
        // ... and the in-projection -> DeltaNet barrier through per-head counters (mk_fuse_in)
        const bool fuse_in = fuse_out && tu.mk_fuse_in;
        // ... and whole-head DeltaNet items on top of the fused out-projection: q, k, v, z and the outputs in xs,
        // two out_proj rows a warp per step, at most 4 steps
        const int per_head = std::max(1, c.lin_v_dim / DN_COLS);
        const bool dn_whole = dn_shape && fuse_out && xs_pad >= 5 * 128 && c.lin_v_heads % std::max(1, c.lin_k_heads) == 0 &&
                              c.hidden % (per_head * 2 * NW) == 0 && c.hidden / (per_head * 2 * NW) <= 4;
        // ... and the same for attention layers (mk_fuse_att): q head h's blocks are [h bph,
        // (h + 1) bph); the counters are indexed by q head / KV head within the [n_layers][hv] arrays; the
        // merge reuses the attention's per-warp outputs (NW hd floats), the gated head columns go to the
        // fused MLP's activation slice (actv)
        const int bph = info_.blocks / std::max(1, c.n_heads), cpb = (c.head_dim + bph - 1) / std::max(1, bph);
        const bool fuse_att = fuse_in && tu.mk_fuse_att && bph >= 1 &&
                              c.n_heads <= c.lin_v_heads && c.n_kv_heads <= c.lin_v_heads &&
                              2 * bph + bph * cpb <= NW * c.head_dim && cpb <= actv;
        // ... and its out-projection by rows (stage_attention): one warp a row of head_dim = 256 inputs, at most
        // NW chunks a head (their maxima and sums in the attention's per-warp slots) and 4 rows a warp
        const bool att_rows = fuse_att && c.head_dim == 256 && bph <= NW && c.hidden % bph == 0 &&
                              (c.hidden / bph) % NW == 0 && c.hidden / bph <= 4 * NW && tu.mk_att_rows;
        int n_lin = 0;
        for (int l = 0; l < c.n_layers; ++l) n_lin += c.is_full[size_t(l)] ? 0 : 1;
        const int n_full = c.n_layers - n_lin;
        info_.barriers_per_token = (fuse ? 4 : 5) * c.n_layers - (fuse_out ? n_lin : 0) - (fuse_in ? n_lin : 0) -
                                   (fuse_att ? 2 * n_full : 0);
        info_.fused = fuse;
        info_.fused_out = fuse_out;
        info_.fused_in = fuse_in;
        info_.fused_att = fuse_att;
        info_.dn_whole = dn_whole;
        info_.att_rows = att_rows;
        const int nb = info_.blocks;

        std::vector<LayerPtrs> lp(size_t(c.n_layers));
        for (int l = 0; l < c.n_layers; ++l) {
            const Qwen35Layer& L = w_.layers[size_t(l)];
            LayerPtrs& d = lp[size_t(l)];
            std::memset(&d, 0, sizeof(d));
            d.full = L.full;
            d.input_norm = F(L.input_norm);
            d.post_norm = F(L.post_norm);
            d.gate_up = W(L.gate_up);
            d.down = W(L.down);
            if (fuse) d.down_t = transposed(L.down);  // [I, H]: a block's slice of the intermediate is contiguous rows
            if (L.full) {
                d.in_w = W(L.attn_qkv);
                d.in_rows = c.attn_qkv_rows();
                d.out_w = W(L.o_proj);
                d.out_in = c.n_heads * c.head_dim;
                d.q_norm = F(L.q_norm);
                d.k_norm = F(L.k_norm);
                if (fuse_att) d.out_t = transposed(L.o_proj);  // [nh hd, H]: a block's columns of a head are contiguous rows
                d.kc = kc_[size_t(l)];
                d.vc = vc_[size_t(l)];
            } else {
                d.in_w = W(L.lin_in);
                d.in_rows = c.lin_in_rows();
                d.out_w = W(L.out_proj);
                d.out_in = c.lin_value_dim();
                d.conv_w = F(L.conv_w);
                d.neg_A = F(L.neg_A);
                d.dt_bias = F(L.dt_bias);
                d.ssm_norm = F(L.ssm_norm);
                if (fuse_out) d.out_t = transposed(L.out_proj);  // [vd, H]: a block's 16 columns are 16 contiguous rows
                d.ssm = ssm_[size_t(l)];
                d.conv_state = conv_[size_t(l)];
            }
        }
        auto* d_layers = (LayerPtrs*)alloc(sizeof(LayerPtrs) * lp.size());
        GPU_CHECK(cudaMemcpy(d_layers, lp.data(), sizeof(LayerPtrs) * lp.size(), cudaMemcpyHostToDevice));

        Params& p = params_;
        std::memset(&p, 0, sizeof(p));
        p.layers = d_layers;
        p.n_layers = c.n_layers;
        p.embed = W(w_.embed);
        p.lm_head = W(w_.lm_head);
        p.final_norm = F(w_.final_norm);
        p.H = c.hidden;
        p.I = c.intermediate;
        p.V = c.vocab;
        p.hk = c.lin_k_heads;
        p.hv = c.lin_v_heads;
        p.dk = c.lin_k_dim;
        p.dv = c.lin_v_dim;
        p.conv_k = c.conv_kernel;
        p.cd = c.conv_dim();
        p.vd = c.lin_value_dim();
        p.nh = c.n_heads;
        p.nkv = c.n_kv_heads;
        p.hd = c.head_dim;
        p.rot = c.rope_dims;
        p.theta = c.rope_theta;
        p.eps = c.eps;
        p.kv_f16 = kt_ == DType::F16;
        p.xs_floats = xs_pad;
        p.aux_floats = aux;
        p.own_floats = own;
        p.convpre_floats = convpre;
        p.fuse = fuse;
        p.fuse_out = fuse_out;
        p.fuse_in = fuse_in;
        p.fuse_att = fuse_att;
        p.dn_whole = dn_whole;
        p.att_rows = att_rows;
        p.dnslice_floats = dnslice;
        p.early = DefaultConfig::early;
        if (!tu.mk_trace.empty()) {
            trace_path_ = tu.mk_trace;
            p.trace = (long long*)alloc_zeroed(sizeof(long long) * 2 * size_t(c.n_layers * 16 + 2));  // unwritten stamps stay 0
        }
        // The default configuration has its own build of the v1 kernel with every switch fixed at compile time
        // (decode_kernel.cu: Knobs<true>; 2.4x less machine code); the mk_generic knob runs the run-time build.
        if (is_default_config(p) && !tu.mk_generic) {
            const void* fixed = decode_kernel_ptr(true);
            GPU_CHECK(cudaFuncSetAttribute(fixed, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
            int fixed_per_sm = 0;
            GPU_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&fixed_per_sm, fixed, threads, size_t(smem)));
            if (fixed_per_sm == per_sm) {  // same grid (the work split above was sized for it)
                kernel_ = fixed;
                info_.fixed = true;
            }
        }
        d_pos_ = (int*)alloc(sizeof(int));
        d_tok_ = (int*)alloc(sizeof(int));
        d_step_ = (int*)alloc(sizeof(int));
        d_done_ = (int*)alloc(sizeof(int));
        d_out_ = (int*)alloc(sizeof(int) * size_t(max_ctx_ + 1));
        d_eos_ = (int*)alloc(sizeof(int) * MAX_EOS);
        p.pos = d_pos_;
        p.tok = d_tok_;
        p.out_tokens = d_out_;
        p.step = d_step_;
        p.done = d_done_;
        p.eos = d_eos_;
        const size_t in_max = size_t(std::max(c.lin_in_rows(), c.attn_qkv_rows()));
        p.x = (float*)alloc(4 * size_t(c.hidden));
        p.buf_in = (float*)alloc(4 * in_max);
        p.conv_out = (float*)alloc(4 * size_t(std::max(1, c.conv_dim())));
        p.g = (float*)alloc(4 * size_t(std::max(1, c.lin_v_heads)));
        p.beta = (float*)alloc(4 * size_t(std::max(1, c.lin_v_heads)));
        p.o = (float*)alloc(4 * size_t(std::max(c.lin_value_dim(), c.n_heads * c.head_dim)));
        p.act = (float*)alloc(4 * size_t(c.intermediate));
        p.att_part = (float*)alloc(4 * size_t(c.n_heads) * nb * (c.head_dim + 2));
        const size_t nt = size_t(c.n_layers) * c.n_heads + 1;
        p.tickets = (unsigned*)alloc_zeroed(sizeof(unsigned) * nt);
        p.lm_val = (float*)alloc(4 * size_t(nb));
        p.lm_idx = (int*)alloc(4 * size_t(nb));
        if (fuse) {
            p.mlp_acc = (unsigned long long*)alloc_zeroed(2 * sizeof(unsigned long long) * size_t(c.hidden));
        }
        if (fuse_out) {
            p.out_acc = (unsigned long long*)alloc_zeroed(2 * sizeof(unsigned long long) * size_t(c.hidden));
            p.head_ss = (float*)alloc(sizeof(float) * size_t(c.lin_v_heads) * (c.lin_v_dim / DN_COLS));
            p.head_cnt = (unsigned*)alloc_zeroed(sizeof(unsigned) * size_t(c.n_layers) * c.lin_v_heads);
        }
        if (fuse_in) {
            p.in_cnt = (unsigned*)alloc_zeroed(sizeof(unsigned) * size_t(c.n_layers) * c.lin_v_heads);
            p.x2 = (float*)alloc(4 * size_t(c.hidden));
        }
        p.bar = (unsigned*)alloc_zeroed(sizeof(unsigned));
        GPU_CHECK(cudaMemset(d_done_, 0, sizeof(int)));
        GPU_CHECK(cudaDeviceSynchronize());
        fprintf(stderr, "[megakernel] decode kernel%s: %d blocks (%d per SM x %d SMs) x %d threads, %d B shared memory, "
                "fused MLP %d, fused DeltaNet out-projection %d and in-projection %d, fused attention %d, "
                "whole-head DeltaNet items %d, attention out-projection by rows %d\n",
                info_.fixed ? " (default configuration fixed at compile time)" : "",
                info_.blocks, per_sm, sms_, threads, smem, int(fuse), int(fuse_out), int(fuse_in),
                int(fuse_att), int(dn_whole), int(att_rows));
    }

    // ---------------------------------------------------------------------------------- prefill (core ops)
    gpu::ForwardWorkspace ws_;

    // The core GPU backend's forward over n tokens (core/cuda/qwen35_gpu.cu), on this backend's caches.
    void prefill(const int* tokens, int n) {
        ws_.ensure(cfg_, n, [this](size_t bytes) { return alloc(bytes); });
        GPU_CHECK(cudaMemcpyAsync(ws_.tokens, tokens, sizeof(int) * size_t(n), cudaMemcpyHostToDevice, s_));
        // K and V share one type here (allocate() accepts bf16/bf16 or f16/f16 only); the argmax of the last
        // position lands in d_tok_, the decode kernel's first input token.
        gpu::forward_layers(cfg_, w_, ws_, {kc_, vc_, kt_, kt_, ssm_, conv_, d_pos_}, ws_.tokens, n, d_tok_, s_);
        GPU_CHECK(cudaGetLastError());
        len_ += n;
    }

    gpu::DeviceContext ctx_;  // the core ops' limits and scratch (prefill), this backend's alone
    int device_;
    std::string prop_name_;
    size_t mem_ = 0;
    int sms_ = 0, coop_ = 0, cc_ = 0, smem_optin_ = 0;
    cudaStream_t s_;
    cudaEvent_t ev0_, ev1_;
    Qwen35Config cfg_;
    Qwen35Weights w_;
    std::vector<void*> allocations_;
    uint64_t allocated_ = 0, decode_weight_bytes_ = 0;
    int max_ctx_ = 0, len_ = 0;
    DType kt_ = DType::BF16;
    std::vector<void*> kc_, vc_;
    std::vector<float*> ssm_, conv_;
    int *d_pos_ = nullptr, *d_tok_ = nullptr, *d_step_ = nullptr, *d_done_ = nullptr, *d_out_ = nullptr, *d_eos_ = nullptr;
    Params params_;
    LaunchInfo info_;
    const void* kernel_ = nullptr;  // the decode kernel launched (the fixed or the run-time build)
    std::string trace_path_;
};

}  // namespace

std::unique_ptr<MegaBackend> make_megakernel_backend(int device) { return std::make_unique<MegaBackendImpl>(device); }

}  // namespace lb::mk
