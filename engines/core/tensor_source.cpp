#include "tensor_source.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "errors.h"

namespace lb {

MappedFile::MappedFile(const std::string& path) : path_(path) {
    int fd = open(path.c_str(), O_RDONLY);
    if (fd < 0) fail("load", "cannot open " + path + ": " + strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) { close(fd); fail("load", "cannot stat " + path); }
    size_ = size_t(st.st_size);
    if (size_ > 0) {
        void* p = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) { close(fd); fail("load", "cannot map " + path + ": " + strerror(errno)); }
        data_ = (const uint8_t*)p;
    }
    close(fd);
}

MappedFile::~MappedFile() {
    if (data_) munmap((void*)data_, size_);
}

const TensorInfo* TensorSource::find(const std::string& name) const {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> TensorSource::names() const {
    std::vector<std::string> out;
    for (auto& kv : tensors_) out.push_back(kv.first);
    return out;
}

uint64_t TensorSource::total_bytes() const {
    uint64_t n = 0;
    for (auto& kv : tensors_) n += kv.second.nbytes;
    return n;
}

std::vector<float> TensorSource::read_f32(const TensorInfo& t) const {
    std::vector<float> out(static_cast<size_t>(t.numel()));
    decode_row(t.dtype, t.data, out.data(), out.size());
    return out;
}

static bool file_exists(const std::string& p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0;
}
static bool is_dir(const std::string& p) {
    struct stat st;
    return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}
static std::string read_text(const std::string& path) {
    std::ifstream f(path);
    if (!f) fail("load", "cannot read " + path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
}
static bool ends_with(const std::string& s, const std::string& suffix) {
    return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// ---------------------------------------------------------------------------------------------- safetensors

namespace {
class SafetensorsSource : public TensorSource {
public:
    void add_file(const std::string& path) {
        auto file = std::make_shared<MappedFile>(path);
        if (file->size() < 8) fail("load", path + ": truncated safetensors file (no header)");
        uint64_t header_len;
        memcpy(&header_len, file->data(), 8);
        if (8 + header_len > file->size()) fail("load", path + ": truncated safetensors file (header runs past the end)");
        Json header;
        try {
            header = Json::parse(std::string((const char*)file->data() + 8, header_len));
        } catch (const std::exception& e) {
            fail("load", path + ": bad safetensors header: " + e.what());
        }
        const uint8_t* base = file->data() + 8 + header_len;
        size_t data_size = file->size() - 8 - header_len;
        for (auto& [name, desc] : header.members()) {
            if (name == "__metadata__") continue;
            TensorInfo t;
            t.name = name;
            t.file = path;
            const std::string& dt = desc.get("dtype") ? desc.get("dtype")->as_string() : "";
            if (dt == "F32") t.dtype = DType::F32;
            else if (dt == "F16") t.dtype = DType::F16;
            else if (dt == "BF16") t.dtype = DType::BF16;
            else fail("unsupported", path + ": tensor " + name + " has dtype " + dt + " (supported: F32, F16, BF16)");
            for (auto& d : desc.get("shape")->items()) t.shape.push_back(d.as_int());
            auto& off = desc.get("data_offsets")->items();
            uint64_t begin = uint64_t(off.at(0).as_int()), end = uint64_t(off.at(1).as_int());
            if (end > data_size || begin > end)
                fail("load", path + ": truncated file: tensor " + name + " ends at byte " + std::to_string(end) +
                                 " of a " + std::to_string(data_size) + "-byte data section");
            if (end - begin != uint64_t(t.numel()) * dtype_block_bytes(t.dtype))
                fail("load", path + ": tensor " + name + " byte size does not match its shape");
            t.data = base + begin;
            t.nbytes = end - begin;
            tensors_[name] = t;
        }
        files_.push_back(file);
    }
};
}  // namespace

std::unique_ptr<TensorSource> open_safetensors(const std::string& path) {
    std::string dir = is_dir(path) ? path : path.substr(0, path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/'));
    if (dir.empty()) dir = ".";
    auto src = std::make_unique<SafetensorsSource>();
    std::string config = dir + "/config.json";
    if (!file_exists(config)) fail("load", "no config.json in " + dir);
    try {
        src->metadata_ = Json::parse(read_text(config));
    } catch (const EngineError&) {
        throw;
    } catch (const std::exception& e) {
        fail("load", config + ": " + e.what());
    }
    src->format_ = "safetensors";
    if (!is_dir(path)) {
        src->add_file(path);
        return src;
    }
    std::string index = dir + "/model.safetensors.index.json";
    if (file_exists(index)) {
        Json idx = Json::parse(read_text(index));
        const Json* wm = idx.get("weight_map");
        if (!wm) fail("load", index + ": no weight_map");
        std::vector<std::string> shards;
        for (auto& [name, file] : wm->members()) {
            bool seen = false;
            for (auto& s : shards) seen |= s == file.as_string();
            if (!seen) shards.push_back(file.as_string());
        }
        for (auto& s : shards) {
            if (!file_exists(dir + "/" + s)) fail("load", "missing shard " + dir + "/" + s + " (listed in " + index + ")");
            src->add_file(dir + "/" + s);
        }
    } else if (file_exists(dir + "/model.safetensors")) {
        src->add_file(dir + "/model.safetensors");
    } else {
        fail("load", "no model.safetensors or model.safetensors.index.json in " + dir);
    }
    return src;
}

// ---------------------------------------------------------------------------------------------- GGUF

namespace {
struct GgufReader {
    const uint8_t* p;
    const uint8_t* end;
    std::string path;
    void need(size_t n) {
        if (size_t(end - p) < n) fail("load", path + ": truncated GGUF file (metadata runs past the end)");
    }
    template <class T> T get() { need(sizeof(T)); T v; memcpy(&v, p, sizeof(T)); p += sizeof(T); return v; }
    std::string str() {
        uint64_t n = get<uint64_t>();
        need(n);
        std::string s((const char*)p, n);
        p += n;
        return s;
    }
    Json scalar(uint32_t type) {
        switch (type) {
            case 0: return Json(int(get<uint8_t>()));
            case 1: return Json(int(get<int8_t>()));
            case 2: return Json(int(get<uint16_t>()));
            case 3: return Json(int(get<int16_t>()));
            case 4: return Json(int64_t(get<uint32_t>()));
            case 5: return Json(int(get<int32_t>()));
            case 6: return Json(double(get<float>()));
            case 7: return Json(get<uint8_t>() != 0);
            case 8: return Json(str());
            case 10: return Json(uint64_t(get<uint64_t>()));
            case 11: return Json(int64_t(get<int64_t>()));
            case 12: return Json(get<double>());
            case 9: {
                uint32_t et = get<uint32_t>();
                uint64_t n = get<uint64_t>();
                Json a = Json::array();
                // Token tables are large and unused here: skip their contents but keep the count.
                if (n > 100000) {
                    for (uint64_t i = 0; i < n; ++i) scalar(et);
                    Json skipped = Json::object();
                    skipped["skipped_array_len"] = Json(uint64_t(n));
                    return skipped;
                }
                for (uint64_t i = 0; i < n; ++i) a.push_back(scalar(et));
                return a;
            }
            default: fail("load", path + ": unknown GGUF metadata type " + std::to_string(type));
        }
    }
};

bool ggml_type_to_dtype(uint32_t t, DType* out) {
    switch (t) {
        case 0: *out = DType::F32; return true;
        case 1: *out = DType::F16; return true;
        case 2: *out = DType::Q4_0; return true;
        case 8: *out = DType::Q8_0; return true;
        case 12: *out = DType::Q4_K; return true;
        case 13: *out = DType::Q5_K; return true;
        case 14: *out = DType::Q6_K; return true;
        case 30: *out = DType::BF16; return true;
        default: return false;
    }
}

class GgufSource : public TensorSource {
public:
    explicit GgufSource(const std::string& path) {
        auto file = std::make_shared<MappedFile>(path);
        format_ = "gguf";
        GgufReader r{file->data(), file->data() + file->size(), path};
        r.need(4);
        if (memcmp(r.p, "GGUF", 4) != 0) fail("load", path + ": not a GGUF file (bad magic)");
        r.p += 4;
        uint32_t version = r.get<uint32_t>();
        if (version < 2 || version > 3) fail("unsupported", path + ": GGUF version " + std::to_string(version) + " (supported: 2, 3)");
        uint64_t n_tensors = r.get<uint64_t>();
        uint64_t n_kv = r.get<uint64_t>();
        metadata_ = Json::object();
        for (uint64_t i = 0; i < n_kv; ++i) {
            std::string key = r.str();
            uint32_t type = r.get<uint32_t>();
            metadata_[key] = r.scalar(type);
        }
        struct Raw { std::string name; std::vector<int64_t> shape; uint32_t type; uint64_t offset; };
        std::vector<Raw> raws;
        for (uint64_t i = 0; i < n_tensors; ++i) {
            Raw t;
            t.name = r.str();
            uint32_t n_dims = r.get<uint32_t>();
            std::vector<int64_t> ne(n_dims);
            for (auto& d : ne) d = int64_t(r.get<uint64_t>());
            t.shape.assign(ne.rbegin(), ne.rend());
            t.type = r.get<uint32_t>();
            t.offset = r.get<uint64_t>();
            raws.push_back(t);
        }
        uint64_t alignment = 32;
        if (auto* a = metadata_.get("general.alignment")) alignment = uint64_t(a->as_int());
        size_t header_end = size_t(r.p - file->data());
        size_t data_start = (header_end + alignment - 1) / alignment * alignment;
        for (auto& raw : raws) {
            TensorInfo t;
            t.name = raw.name;
            t.shape = raw.shape;
            t.file = path;
            if (!ggml_type_to_dtype(raw.type, &t.dtype))
                fail("unsupported", path + ": tensor " + raw.name + " has ggml type " + std::to_string(raw.type) +
                                        " (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q5_K, Q6_K)");
            int64_t inner = t.shape.empty() ? 1 : t.shape.back();
            if (inner % int64_t(dtype_block_elems(t.dtype)) != 0)
                fail("load", path + ": tensor " + raw.name + " row length is not a multiple of its block size");
            t.nbytes = dtype_row_bytes(t.dtype, size_t(t.numel()));
            if (data_start + raw.offset + t.nbytes > file->size())
                fail("load", path + ": truncated file: tensor " + raw.name + " runs past the end of the file");
            t.data = file->data() + data_start + raw.offset;
            tensors_[t.name] = t;
        }
        files_.push_back(file);
    }
};
}  // namespace

std::unique_ptr<TensorSource> open_gguf(const std::string& path) { return std::make_unique<GgufSource>(path); }

std::unique_ptr<TensorSource> open_checkpoint(const std::string& path) {
    if (!file_exists(path)) fail("load", "model path does not exist: " + path);
    if (ends_with(path, ".gguf")) return open_gguf(path);
    return open_safetensors(path);
}

}  // namespace lb
