#pragma once
// Bounds-checked little-endian reader over a byte image; used by the GGUF parser only.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <type_traits>

namespace weft::gpu::internal {

static_assert(std::endian::native == std::endian::little,
              "GGUF reader assumes a little-endian host");

/// Sequential reader; every read checks the remaining size first and leaves the cursor unchanged on
/// failure.
class gguf_cursor {
 public:
  gguf_cursor(const std::byte* data, size_t size) : data_(data), size_(size) {}

  size_t offset() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }
  size_t size() const { return size_; }

  template <class T>
  requires std::is_trivially_copyable_v<T>
  bool read(T& out) {
    if (remaining() < sizeof(T)) return false;
    std::memcpy(&out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }

  /// A view of the next `n` bytes (valid as long as the image).
  bool read_bytes(uint64_t n, std::string_view& out) {
    if (n > remaining()) return false;
    out = std::string_view(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return true;
  }

 private:
  const std::byte* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace weft::gpu::internal
