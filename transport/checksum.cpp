#include "transport/checksum.hpp"

#include <cstring>

#include <xxhash.h>

namespace weft::transport {

std::uint64_t checksum(std::span<const std::byte> data) {
  return XXH3_64bits(data.data(), data.size());
}

std::uint64_t checksum(const void* data, std::size_t size_bytes) {
  return XXH3_64bits(data, size_bytes);
}

void fill_pattern(std::span<std::byte> data, std::uint64_t seed) {
  // splitmix64: fast, and every 8-byte word differs between seeds.
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  std::size_t i = 0;
  for (; i + 8 <= data.size(); i += 8) {
    x += 0x9E3779B97F4A7C15ull;
    std::uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    std::memcpy(data.data() + i, &z, 8);
  }
  for (; i < data.size(); ++i) data[i] = static_cast<std::byte>((x >> (8 * (i % 8))) & 0xff);
}

}  // namespace weft::transport
