#include "gpu/internal/tokenizer_bpe.hpp"

#include <algorithm>
#include <bit>

#include "gpu/internal/tokenizer_unicode.hpp"

namespace weft::gpu::internal {

namespace {

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

uint64_t mix(uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  return k;
}

// Single code point of a 1- or 2-byte UTF-8 string (byte-level characters are < U+0200).
std::optional<uint32_t> single_small_cpt(std::string_view s) {
  if (s.size() == 1 && static_cast<uint8_t>(s[0]) < 0x80) return static_cast<uint8_t>(s[0]);
  if (s.size() == 2 && (static_cast<uint8_t>(s[0]) & 0xE0) == 0xC0 &&
      (static_cast<uint8_t>(s[1]) & 0xC0) == 0x80) {
    const uint32_t c =
        ((static_cast<uint8_t>(s[0]) & 0x1Fu) << 6) | (static_cast<uint8_t>(s[1]) & 0x3Fu);
    if (c < 512) return c;
  }
  return std::nullopt;
}

}  // namespace

std::optional<size_t> bpe_model::build(const std::vector<std::string>& tokens,
                                       const std::vector<std::string>& merges) {
  token_to_id_.clear();
  token_to_id_.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i)
    token_to_id_[tokens[i]] = static_cast<int32_t>(i);  // last wins
  char_ids_.assign(512, -1);
  for (uint32_t c = 0; c < 512; ++c) {
    std::string s;
    append_utf8(s, c);
    if (auto id = find(s)) char_ids_[c] = *id;
  }
  const size_t capacity = std::bit_ceil(std::max<size_t>(16, merges.size() * 2));
  pairs_.assign(capacity, pair_entry{empty_key, 0, -1});
  pair_mask_ = capacity - 1;
  text_pairs_.clear();
  std::string merged;
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string_view m = merges[i];
    const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string_view::npos;
    if (sp == std::string_view::npos) return i;
    const std::string_view left = m.substr(0, sp);
    const std::string_view right = m.substr(sp + 1);
    const auto rank = static_cast<int32_t>(i);
    const auto l = find(left);
    const auto r = find(right);
    if (l && r) {
      merged.assign(left);
      merged.append(right);
      const auto id = find(merged);
      uint64_t slot = mix(pair_key(*l, *r)) & pair_mask_;
      while (pairs_[slot].key != empty_key && pairs_[slot].key != pair_key(*l, *r))
        slot = (slot + 1) & pair_mask_;
      if (pairs_[slot].key == empty_key)
        pairs_[slot] = pair_entry{pair_key(*l, *r), rank, id.value_or(-1)};
    } else {
      std::string key(left);
      key.push_back('\0');
      key.append(right);
      text_pairs_.emplace(std::move(key), rank);  // first (best) rank wins
    }
  }
  return std::nullopt;
}

std::optional<int32_t> bpe_model::find(std::string_view text) const {
  const auto it = token_to_id_.find(text);
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

const bpe_model::pair_entry* bpe_model::find_pair(int32_t left, int32_t right) const {
  const uint64_t key = pair_key(left, right);
  for (uint64_t slot = mix(key) & pair_mask_;; slot = (slot + 1) & pair_mask_) {
    const pair_entry& e = pairs_[slot];
    if (e.key == key) return &e;
    if (e.key == empty_key) return nullptr;
  }
}

std::optional<int32_t> bpe_model::find_text_pair(std::string_view left,
                                                 std::string_view right) const {
  if (text_pairs_.empty()) return std::nullopt;
  std::string key(left);
  key.push_back('\0');
  key.append(right);
  const auto it = text_pairs_.find(key);
  if (it == text_pairs_.end()) return std::nullopt;
  return it->second;
}

void bpe_model::encode_word(std::string_view word, bool ignore_merges, bpe_scratch& scratch,
                            std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges) {
    if (auto id = find(word)) {
      out.push_back(*id);
      return;
    }
  }
  auto& syms = scratch.symbols;
  auto& heap = scratch.heap;
  syms.clear();
  heap.clear();
  for (size_t pos = 0; pos < word.size();) {
    const size_t len =
        std::min(word.size() - pos, utf8_sequence_length(static_cast<uint8_t>(word[pos])));
    const auto c = single_small_cpt(word.substr(pos, len));
    const int32_t id = c ? char_ids_[*c] : find(word.substr(pos, len)).value_or(-1);
    const int n = static_cast<int>(syms.size());
    syms.push_back({n - 1, n + 1, static_cast<uint32_t>(pos), static_cast<uint32_t>(len), id});
    pos += len;
  }
  syms.back().next = -1;

  // Min-heap on (rank, left position): the lowest rank merges first, leftmost among equals.
  const auto worse = [](const bpe_scratch::bigram& a, const bpe_scratch::bigram& b) {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  };
  const auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const auto& l = syms[static_cast<size_t>(left)];
    const auto& r = syms[static_cast<size_t>(right)];
    int32_t rank = -1;
    int32_t merged = -1;
    if (l.id >= 0 && r.id >= 0) {
      const pair_entry* e = find_pair(l.id, r.id);
      if (e == nullptr) return;
      rank = e->rank;
      merged = e->merged;
    } else {
      const auto t = find_text_pair(word.substr(l.begin, l.len), word.substr(r.begin, r.len));
      if (!t) return;
      rank = *t;
      merged = find(word.substr(l.begin, l.len + r.len)).value_or(-1);
    }
    heap.push_back({rank, left, right, l.len, r.len, merged});
    std::push_heap(heap.begin(), heap.end(), worse);
  };
  for (size_t i = 1; i < syms.size(); ++i) try_add(static_cast<int>(i) - 1, static_cast<int>(i));
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), worse);
    const bpe_scratch::bigram b = heap.back();
    heap.pop_back();
    auto& l = syms[static_cast<size_t>(b.left)];
    auto& r = syms[static_cast<size_t>(b.right)];
    // Stale entry: one side has been merged since it was queued.
    if (l.len != b.left_len || r.len != b.right_len || l.next != b.right) continue;
    l.len += r.len;
    l.id = b.merged;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) syms[static_cast<size_t>(r.next)].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }
  for (int i = 0; i >= 0; i = syms[static_cast<size_t>(i)].next) {
    const auto& s = syms[static_cast<size_t>(i)];
    if (s.id >= 0) {
      out.push_back(s.id);
      continue;
    }
    // Not in the vocabulary (a merge without a token): fall back to single bytes that are tokens.
    for (char c : word.substr(s.begin, s.len)) {
      if (auto id = find(std::string_view(&c, 1))) out.push_back(*id);
    }
  }
}

}  // namespace weft::gpu::internal
