#pragma once
/// Content keys of a prompt's KV segments, computable by anyone who holds the tokens.
///
/// A prompt's KV is cut into fixed-size segments of `segment_tokens` tokens (a multiple of the KV
/// block size). The key of segment i is XXH3-64 over (key of segment i-1, model id, KV layout,
/// the segment's tokens), with key(-1) = 0: equal prefixes give equal keys, and a key names the
/// whole prefix up to the end of its segment, so a cache pool deduplicates by key alone. Only full
/// segments have keys; a partial tail is recomputed, never shared. Keys are never 0 (0 means "no
/// key"). Integers are hashed little-endian so keys agree across hosts.
///
/// Pure functions; thread-safe.

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "schema/status.hpp"

namespace weft::cache {

/// What determines a segment's bytes besides its tokens.
struct segment_key_config {
  /// Model identity (name plus weights revision): another model's KV never matches.
  std::string model_id;
  /// KV layout and dtype, e.g. "f16/l32/h8/d128": a differently laid-out cache never matches.
  std::string kv_layout;
  /// Tokens per segment; > 0 and a multiple of the KV block size (see validate()).
  int64_t segment_tokens = 256;
};

/// Checks `cfg`: segment_tokens > 0 and a multiple of `kv_block_tokens` (> 0).
status validate(const segment_key_config& cfg, int64_t kv_block_tokens);

/// Key of one segment given the key of the previous one (0 for the first segment).
/// `segment` should hold exactly cfg.segment_tokens tokens. Never returns 0.
uint64_t next_segment_key(const segment_key_config& cfg, uint64_t prev_key,
                          std::span<const int32_t> segment);

/// Keys of the full segments of `tokens`, in order (tokens.size() / segment_tokens of them).
/// Returns an empty vector when cfg.segment_tokens <= 0.
std::vector<uint64_t> segment_keys(const segment_key_config& cfg, std::span<const int32_t> tokens);

/// Keys of the full segments of a sequence: its first `n_prompt` tokens are the prompt (their KV
/// computed by a prefill), the rest were generated (their KV computed by decode steps, whose
/// numerics differ in the last bits). A segment that ends within the prompt has its prompt key
/// (segment_keys()); one that reaches past it is keyed apart, by its chain key mixed with
/// `n_prompt`, and so is every later one: a prefill never takes decode-computed KV, so a pool hit
/// stays bit-identical to a cold prefill, and a resumed sequence finds exactly its own KV.
std::vector<uint64_t> sequence_segment_keys(const segment_key_config& cfg,
                                            std::span<const int32_t> tokens, size_t n_prompt);

/// Leading segments of `segment_tokens` whose KV a sequence of `n_tokens` tokens (`n_prompt` of
/// them the prompt, the rest generated tokens being resumed) may take from a pool: at least one
/// token is left to compute (its logits give the next token), and at least two prompt tokens
/// unless the whole prompt is covered (a prompt chunk of one token would switch to decode
/// numerics; generated tokens are recomputed with decode numerics anyway).
size_t usable_segments(size_t n_prompt, size_t n_tokens, int64_t segment_tokens);

}  // namespace weft::cache
