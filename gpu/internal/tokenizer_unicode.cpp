#include "gpu/internal/tokenizer_unicode.hpp"

#include <algorithm>
#include <array>

namespace weft::gpu::internal {

namespace {

struct byte_maps {
  std::array<uint32_t, 256> to_cpt{};
  std::array<int16_t, 512> from_cpt{};  // every mapped code point is < 512
};

// GPT-2's bytes_to_unicode: printable Latin-1 bytes map to themselves, the other 68 bytes to
// U+0100.. in byte order, so every byte becomes a visible, non-space character.
const byte_maps& maps() {
  static const byte_maps m = [] {
    byte_maps r;
    r.from_cpt.fill(-1);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable =
          (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      r.to_cpt[b] = printable ? b : next++;
      r.from_cpt[r.to_cpt[b]] = static_cast<int16_t>(b);
    }
    return r;
  }();
  return m;
}

}  // namespace

cpt_class classify(uint32_t cpt) {
  if (cpt < 128) {
    if (cpt == ' ' || (cpt >= 9 && cpt <= 13)) return cpt_class::whitespace;
    if ((cpt >= 'a' && cpt <= 'z') || (cpt >= 'A' && cpt <= 'Z')) return cpt_class::letter;
    if (cpt >= '0' && cpt <= '9') return cpt_class::number;
    return cpt_class::other;
  }
  const unicode_range* begin = unicode_ranges;
  const unicode_range* end = unicode_ranges + unicode_ranges_count;
  const auto* it = std::upper_bound(begin, end, cpt,
                                    [](uint32_t c, const unicode_range& r) { return c < r.first; });
  if (it == begin) return cpt_class::other;
  --it;
  return cpt <= it->last ? it->cls : cpt_class::other;
}

size_t utf8_sequence_length(uint8_t b) {
  if (b < 0x80) return 1;
  if ((b & 0xE0) == 0xC0) return 2;
  if ((b & 0xF0) == 0xE0) return 3;
  if ((b & 0xF8) == 0xF0) return 4;
  return 1;
}

std::vector<uint32_t> decode_utf8_lenient(std::string_view text) {
  std::vector<uint32_t> out;
  out.reserve(text.size());
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    const uint8_t b = s[i];
    if (b < 0x80) {
      out.push_back(b);
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cpt = 0;
    if ((b & 0xE0) == 0xC0) {
      len = 2;
      cpt = b & 0x1Fu;
    } else if ((b & 0xF0) == 0xE0) {
      len = 3;
      cpt = b & 0x0Fu;
    } else if ((b & 0xF8) == 0xF0) {
      len = 4;
      cpt = b & 0x07u;
    }
    bool ok = len != 0 && i + len <= n;
    for (size_t k = 1; ok && k < len; ++k) {
      if ((s[i + k] & 0xC0) != 0x80) {
        ok = false;
      } else {
        cpt = (cpt << 6) | (s[i + k] & 0x3Fu);
      }
    }
    // Like llama.cpp, overlong forms and surrogates are decoded as written; only code points past
    // U+10FFFF (not encodable back) are rejected.
    if (ok && cpt <= 0x10FFFF) {
      out.push_back(cpt);
      i += len;
    } else {
      out.push_back(replacement_cpt);
      ++i;
    }
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cpt) {
  if (cpt < 0x80) {
    out += static_cast<char>(cpt);
  } else if (cpt < 0x800) {
    out += static_cast<char>(0xC0 | (cpt >> 6));
    out += static_cast<char>(0x80 | (cpt & 0x3F));
  } else if (cpt < 0x10000) {
    out += static_cast<char>(0xE0 | (cpt >> 12));
    out += static_cast<char>(0x80 | ((cpt >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cpt & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cpt >> 18));
    out += static_cast<char>(0x80 | ((cpt >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cpt >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cpt & 0x3F));
  }
}

size_t incomplete_utf8_tail(std::string_view s) {
  // Look back at most 3 bytes for a lead byte whose sequence is not complete yet.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const auto b = static_cast<uint8_t>(s[n - back]);
    if ((b & 0xC0) == 0x80) continue;  // continuation byte: keep looking for the lead
    const size_t len = utf8_sequence_length(b);
    return len > back ? back : 0;
  }
  return 0;
}

uint32_t byte_to_cpt(uint8_t b) {
  return maps().to_cpt[b];
}

std::optional<uint8_t> cpt_to_byte(uint32_t cpt) {
  if (cpt >= 512) return std::nullopt;
  const int16_t b = maps().from_cpt[cpt];
  if (b < 0) return std::nullopt;
  return static_cast<uint8_t>(b);
}

}  // namespace weft::gpu::internal
