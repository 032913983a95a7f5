#pragma once
// Deterministic prompt text of an approximate token count.

#include <cstdint>
#include <string>

namespace weft::apps::loadgen {

/// Appends `n_words` words (each " word", drawn from a list of common English words that BPE
/// tokenizers of the GPT-2/Llama families encode as one token each) chosen by a PRNG seeded with
/// `seed`. The same (seed, n) always gives the same text, and a shorter count gives a prefix of a
/// longer one, so text made per Mooncake hash id shares prefixes exactly as the trace says.
void append_words(std::string& out, uint64_t seed, int64_t n_words);

/// The words of append_words() as a new string.
std::string make_words(uint64_t seed, int64_t n_words);

}  // namespace weft::apps::loadgen
