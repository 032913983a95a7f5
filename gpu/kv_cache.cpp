#include "gpu/kv_cache.hpp"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

namespace weft::gpu {

namespace {
constexpr uint64_t hash_seed = 0x77656674u;  // "weft"
}

std::string kv_layout::describe() const {
  return "layers=" + std::to_string(n_layers) + " kv_heads=" + std::to_string(n_kv_heads) +
         " head_dim=" + std::to_string(head_dim) + " block=" + std::to_string(block_size) + " " +
         std::string{type_name(dtype)};
}

result<std::unique_ptr<kv_cache>> kv_cache::create(device& dev, const kv_cache_config& config) {
  const kv_layout& l = config.layout;
  if (l.n_layers <= 0 || l.n_kv_heads <= 0 || l.head_dim <= 0 || l.block_size <= 0 ||
      config.n_blocks <= 0) {
    return status{status_code::invalid_argument,
                  "kv_cache: every dimension must be positive (" + l.describe() + ")"};
  }
  if (l.dtype != ggml_type::f16)
    return status{status_code::unsupported, "kv_cache: only f16 is supported"};
  if (config.slot_payload_bytes < 0)
    return status{status_code::invalid_argument, "kv_cache: negative slot payload"};
  if (config.n_blocks > (int64_t{1} << 31) / l.block_size) {
    return status{status_code::invalid_argument, "kv_cache: too many blocks for 32-bit slot ids"};
  }
  std::unique_ptr<kv_cache> c{new kv_cache(dev, config)};
  const size_t bytes = l.block_bytes() * static_cast<size_t>(config.n_blocks * l.n_layers);
  auto k = dev.allocate(bytes);
  if (!k) return k.error();
  c->k_ = *k;
  auto v = dev.allocate(bytes);
  if (!v) return v.error();
  c->v_ = *v;
  c->payload_.assign(
      static_cast<size_t>(config.n_blocks * l.block_size * config.slot_payload_bytes), 0);
  return c;
}

kv_cache::kv_cache(device& dev, const kv_cache_config& config)
    : dev_(dev),
      config_(config),
      refcount_(static_cast<size_t>(config.n_blocks), 0),
      block_hash_(static_cast<size_t>(config.n_blocks)),
      free_pos_(static_cast<size_t>(config.n_blocks)),
      is_free_(static_cast<size_t>(config.n_blocks), true),
      block_parent_(static_cast<size_t>(config.n_blocks), 0),
      block_tokens_(static_cast<size_t>(config.n_blocks * config.layout.block_size), 0) {
  for (int32_t b = 0; b < config.n_blocks; ++b)
    free_pos_[b] = free_list_.insert(free_list_.end(), b);
}

kv_cache::~kv_cache() {
  dev_.release(k_);
  dev_.release(v_);
}

uint64_t kv_cache::chain_hash(uint64_t prev, std::span<const int32_t> tokens) {
  XXH64_state_t* st = XXH64_createState();
  XXH64_reset(st, hash_seed);
  XXH64_update(st, &prev, sizeof(prev));
  XXH64_update(st, tokens.data(), tokens.size_bytes());
  const uint64_t h = XXH64_digest(st);
  XXH64_freeState(st);
  return h;
}

uint64_t kv_cache::child_key(uint64_t parent, int32_t first_token) {
  return parent ^
         (static_cast<uint64_t>(static_cast<uint32_t>(first_token)) * 0x9E3779B97F4A7C15ULL);
}

void kv_cache::register_block(int32_t b, uint64_t h, uint64_t parent,
                              std::span<const int32_t> tokens) {
  hash_to_block_[h] = b;
  block_hash_[b] = h;
  block_parent_[b] = parent;
  std::copy(tokens.begin(), tokens.end(),
            block_tokens_.begin() + static_cast<ptrdiff_t>(b) * config_.layout.block_size);
  children_.emplace(child_key(parent, tokens.front()), b);
}

void kv_cache::unregister_block(int32_t b) {
  if (!block_hash_[b]) return;
  auto it = hash_to_block_.find(*block_hash_[b]);
  if (it != hash_to_block_.end() && it->second == b) hash_to_block_.erase(it);
  const int32_t first = block_tokens_[static_cast<size_t>(b) * config_.layout.block_size];
  auto [lo, hi] = children_.equal_range(child_key(block_parent_[b], first));
  for (auto c = lo; c != hi; ++c) {
    if (c->second == b) {
      children_.erase(c);
      break;
    }
  }
  block_hash_[b].reset();
}

std::pair<int32_t, int64_t> kv_cache::partial_match(uint64_t parent,
                                                    std::span<const int32_t> rest) const {
  const int64_t bs = config_.layout.block_size;
  const int64_t limit = std::min<int64_t>(static_cast<int64_t>(rest.size()) - 1, bs - 1);
  std::pair<int32_t, int64_t> best{-1, 0};
  if (limit < 1 || !config_.leading_token_matches) return best;
  auto [lo, hi] = children_.equal_range(child_key(parent, rest.front()));
  for (auto c = lo; c != hi; ++c) {
    const int32_t b = c->second;
    if (block_parent_[b] != parent) continue;  // another parent with a colliding key
    const int32_t* t = block_tokens_.data() + static_cast<size_t>(b) * bs;
    int64_t k = 0;
    while (k < limit && t[k] == rest[static_cast<size_t>(k)]) ++k;
    if (k > best.second) best = {b, k};
  }
  return best;
}

kv_cache::sequence* kv_cache::find(seq_id seq) {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : &it->second;
}
const kv_cache::sequence* kv_cache::find(seq_id seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? nullptr : &it->second;
}

int64_t kv_cache::blocks_for(int64_t n_tokens) const {
  const int64_t bs = config_.layout.block_size;
  return (n_tokens + bs - 1) / bs;
}

result<int32_t> kv_cache::allocate_block() {
  if (free_list_.empty()) {
    return status{status_code::out_of_memory,
                  "kv_cache: no free block (" + std::to_string(config_.n_blocks) + " in use)"};
  }
  const int32_t b = free_list_.front();
  free_list_.pop_front();
  is_free_[b] = false;
  unregister_block(b);  // Evict the cached prefix this block held.
  refcount_[b] = 1;
  return b;
}

void kv_cache::release_block(int32_t b) {
  if (--refcount_[b] > 0) return;
  is_free_[b] = true;
  // Unhashed blocks are reused first; hashed ones stay cached as long as possible (LRU at front).
  free_pos_[b] = block_hash_[b] ? free_list_.insert(free_list_.end(), b)
                                : free_list_.insert(free_list_.begin(), b);
}

status kv_cache::copy_block(int32_t dst, int32_t src) {
  const size_t bb = config_.layout.block_bytes();
  for (int64_t l = 0; l < config_.layout.n_layers; ++l) {
    const size_t base = static_cast<size_t>(l * config_.n_blocks) * bb;
    auto* k = static_cast<char*>(k_.data) + base;
    auto* v = static_cast<char*>(v_.data) + base;
    if (auto st = dev_.copy_on_device(k + dst * bb, k + src * bb, bb); !st) return st;
    if (auto st = dev_.copy_on_device(v + dst * bb, v + src * bb, bb); !st) return st;
  }
  const size_t pb = payload_block_bytes();
  if (pb > 0) std::memcpy(payload_.data() + dst * pb, payload_.data() + src * pb, pb);
  return {};
}

seq_id kv_cache::create_sequence() {
  const seq_id id = next_seq_++;
  sequence s;
  s.root = namespace_;
  seqs_.emplace(id, std::move(s));
  return id;
}

bool kv_cache::contains(seq_id seq) const {
  return find(seq) != nullptr;
}

int64_t kv_cache::length(seq_id seq) const {
  const sequence* s = find(seq);
  return s == nullptr ? 0 : static_cast<int64_t>(s->tokens.size());
}

std::span<const int32_t> kv_cache::block_table(seq_id seq) const {
  const sequence* s = find(seq);
  if (s == nullptr || s->swapped) return {};
  return s->blocks;
}

bool kv_cache::is_swapped(seq_id seq) const {
  const sequence* s = find(seq);
  return s != nullptr && s->swapped;
}

result<int64_t> kv_cache::attach_prefix(seq_id seq, std::span<const int32_t> tokens) {
  sequence* s = find(seq);
  if (s == nullptr) return status{status_code::not_found, "kv_cache: unknown sequence"};
  if (!s->tokens.empty() || s->swapped)
    return status{status_code::invalid_argument, "attach_prefix: sequence not empty"};
  const int64_t bs = config_.layout.block_size;
  uint64_t prev = s->root;
  int64_t matched = 0;
  while ((matched + bs) < static_cast<int64_t>(tokens.size())) {
    const auto chunk = tokens.subspan(static_cast<size_t>(matched), static_cast<size_t>(bs));
    const uint64_t h = chain_hash(prev, chunk);
    auto it = hash_to_block_.find(h);
    if (it == hash_to_block_.end()) break;
    const int32_t b = it->second;
    if (is_free_[b]) {
      free_list_.erase(free_pos_[b]);
      is_free_[b] = false;
    }
    ++refcount_[b];
    s->blocks.push_back(b);
    s->block_hashes.push_back(h);
    s->tokens.insert(s->tokens.end(), chunk.begin(), chunk.end());
    prev = h;
    matched += bs;
  }
  // The leading tokens of one more block: copied into a block of the sequence's own (the cached
  // block holds a registered full block and is never written).
  const auto [src, k] = partial_match(prev, tokens.subspan(static_cast<size_t>(matched)));
  if (k > 0) {
    if (is_free_[src]) {  // keep allocate_block from handing out the source itself
      free_list_.erase(free_pos_[src]);
      is_free_[src] = false;
    }
    ++refcount_[src];
    if (auto nb = allocate_block(); nb) {
      if (copy_block(*nb, src)) {
        s->blocks.push_back(*nb);
        const auto shared = tokens.subspan(static_cast<size_t>(matched), static_cast<size_t>(k));
        s->tokens.insert(s->tokens.end(), shared.begin(), shared.end());
        matched += k;
      } else {
        release_block(*nb);
      }
    }
    release_block(src);  // a cached source goes back to the free list as the most recently used
  }
  prefix_hit_tokens_ += matched;
  return matched;
}

int64_t kv_cache::match_prefix(std::span<const int32_t> tokens) const {
  const int64_t bs = config_.layout.block_size;
  uint64_t prev = namespace_;
  int64_t matched = 0;
  while ((matched + bs) < static_cast<int64_t>(tokens.size())) {
    const uint64_t h =
        chain_hash(prev, tokens.subspan(static_cast<size_t>(matched), static_cast<size_t>(bs)));
    if (hash_to_block_.count(h) == 0) break;
    prev = h;
    matched += bs;
  }
  return matched + partial_match(prev, tokens.subspan(static_cast<size_t>(matched))).second;
}

status kv_cache::reserve(seq_id seq, int64_t n_new) {
  sequence* s = find(seq);
  if (s == nullptr) return {status_code::not_found, "kv_cache: unknown sequence"};
  if (s->swapped) return {status_code::invalid_argument, "kv_cache: sequence is swapped out"};
  if (n_new < 0) return {status_code::invalid_argument, "kv_cache: negative reserve"};
  const int64_t len = static_cast<int64_t>(s->tokens.size());
  const int64_t bs = config_.layout.block_size;
  // Copy-on-write: the partially filled last block will be written.
  if (n_new > 0 && len % bs != 0 && refcount_[s->blocks.back()] > 1) {
    auto nb = allocate_block();
    if (!nb) return nb.error();
    if (auto st = copy_block(*nb, s->blocks.back()); !st) {
      release_block(*nb);
      return st;
    }
    release_block(s->blocks.back());
    s->blocks.back() = *nb;
  }
  const size_t before = s->blocks.size();
  while (static_cast<int64_t>(s->blocks.size()) < blocks_for(len + n_new)) {
    auto nb = allocate_block();
    if (!nb) {
      while (s->blocks.size() > before) {
        release_block(s->blocks.back());
        s->blocks.pop_back();
      }
      return nb.error();
    }
    s->blocks.push_back(*nb);
  }
  return {};
}

status kv_cache::slots(seq_id seq, int64_t pos, int64_t n, std::vector<int32_t>& out) const {
  const sequence* s = find(seq);
  if (s == nullptr) return {status_code::not_found, "kv_cache: unknown sequence"};
  const int64_t bs = config_.layout.block_size;
  if (pos < 0 || pos + n > static_cast<int64_t>(s->blocks.size()) * bs) {
    return {status_code::invalid_argument, "kv_cache: slots beyond the reserved blocks"};
  }
  for (int64_t p = pos; p < pos + n; ++p)
    out.push_back(static_cast<int32_t>(s->blocks[p / bs] * bs + p % bs));
  return {};
}

status kv_cache::commit(seq_id seq, std::span<const int32_t> tokens) {
  sequence* s = find(seq);
  if (s == nullptr) return {status_code::not_found, "kv_cache: unknown sequence"};
  const int64_t bs = config_.layout.block_size;
  if (static_cast<int64_t>(s->tokens.size() + tokens.size()) >
      static_cast<int64_t>(s->blocks.size()) * bs) {
    return {status_code::invalid_argument, "kv_cache: commit beyond the reserved blocks"};
  }
  s->tokens.insert(s->tokens.end(), tokens.begin(), tokens.end());
  const int64_t n_full = static_cast<int64_t>(s->tokens.size()) / bs;
  while (static_cast<int64_t>(s->block_hashes.size()) < n_full) {
    const size_t i = s->block_hashes.size();
    const uint64_t prev = i == 0 ? s->root : s->block_hashes[i - 1];
    const uint64_t h = chain_hash(prev, std::span<const int32_t>(s->tokens).subspan(i * bs, bs));
    s->block_hashes.push_back(h);
    const int32_t b = s->blocks[i];
    if (!block_hash_[b] && hash_to_block_.find(h) == hash_to_block_.end())
      register_block(b, h, prev, std::span<const int32_t>(s->tokens).subspan(i * bs, bs));
  }
  return {};
}

result<seq_id> kv_cache::fork(seq_id seq) {
  const sequence* s = find(seq);
  if (s == nullptr) return status{status_code::not_found, "kv_cache: unknown sequence"};
  if (s->swapped)
    return status{status_code::invalid_argument, "kv_cache: cannot fork a swapped sequence"};
  sequence copy;
  copy.blocks = s->blocks;
  copy.tokens = s->tokens;
  copy.block_hashes = s->block_hashes;
  copy.root = s->root;
  for (int32_t b : copy.blocks) ++refcount_[b];
  const seq_id id = next_seq_++;
  seqs_.emplace(id, std::move(copy));
  return id;
}

status kv_cache::free_sequence(seq_id seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return {status_code::not_found, "kv_cache: unknown sequence"};
  for (int32_t b : it->second.blocks) release_block(b);
  seqs_.erase(it);
  return {};
}

uint16_t* kv_cache::k_layer(int64_t layer) const {
  return reinterpret_cast<uint16_t*>(static_cast<char*>(k_.data) +
                                     static_cast<size_t>(layer * config_.n_blocks) *
                                         config_.layout.block_bytes());
}
uint16_t* kv_cache::v_layer(int64_t layer) const {
  return reinterpret_cast<uint16_t*>(static_cast<char*>(v_.data) +
                                     static_cast<size_t>(layer * config_.n_blocks) *
                                         config_.layout.block_bytes());
}

result<std::vector<kv_byte_range>> kv_cache::export_ranges(seq_id seq) const {
  const sequence* s = find(seq);
  if (s == nullptr) return status{status_code::not_found, "kv_cache: unknown sequence"};
  if (s->swapped) return status{status_code::invalid_argument, "kv_cache: sequence is swapped out"};
  std::vector<kv_byte_range> out;
  const size_t bb = config_.layout.block_bytes();
  const int64_t n = blocks_for(static_cast<int64_t>(s->tokens.size()));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t l = 0; l < config_.layout.n_layers; ++l) {
      const size_t off = static_cast<size_t>(s->blocks[i]) * bb;
      out.push_back({l, i, false, reinterpret_cast<char*>(k_layer(l)) + off, bb});
      out.push_back({l, i, true, reinterpret_cast<char*>(v_layer(l)) + off, bb});
    }
  }
  return out;
}

