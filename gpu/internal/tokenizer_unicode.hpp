#pragma once
// Unicode helpers of the tokenizer: lenient UTF-8 decoding, code point classes (\p{L}, \p{N}, \s)
// and GPT-2's byte <-> code point mapping of byte-level BPE.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace weft::gpu::internal {

/// Class of a code point as the pre-tokenizer regexes see it.
enum class cpt_class : uint8_t { other, letter, number, whitespace };

struct unicode_range {
  uint32_t first;
  uint32_t last;
  cpt_class cls;
};

// Generated table (tokenizer_unicode_data.cpp).
extern const char* const unicode_data_version;
extern const unicode_range unicode_ranges[];
extern const size_t unicode_ranges_count;

/// Marker for "no code point" (past the end of a fragment).
inline constexpr uint32_t no_cpt = 0xFFFFFFFFu;
/// U+FFFD, substituted for invalid UTF-8.
inline constexpr uint32_t replacement_cpt = 0xFFFDu;

/// Class of `cpt` (other for values beyond U+10FFFF).
cpt_class classify(uint32_t cpt);

/// Decodes UTF-8; a byte that does not start a well-formed sequence becomes U+FFFD and decoding
/// resumes at the next byte (as llama.cpp does, so token ids match).
std::vector<uint32_t> decode_utf8_lenient(std::string_view text);

/// Appends the UTF-8 encoding of `cpt` (<= U+10FFFF).
void append_utf8(std::string& out, uint32_t cpt);

/// Length of the UTF-8 sequence announced by lead byte `b` (1 for continuation/invalid bytes).
size_t utf8_sequence_length(uint8_t b);

/// Number of bytes at the end of `s` that form an incomplete (but so far valid) UTF-8 sequence.
size_t incomplete_utf8_tail(std::string_view s);

/// GPT-2 byte-level mapping: byte -> printable code point.
uint32_t byte_to_cpt(uint8_t b);
/// Inverse mapping; nullopt for code points that no byte maps to.
std::optional<uint8_t> cpt_to_byte(uint32_t cpt);

}  // namespace weft::gpu::internal
