#pragma once
// The BPE merge engine of the tokenizer: token text -> id lookup and ranked merges over one
// byte-level encoded word.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace weft::gpu::internal {

struct string_hash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

/// Token text -> id, searchable by string_view without allocating.
using token_index = std::unordered_map<std::string, int32_t, string_hash, std::equal_to<>>;

/// Reusable buffers of bpe_model::encode_word (one per encode call; not shared between threads).
struct bpe_scratch {
  struct symbol {
    int prev;
    int next;
    uint32_t begin;
    uint32_t len;
    int32_t id;  // token id of the symbol's text, -1 when the text is not a token
  };
  struct bigram {
    int32_t rank;
    int left;
    int right;
    uint32_t left_len;
    uint32_t right_len;
    int32_t merged;  // id of the merged text (-1: not a token)
  };
  std::vector<symbol> symbols;
  std::vector<bigram> heap;
};

/// Vocabulary lookup plus merges. Pairs of tokens live in a flat open-addressing table keyed by
/// the two ids (the common case); merges whose sides are not tokens are kept by text.
class bpe_model {
 public:
  /// `merges` as "left right" strings, highest priority first. Returns the index of the first
  /// malformed merge (no space separator), or nullopt on success.
  std::optional<size_t> build(const std::vector<std::string>& tokens,
                              const std::vector<std::string>& merges);

  std::optional<int32_t> find(std::string_view text) const;

  /// Appends the tokens of one word (already byte-level encoded). With `ignore_merges` a word that
  /// is itself a token is emitted whole (Llama 3).
  void encode_word(std::string_view word, bool ignore_merges, bpe_scratch& scratch,
                   std::vector<int32_t>& out) const;

 private:
  struct pair_entry {
    uint64_t key;
    int32_t rank;
    int32_t merged;
  };
  static constexpr uint64_t empty_key = ~uint64_t{0};
  const pair_entry* find_pair(int32_t left, int32_t right) const;
  std::optional<int32_t> find_text_pair(std::string_view left, std::string_view right) const;

  token_index token_to_id_;
  std::vector<pair_entry> pairs_;  // power-of-two capacity
  uint64_t pair_mask_ = 0;
  std::unordered_map<std::string, int32_t, string_hash, std::equal_to<>>
      text_pairs_;                 // "left\0right"
  std::vector<int32_t> char_ids_;  // id of each single byte-level character (code point < 512)
};

}  // namespace weft::gpu::internal