result<std::pair<seq_id, std::vector<kv_byte_range>>> kv_cache::prepare_import(
    const kv_layout& layout, std::span<const int32_t> tokens) {
  if (!(layout == config_.layout)) {
    return status{status_code::invalid_argument, "kv_cache: layout mismatch, sender " +
                                                     layout.describe() + ", receiver " +
                                                     config_.layout.describe()};
  }
  const seq_id id = create_sequence();
  if (auto st = reserve(id, static_cast<int64_t>(tokens.size())); !st) {
    (void)free_sequence(id);
    return st;
  }
  // Ranges of the blocks to fill; the caller commits `tokens` once the bytes are in place.
  sequence& s = seqs_.at(id);
  std::vector<kv_byte_range> out;
  const size_t bb = config_.layout.block_bytes();
  for (size_t i = 0; i < s.blocks.size(); ++i) {
    for (int64_t l = 0; l < config_.layout.n_layers; ++l) {
      const size_t off = static_cast<size_t>(s.blocks[i]) * bb;
      out.push_back(
          {l, static_cast<int64_t>(i), false, reinterpret_cast<char*>(k_layer(l)) + off, bb});
      out.push_back(
          {l, static_cast<int64_t>(i), true, reinterpret_cast<char*>(v_layer(l)) + off, bb});
    }
  }
  return std::pair{id, std::move(out)};
}

