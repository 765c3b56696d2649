// lucebench-megakernel: greedy decoding of Qwen3.5 hybrid models where each decode step is ONE persistent
// CUDA kernel (see decode_kernel.cuh), speaking docs/protocol.md. Prefill runs the core's CUDA operations;
// decode launches the kernel once per token back to back, the token staying on the device, and reads the
// tokens back once at the end. Logs go to stderr; stdout carries only protocol lines.
#include <cstdio>
#include <memory>
#include <string>

#include "core/errors.h"
#include "core/server.h"
#include "core/engine_main.h"
#include "core/tensor_source.h"

#if defined(LB_HAVE_GPU) && !defined(LB_MK_NO_KERNEL)  // cuda, or hip on wave32 targets (compile-checked only)
#define LB_MEGAKERNEL 1
#include "megakernel/megakernel.h"
#endif

#ifndef LB_DEFAULT_BACKEND
#define LB_DEFAULT_BACKEND "cpu"
#endif

namespace lb {
namespace {

#if defined(LB_MEGAKERNEL)
class MegaHandler : public RequestHandler {
public:
    MegaHandler(mk::MegaBackend& be, const Qwen35Config& cfg, int max_ctx) : be_(be), cfg_(cfg), max_ctx_(max_ctx) {}
    int vocab_size() const override { return cfg_.vocab; }
    int max_ctx() const override { return max_ctx_; }

    Json generate(const GenerateRequest& req) override {
        // Decode: n_gen - 1 launches of the persistent kernel back to back, the token staying on the device.
        Generation g = run_generation(be_, req, [&](std::vector<int>& out) {
            be_.decode_chain(req.n_gen - 1, req.ignore_eos ? std::vector<int>{} : req.eos_ids, &out);
        });
        return generation_reply(req, g, be_.decode_bytes(mean_decode_ctx(req, g)), be_.peak_mem_bytes());
    }

private:
    mk::MegaBackend& be_;
    const Qwen35Config& cfg_;
    int max_ctx_;
};
#endif

int run(int argc, char** argv) {
    EngineOptions opt;
    if (!parse_flags_or_report(argc, argv, &opt)) return 2;
    const std::string backend = backend_name(opt);
#if !defined(LB_MEGAKERNEL)
    emit_error("", "unsupported", "this build has no megakernel: it was built for the " + std::string(LB_DEFAULT_BACKEND) +
                                      " backend" + (std::string(LB_DEFAULT_BACKEND) == "hip" ? " with 64-lane wavefronts" : "") +
                                      " (the kernel needs cuda, or hip on a wave32 gfx10+ target)");
    return 1;
#else
    if (backend != LB_DEFAULT_BACKEND) {
        emit_error("", "unsupported", "this megakernel binary was built for the " + std::string(LB_DEFAULT_BACKEND) +
                                          " backend (asked for " + backend + ")");
        return 1;
    }
    std::unique_ptr<mk::MegaBackend> be;
    Qwen35Config cfg;
    LoadStats stats;
    const bool loaded = load_or_report([&] {
        fprintf(stderr, "[megakernel] loading %s\n", opt.model.c_str());
        be = mk::make_megakernel_backend(opt.device);
        auto src = open_checkpoint(opt.model);
        cfg = config_from_source(*src);
        be->load(*src, cfg, &stats);
        be->allocate(opt.max_ctx, opt.kv_k, opt.kv_v);
    });
    if (!loaded) return 1;
    const mk::LaunchInfo li = be->launch_info();
    Json options = kv_options(opt, be->weight_dtype());
    options["blocks"] = li.blocks;
    options["blocks_per_sm"] = li.blocks_per_sm;
    options["threads_per_block"] = li.threads;
    options["smem_bytes"] = li.smem_bytes;
    options["kernel"] = li.fixed ? "v1-fixed" : "v1";
    options["fused_mlp"] = li.fused;
    options["fused_out_proj"] = li.fused_out;
    options["fused_in_proj"] = li.fused_in;
    options["fused_attention"] = li.fused_att;
    options["whole_head_deltanet"] = li.dn_whole;
    options["attention_out_by_rows"] = li.att_rows;
    options["grid_barriers_per_token"] = li.barriers_per_token;
    options["decode_bytes_ctx1"] = Json(be->decode_bytes(1));
    emit(ready_line("megakernel", backend, options, cfg, stats, be->device(), opt.max_ctx));

    MegaHandler handler(*be, cfg, opt.max_ctx);
    return serve(handler);
#endif
}

}  // namespace
}  // namespace lb

int main(int argc, char** argv) { return lb::run(argc, argv); }
