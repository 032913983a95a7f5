#pragma once
// Read-only byte image of a GGUF file: a private mmap of the file, a copy in huge-page-backed
// anonymous memory, or an owned heap copy.

#include <cstddef>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

namespace weft::gpu::internal {

/// Owns the bytes a gguf_file points into. Not copyable or movable (the gguf_file holds it by
/// unique_ptr so that tensor data pointers survive moves of the gguf_file).
class gguf_image {
 public:
  using progress_fn = std::function<void(size_t done, size_t total)>;

  /// Maps `path`; on failure returns false and sets `error`. `huge_pages`: copy the file into
  /// anonymous memory advised for transparent huge pages instead (if the kernel allows them).
  /// `load_now`: read every page before returning, reporting to `progress` if set.
  bool map_file(const std::filesystem::path& path, bool huge_pages, bool load_now,
                const progress_fn& progress, std::string& error);
  /// Copies `bytes` into an owned, page-aligned buffer.
  void copy_from(std::span<const std::byte> bytes);

  gguf_image() = default;
  gguf_image(const gguf_image&) = delete;
  gguf_image& operator=(const gguf_image&) = delete;
  ~gguf_image();

  const std::byte* data() const { return data_; }
  /// The bytes, writable, when they are an owned heap copy (copy_from); null for mappings.
  std::byte* owned_data() { return owned_; }
  size_t size() const { return size_; }

 private:
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
  void* mapped_ = nullptr;  // non-null when data_ comes from mmap (of the file or anonymous)
  size_t mapped_size_ = 0;
  std::byte* owned_ = nullptr;
};

}  // namespace weft::gpu::internal