status kv_cache::swap_out(seq_id seq) {
  sequence* s = find(seq);
  if (s == nullptr) return {status_code::not_found, "kv_cache: unknown sequence"};
  if (s->swapped) return {status_code::invalid_argument, "kv_cache: already swapped out"};
  auto ranges = export_ranges(seq);
  if (!ranges) return ranges.error();
  const size_t bb = config_.layout.block_bytes();
  s->host_copy.resize(ranges->size() * bb);
  for (size_t i = 0; i < ranges->size(); ++i) {
    if (auto st = dev_.copy_to_host(s->host_copy.data() + i * bb, (*ranges)[i].data, bb); !st)
      return st;
  }
  if (auto st = dev_.synchronize(); !st) return st;
  const size_t pb = payload_block_bytes();
  s->host_payload.resize(s->blocks.size() * pb);
  for (size_t i = 0; i < s->blocks.size() && pb > 0; ++i)
    std::memcpy(s->host_payload.data() + i * pb, payload_.data() + s->blocks[i] * pb, pb);
  for (int32_t b : s->blocks) release_block(b);
  s->blocks.clear();
  s->swapped = true;
  return {};
}

status kv_cache::swap_in(seq_id seq) {
  sequence* s = find(seq);
  if (s == nullptr) return {status_code::not_found, "kv_cache: unknown sequence"};
  if (!s->swapped) return {status_code::invalid_argument, "kv_cache: not swapped out"};
  const int64_t n = blocks_for(static_cast<int64_t>(s->tokens.size()));
  std::vector<int32_t> blocks;
  for (int64_t i = 0; i < n; ++i) {
    auto b = allocate_block();
    if (!b) {
      for (int32_t x : blocks) release_block(x);
      return b.error();
    }
    blocks.push_back(*b);
  }
  s->blocks = std::move(blocks);
  s->swapped = false;
  auto ranges = export_ranges(seq);
  const size_t bb = config_.layout.block_bytes();
  for (size_t i = 0; i < ranges->size(); ++i) {
    if (auto st = dev_.copy_to_device((*ranges)[i].data, s->host_copy.data() + i * bb, bb); !st)
      return st;
  }
  s->host_copy.clear();
  s->host_copy.shrink_to_fit();
  const size_t pb = payload_block_bytes();
  for (size_t i = 0; i < s->blocks.size() && pb > 0; ++i)
    std::memcpy(payload_.data() + s->blocks[i] * pb, s->host_payload.data() + i * pb, pb);
  s->host_payload.clear();
  s->host_payload.shrink_to_fit();
  const auto bs = static_cast<size_t>(config_.layout.block_size);
  for (size_t i = 0; i < s->block_hashes.size(); ++i) {
    const int32_t b = s->blocks[i];
    const uint64_t h = s->block_hashes[i];
    if (hash_to_block_.find(h) == hash_to_block_.end()) {
      register_block(b, h, i == 0 ? s->root : s->block_hashes[i - 1],
                     std::span<const int32_t>(s->tokens).subspan(i * bs, bs));
    }
  }
  return dev_.synchronize();
}

