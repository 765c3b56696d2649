// Kernel timeline of any CUDA program, without changing it: a CUDA injection library (load it with
// CUDA_INJECTION64_PATH=libkernel_timeline.so) that records every kernel's GPU start and end through the
// CUPTI activity API (CONCURRENT_KERNEL: kernels that overlap, as programmatic dependent launches do, keep
// their own times; graph-launched kernels are recorded one node at a time) and writes them as CSV at exit:
//   start_ns,end_ns,graph_node,grid,block,name
// to $LB_TIMELINE_OUT (default /tmp/kernel_timeline.csv). Used by scripts/device/timeline_decode.py.
// Build: g++ -O2 -shared -fPIC kernel_timeline.cpp -I<CUDA include> -L<CUPTI lib> -lcupti -o libkernel_timeline.so
#include <cupti.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Row {
    unsigned long long start, end, node;
    int grid, block;
    std::string name;
};
std::mutex g_mu;
std::vector<Row> g_rows;
constexpr size_t kBufBytes = 8u << 20;

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufBytes));
    *size = kBufBytes;
    *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
    CUpti_Activity* rec = nullptr;
    std::vector<Row> rows;
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
        rows.push_back({k->start, k->end, k->graphNodeId, k->gridX * k->gridY * k->gridZ, k->blockX * k->blockY * k->blockZ,
                        k->name ? k->name : "?"});
    }
    std::free(buffer);
    std::lock_guard<std::mutex> lock(g_mu);
    g_rows.insert(g_rows.end(), rows.begin(), rows.end());
}

void write_out() {
    cuptiActivityFlushAll(1);
    const char* path = std::getenv("LB_TIMELINE_OUT");
    FILE* f = std::fopen(path ? path : "/tmp/kernel_timeline.csv", "w");
    if (!f) return;
    std::fprintf(f, "start_ns,end_ns,graph_node,grid,block,name\n");
    std::lock_guard<std::mutex> lock(g_mu);
    for (const Row& r : g_rows) {
        std::string n = r.name;
        for (char& c : n)
            if (c == ',') c = ';';  // template argument lists: keep the CSV's columns
        std::fprintf(f, "%llu,%llu,%llu,%d,%d,%s\n", r.start, r.end, r.node, r.grid, r.block, n.c_str());
    }
    std::fclose(f);
}

}  // namespace

extern "C" int InitializeInjection(void) {
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) return 0;
    if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) return 0;
    std::atexit(write_out);
    return 1;
}
