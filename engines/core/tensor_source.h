// Read-only access to the tensors of a checkpoint, whatever the file format: Hugging Face safetensors
// (a folder with one file or a sharded index) or a GGUF file. Files are memory-mapped; tensors are
// decoded to fp32 on request, one at a time, so loading never holds two copies of the model.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "json.h"
#include "quant.h"

namespace lb {

struct TensorInfo {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;  // row-major, outermost dimension first (GGUF's ne[] reversed)
    const uint8_t* data = nullptr;
    size_t nbytes = 0;
    std::string file;
    int64_t numel() const { int64_t n = 1; for (auto d : shape) n *= d; return n; }
};

// One memory-mapped file; unmapped when the last owner goes.
class MappedFile {
public:
    explicit MappedFile(const std::string& path);  // throws EngineError("load") with the reason
    ~MappedFile();
    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }
    const std::string& path() const { return path_; }
private:
    std::string path_;
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
};

class TensorSource {
public:
    virtual ~TensorSource() = default;
    const TensorInfo* find(const std::string& name) const;
    std::vector<std::string> names() const;
    std::vector<float> read_f32(const TensorInfo& t) const;  // decodes any supported dtype
    // Model description: config.json (safetensors) or the GGUF key/value metadata as a JSON object.
    const Json& metadata() const { return metadata_; }
    const std::string& format() const { return format_; }  // "safetensors" or "gguf"
    uint64_t total_bytes() const;                          // bytes of all tensor data
    // Filled by the format readers.
    std::map<std::string, TensorInfo> tensors_;
    std::vector<std::shared_ptr<MappedFile>> files_;
    Json metadata_;
    std::string format_;
};

// `path` is a folder with config.json and *.safetensors (model.safetensors or an index), or one
// .safetensors file next to a config.json.
std::unique_ptr<TensorSource> open_safetensors(const std::string& path);
std::unique_ptr<TensorSource> open_gguf(const std::string& path);
// Dispatches on the path: a .gguf file, else a safetensors checkpoint.
std::unique_ptr<TensorSource> open_checkpoint(const std::string& path);

}  // namespace lb
