#pragma once
/// Writer for GGUF version 3 files: metadata of every value type and tensors of every known ggml
/// type, with configurable alignment. Used by tests, the tiny-model generator and tools.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "gpu/ggml_types.hpp"
#include "gpu/gguf.hpp"
#include "gpu/status.hpp"

namespace weft::gpu {

/// llama.cpp's general.file_type for a file whose matrices are mostly of type `t` (0 = all f32).
uint32_t llama_file_type(ggml_type t);

/// Options of gguf_writer.
struct gguf_writer_config {
  /// Alignment of the data section and of every tensor (power of two). When it differs from 32 the
  /// writer stores it as general.alignment.
  uint32_t alignment = gguf_default_alignment;
};

/// Collects metadata and tensors in memory, then serializes them. Not thread-safe.
class gguf_writer {
 public:
  explicit gguf_writer(gguf_writer_config config = {});

  /// Sets `key` to `value`; a key set twice keeps its first position and the last value.
  void set(const std::string& key, gguf_value value);

  /// Adds a tensor from its raw bytes (already in `type`'s layout). `ne[0]` is the row length.
  /// Fails on an empty or duplicate name, bad dims, or a byte count that does not match.
  status add_tensor(const std::string& name, ggml_type type, std::span<const int64_t> ne,
                    std::span<const std::byte> data);

  /// Adds a tensor from floats, converting every row to `type` with quantize_row.
  status add_tensor_from_f32(const std::string& name, ggml_type type, std::span<const int64_t> ne,
                             std::span<const float> values);

  /// The file image.
  result<std::vector<std::byte>> to_bytes() const;

  /// Writes the file image to `path` (via a temporary file renamed into place, synced; the
  /// tensors' bytes go out from where they are held, past the page cache where the file system
  /// takes it: gpu/direct_file.hpp).
  status write_file(const std::filesystem::path& path) const;

  size_t n_tensors() const { return tensors_.size(); }

 private:
  struct pending_tensor {
    std::string name;
    ggml_type type;
    std::vector<int64_t> ne;
    std::vector<std::byte> data;
  };

  /// The file up to its data section: header, metadata, tensor infos, padding.
  result<std::vector<std::byte>> head_bytes() const;
  /// `n` rounded up to the alignment.
  size_t padded(size_t n) const;
  status add_tensor_bytes(const std::string& name, ggml_type type, std::span<const int64_t> ne,
                          std::vector<std::byte> data);

  gguf_writer_config config_;
  std::vector<std::pair<std::string, gguf_value>> metadata_;
  std::vector<pending_tensor> tensors_;
};

}  // namespace weft::gpu