kv_stats kv_cache::stats() const {
  kv_stats st;
  st.n_blocks_total = config_.n_blocks;
  st.n_blocks_free = static_cast<int64_t>(free_list_.size());
  st.n_blocks_used = st.n_blocks_total - st.n_blocks_free;
  for (int32_t b : free_list_) st.n_blocks_cached += block_hash_[b] ? 1 : 0;
  st.n_sequences = static_cast<int64_t>(seqs_.size());
  for (const auto& [id, s] : seqs_) st.n_swapped_sequences += s.swapped ? 1 : 0;
  st.n_prefix_hits_tokens = prefix_hit_tokens_;
  return st;
}

status kv_cache::check_invariants() const {
  std::vector<int32_t> refs(static_cast<size_t>(config_.n_blocks), 0);
  for (const auto& [id, s] : seqs_) {
    if (s.swapped && !s.blocks.empty())
      return {status_code::internal, "swapped sequence holds blocks"};
    if (!s.swapped &&
        static_cast<int64_t>(s.blocks.size()) < blocks_for(static_cast<int64_t>(s.tokens.size()))) {
      return {status_code::internal,
              "sequence " + std::to_string(id) + " has fewer blocks than tokens need"};
    }
    for (int32_t b : s.blocks) {
      if (b < 0 || b >= config_.n_blocks) return {status_code::internal, "block id out of range"};
      ++refs[b];
    }
  }
  int64_t n_free = 0;
  for (int32_t b = 0; b < config_.n_blocks; ++b) {
    if (refs[b] != refcount_[b]) {
      return {status_code::internal, "block " + std::to_string(b) + " refcount " +
                                         std::to_string(refcount_[b]) + " but " +
                                         std::to_string(refs[b]) + " references"};
    }
    if (is_free_[b] != (refs[b] == 0))
      return {status_code::internal, "block " + std::to_string(b) + " free flag wrong"};
    n_free += is_free_[b] ? 1 : 0;
  }
  if (n_free != static_cast<int64_t>(free_list_.size()))
    return {status_code::internal, "free list size mismatch"};
  for (int32_t b : free_list_) {
    if (!is_free_[b]) return {status_code::internal, "used block on the free list"};
  }
  for (const auto& [h, b] : hash_to_block_) {
    if (!block_hash_[b] || *block_hash_[b] != h)
      return {status_code::internal, "hash map points at a stale block"};
  }
  // Every registered block is a match candidate exactly once, under its parent and first token.
  size_t n_registered = 0;
  for (int32_t b = 0; b < config_.n_blocks; ++b) {
    if (!block_hash_[b]) continue;
    ++n_registered;
    auto it = hash_to_block_.find(*block_hash_[b]);
    if (it == hash_to_block_.end() || it->second != b)
      return {status_code::internal, "block " + std::to_string(b) + " hashed but not registered"};
    const auto* t = block_tokens_.data() + static_cast<size_t>(b) * config_.layout.block_size;
    if (chain_hash(block_parent_[b],
                   std::span<const int32_t>(t, static_cast<size_t>(config_.layout.block_size))) !=
        *block_hash_[b]) {
      return {status_code::internal, "block " + std::to_string(b) + " tokens do not hash to it"};
    }
    auto [lo, hi] = children_.equal_range(child_key(block_parent_[b], t[0]));
    if (std::count_if(lo, hi, [&](const auto& c) { return c.second == b; }) != 1)
      return {status_code::internal, "block " + std::to_string(b) + " not a match candidate"};
  }
  if (children_.size() != n_registered)
    return {status_code::internal, "stale leading-token match candidates"};
  return {};
}

}  // namespace weft::gpu
