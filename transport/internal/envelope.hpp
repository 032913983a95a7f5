#pragma once
/// Sealed byte envelopes for addresses and descriptors that cross process boundaries.
///
/// Layout (little-endian): magic "WFTX" (u32) | version u16 | kind u16 | payload size u32 |
/// payload | XXH3-64 of everything before it (u64). Backends hand raw UCX address/rkey bytes to
/// libraries that would crash on garbage, so every byte string from a peer is opened (magic,
/// kind, size and checksum checked) before any of it reaches a backend library.

#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include "transport/engine.hpp"

namespace weft::transport::internal {

enum class envelope_kind : std::uint16_t {
  ucx_address = 1,
  ucx_region = 2,
  inproc_address = 3,
  inproc_region = 4,
  nccl_group = 5,
};

/// Wraps `payload` into a sealed envelope of `kind`.
bytes seal(envelope_kind kind, std::span<const std::byte> payload);

/// Checks an envelope and returns a view of its payload, or invalid_argument naming the defect.
result<std::span<const std::byte>> open(envelope_kind kind, std::span<const std::byte> sealed);

/// Appends fixed-width integers and byte strings.
class byte_writer {
 public:
  void u64(std::uint64_t v) { raw(&v, sizeof v); }
  void blob(std::span<const std::byte> b) {
    u64(b.size());
    raw(b.data(), b.size());
  }
  void raw(const void* p, std::size_t n) {
    auto* b = static_cast<const std::byte*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  bytes& out() { return out_; }

 private:
  bytes out_;
};

/// Reads what byte_writer wrote; every read is bounds-checked.
class byte_reader {
 public:
  explicit byte_reader(std::span<const std::byte> in) : in_(in) {}
  bool u64(std::uint64_t& v) {
    if (in_.size() - pos_ < sizeof v) return false;
    std::memcpy(&v, in_.data() + pos_, sizeof v);
    pos_ += sizeof v;
    return true;
  }
  bool blob(std::span<const std::byte>& b) {
    std::uint64_t n = 0;
    if (!u64(n) || n > in_.size() - pos_) return false;
    b = in_.subspan(pos_, n);
    pos_ += n;
    return true;
  }
  bool at_end() const { return pos_ == in_.size(); }

 private:
  std::span<const std::byte> in_;
  std::size_t pos_ = 0;
};

}  // namespace weft::transport::internal
