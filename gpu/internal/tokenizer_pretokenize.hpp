#pragma once
// Pre-tokenizers of byte-level BPE models: split text (as code points) into words before BPE.
// Each is a hand-written matcher for one model family's regex, applied to fragments of the text:
// a fragment is a run of code points, and no match looks across a fragment boundary.

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace weft::gpu::internal {

/// Fragment lengths (in code points) that cover the text in order.
using fragments = std::vector<size_t>;

/// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
fragments split_gpt2(std::span<const uint32_t> cpts, const fragments& in);

/// Isolates every \p{N} code point (SmolLM's "individual digits" step before the GPT-2 split).
fragments split_each_number(std::span<const uint32_t> cpts, const fragments& in);

/// Llama 3 (max_digits 3) and Qwen 2 (max_digits 1):
/// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max}| ?[^\s\p{L}\p{N}]+[\r\n]*|
/// \s*[\r\n]+|\s+(?!\S)|\s+
fragments split_llama3(std::span<const uint32_t> cpts, const fragments& in, size_t max_digits);

}  // namespace weft::gpu::internal
