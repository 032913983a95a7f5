#pragma once
// Helpers shared by the gpu_io tests: a raw little-endian GGUF byte builder (to craft malformed
// files) and the location of the real default model.

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace weft::gpu::test {

/// Appends raw GGUF fields; no validation at all (that is the point).
struct raw_gguf {
  std::vector<std::byte> bytes;

  template <class T>
  raw_gguf& put(T v) {
    const size_t at = bytes.size();
    bytes.resize(at + sizeof(T));
    std::memcpy(bytes.data() + at, &v, sizeof(T));
    return *this;
  }
  raw_gguf& u32(uint32_t v) { return put(v); }
  raw_gguf& u64(uint64_t v) { return put(v); }
  raw_gguf& str(const std::string& s) {
    u64(s.size());
    for (char c : s) bytes.push_back(static_cast<std::byte>(c));
    return *this;
  }
  raw_gguf& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return u32(0x46554747u).u32(version).u64(n_tensors).u64(n_kv);
  }
  raw_gguf& kv_u32(const std::string& key, uint32_t v) { return str(key).u32(4).u32(v); }
  raw_gguf& tensor_info(const std::string& name, std::vector<uint64_t> ne, uint32_t type,
                        uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(ne.size()));
    for (auto d : ne) u64(d);
    return u32(type).u64(offset);
  }
  raw_gguf& pad(size_t alignment) {
    while (bytes.size() % alignment) bytes.push_back(std::byte{0});
    return *this;
  }
  raw_gguf& zeros(size_t n) {
    bytes.resize(bytes.size() + n);
    return *this;
  }
};

/// Path of the real default model, or empty when it is not present (tests then skip).
inline std::filesystem::path default_model_path() {
  namespace fs = std::filesystem;
  const char* name = "SmolLM2-135M-Instruct.Q4_1.gguf";
  if (const char* m = std::getenv("WEFT_MODEL"); m != nullptr && fs::exists(m)) return m;
  if (const char* c = std::getenv("WEFT_CACHE_DIR"); c != nullptr) {
    const fs::path p = fs::path(c) / "models" / name;
    if (fs::exists(p)) return p;
  }
  if (const char* h = std::getenv("HOME"); h != nullptr) {
    const fs::path p = fs::path(h) / ".cache" / "weft" / "models" / name;
    if (fs::exists(p)) return p;
  }
  return {};
}

}  // namespace weft::gpu::test
