#pragma once
/// Checksums for verifying transferred bytes (XXH3-64).

#include <cstddef>
#include <cstdint>
#include <span>

namespace weft::transport {

/// XXH3-64 of `data`. Thread-safe, non-blocking.
std::uint64_t checksum(std::span<const std::byte> data);

/// XXH3-64 of `size_bytes` bytes at `data`.
std::uint64_t checksum(const void* data, std::size_t size_bytes);

/// Fills `data` with a deterministic pseudo-random pattern derived from `seed` (for tests and
/// benchmarks: two equal seeds give equal bytes, different seeds differ almost everywhere).
void fill_pattern(std::span<std::byte> data, std::uint64_t seed);

}  // namespace weft::transport
