#include "actors/cache/segment_keys.hpp"

#include <xxhash.h>
#include <bit>
#include <cstring>

namespace weft::cache {
namespace {

// Appends `v` little-endian, so hashes agree across hosts.
template <class T>
void append_le(std::vector<unsigned char>& buf, T v) {
  using U = std::make_unsigned_t<T>;
  auto u = static_cast<U>(v);
  for (size_t i = 0; i < sizeof(U); ++i) buf.push_back(static_cast<unsigned char>(u >> (8 * i)));
}

void append_string(std::vector<unsigned char>& buf, const std::string& s) {
  // Length-prefixed: ("ab","c") and ("a","bc") must not collide.
  append_le(buf, static_cast<uint64_t>(s.size()));
  buf.insert(buf.end(), s.begin(), s.end());
}

// Buffer layout: [prev key (8)] [model id] [kv layout] [tokens]. The header after the prev key is
// the same for every segment of a prompt, so it is written once.
class key_hasher {
 public:
  explicit key_hasher(const segment_key_config& cfg) {
    buf_.resize(sizeof(uint64_t));
    append_string(buf_, cfg.model_id);
    append_string(buf_, cfg.kv_layout);
    header_bytes_ = buf_.size();
  }

  uint64_t next(uint64_t prev_key, std::span<const int32_t> segment) {
    buf_.resize(header_bytes_);
    for (size_t i = 0; i < sizeof(uint64_t); ++i)
      buf_[i] = static_cast<unsigned char>(prev_key >> (8 * i));
    if constexpr (std::endian::native == std::endian::little) {
      size_t at = buf_.size();
      buf_.resize(at + segment.size_bytes());
      std::memcpy(buf_.data() + at, segment.data(), segment.size_bytes());
    } else {
      for (int32_t t : segment) append_le(buf_, t);
    }
    uint64_t key = XXH3_64bits(buf_.data(), buf_.size());
    return key == 0 ? 1 : key;  // 0 is reserved for "no key"
  }

 private:
  std::vector<unsigned char> buf_;
  size_t header_bytes_ = 0;
};

}  // namespace

status validate(const segment_key_config& cfg, int64_t kv_block_tokens) {
  if (kv_block_tokens <= 0) return make_error(errc::invalid_argument, "kv block size must be > 0");
  if (cfg.segment_tokens <= 0)
    return make_error(errc::invalid_argument, "segment_tokens must be > 0");
  if (cfg.segment_tokens % kv_block_tokens != 0)
    return make_error(errc::invalid_argument, "segment_tokens " +
                                                  std::to_string(cfg.segment_tokens) +
                                                  " is not a multiple of the kv block size " +
                                                  std::to_string(kv_block_tokens));
  return {};
}

uint64_t next_segment_key(const segment_key_config& cfg, uint64_t prev_key,
                          std::span<const int32_t> segment) {
  return key_hasher(cfg).next(prev_key, segment);
}

std::vector<uint64_t> segment_keys(const segment_key_config& cfg, std::span<const int32_t> tokens) {
  return sequence_segment_keys(cfg, tokens,
                               tokens.size());  // all prompt: no segment reaches past it
}

std::vector<uint64_t> sequence_segment_keys(const segment_key_config& cfg,
                                            std::span<const int32_t> tokens, size_t n_prompt) {
  std::vector<uint64_t> keys;
  if (cfg.segment_tokens <= 0) return keys;
  const auto seg = static_cast<size_t>(cfg.segment_tokens);
  const size_t n_full = tokens.size() / seg;
  keys.reserve(n_full);
  key_hasher hasher(cfg);
  uint64_t prev = 0;
  for (size_t i = 0; i < n_full; ++i) {
    prev = hasher.next(prev, tokens.subspan(i * seg, seg));
    if ((i + 1) * seg > n_prompt) {
      // Decode-computed KV: keyed by where the prompt ended too.
      const uint64_t mix[2] = {prev, static_cast<uint64_t>(n_prompt)};
      unsigned char bytes[sizeof(mix)];
      for (size_t b = 0; b < sizeof(bytes); ++b)
        bytes[b] = static_cast<unsigned char>(mix[b / 8] >> (8 * (b % 8)));
      prev = XXH3_64bits_withSeed(bytes, sizeof(bytes), 0x67656e6572617465ULL);  // "generate"
      if (prev == 0) prev = 1;
    }
    keys.push_back(prev);
  }
  return keys;
}

size_t usable_segments(size_t n_prompt, size_t n_tokens, int64_t segment_tokens) {
  if (segment_tokens <= 0 || n_tokens == 0) return 0;
  const auto seg = static_cast<size_t>(segment_tokens);
  for (size_t k = (n_tokens - 1) / seg; k > 0; --k) {
    const size_t end = k * seg;
    if (end + 2 <= n_prompt || (n_tokens > n_prompt && end >= n_prompt)) return k;
  }
  return 0;
}

}  // namespace weft::cache
