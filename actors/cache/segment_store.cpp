#include "actors/cache/segment_store.hpp"

#include <algorithm>
#include <cstring>
#include <string>

namespace weft::cache {

result<segment_store> segment_store::create(segment_store_config cfg) {
  if (cfg.segment_bytes <= 0 || cfg.slots_per_chunk <= 0)
    return make_error(errc::invalid_argument, "segment_bytes and slots_per_chunk must be > 0");
  if (cfg.capacity_bytes < cfg.segment_bytes)
    return make_error(errc::invalid_argument,
                      "capacity_bytes " + std::to_string(cfg.capacity_bytes) +
                          " holds no segment of " + std::to_string(cfg.segment_bytes) + " bytes");
  if (cfg.capacity_bytes / cfg.segment_bytes > INT32_MAX)
    return make_error(errc::invalid_argument, "too many segment slots");
  return segment_store(cfg);
}

segment_store::segment_store(segment_store_config cfg)
    : cfg_(cfg), n_slots_(static_cast<int32_t>(cfg.capacity_bytes / cfg.segment_bytes)) {
  const int32_t n_chunks = (n_slots_ + cfg_.slots_per_chunk - 1) / cfg_.slots_per_chunk;
  chunks_.resize(static_cast<size_t>(n_chunks));
  chunk_live_.assign(static_cast<size_t>(n_chunks), 0);
  slot_key_.assign(static_cast<size_t>(n_slots_), 0);
  for (int32_t s = 0; s < n_slots_; ++s) free_slots_.insert(free_slots_.end(), s);
}

int64_t segment_store::chunk_bytes(int32_t chunk) const {
  const int32_t first = chunk * cfg_.slots_per_chunk;
  const int32_t n = std::min(cfg_.slots_per_chunk, n_slots_ - first);
  return int64_t{n} * cfg_.segment_bytes;
}

std::byte* segment_store::slot_address(int32_t slot) {
  auto& chunk = chunks_[static_cast<size_t>(chunk_of(slot))];
  if (!chunk)
    chunk = std::make_unique_for_overwrite<std::byte[]>(
        static_cast<size_t>(chunk_bytes(chunk_of(slot))));
  return chunk.get() + int64_t{slot % cfg_.slots_per_chunk} * cfg_.segment_bytes;
}

void segment_store::touch(uint64_t key, entry& e) {
  if (e.in_lru) {
    lru_.splice(lru_.begin(), lru_, e.lru_pos);
  } else if (e.n_leases == 0) {
    e.lru_pos = lru_.insert(lru_.begin(), key);
    e.in_lru = true;
  }
}

void segment_store::evict_lru() {
  const uint64_t victim = lru_.back();
  lru_.pop_back();
  auto it = entries_.find(victim);
  const int32_t slot = it->second.slot;
  bytes_used_ -= it->second.size_bytes;
  entries_.erase(it);
  slot_key_[static_cast<size_t>(slot)] = 0;
  chunk_live_[static_cast<size_t>(chunk_of(slot))] -= 1;
  free_slots_.insert(slot);
  ++evictions_;
}

// -- data
// -------------------------------------------------------------------------------------------

status segment_store::put(uint64_t key, std::span<const std::byte> bytes) {
  if (key == 0) return make_error(errc::invalid_argument, "segment key 0 is reserved");
  if (bytes.empty() || static_cast<int64_t>(bytes.size()) > cfg_.segment_bytes)
    return make_error(errc::invalid_argument, "segment of " + std::to_string(bytes.size()) +
                                                  " bytes does not fit slots of " +
                                                  std::to_string(cfg_.segment_bytes));

  if (auto it = entries_.find(key); it != entries_.end()) {
    entry& e = it->second;
    std::byte* at = slot_address(e.slot);
    if (e.n_leases > 0) {
      // A transfer may be reading it: never overwrite. Keys are content hashes, so equal bytes is
      // the normal case (two workers publishing the same prefix).
      const bool same = static_cast<int64_t>(bytes.size()) == e.size_bytes &&
                        std::memcmp(at, bytes.data(), bytes.size()) == 0;
      if (same) return {};
      return make_error(errc::already_exists, "segment is leased and differs from the new bytes");
    }
    std::memcpy(at, bytes.data(), bytes.size());
    bytes_used_ += static_cast<int64_t>(bytes.size()) - e.size_bytes;
    e.size_bytes = static_cast<int64_t>(bytes.size());
    touch(key, e);
    return {};
  }

  if (free_slots_.empty()) {
    if (lru_.empty())
      return make_error(errc::overloaded,
                        "all " + std::to_string(n_slots_) + " segment slots are leased");
    evict_lru();
  }
  const int32_t slot = *free_slots_.begin();
  free_slots_.erase(free_slots_.begin());
  std::memcpy(slot_address(slot), bytes.data(), bytes.size());
  slot_key_[static_cast<size_t>(slot)] = key;
  chunk_live_[static_cast<size_t>(chunk_of(slot))] += 1;
  entry& e = entries_[key];
  e.slot = slot;
  e.size_bytes = static_cast<int64_t>(bytes.size());
  bytes_used_ += e.size_bytes;
  touch(key, e);
  return {};
}

result<std::span<const std::byte>> segment_store::get(uint64_t key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    ++misses_;
    return make_error(errc::not_found, "segment not stored");
  }
  ++hits_;
  touch(key, it->second);
  return std::span<const std::byte>(slot_address(it->second.slot),
                                    static_cast<size_t>(it->second.size_bytes));
}

status segment_store::erase(uint64_t key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return make_error(errc::not_found, "segment not stored");
  entry& e = it->second;
  if (e.n_leases > 0) return make_error(errc::unavailable, "segment is leased");
  if (e.in_lru) lru_.erase(e.lru_pos);
  slot_key_[static_cast<size_t>(e.slot)] = 0;
  chunk_live_[static_cast<size_t>(chunk_of(e.slot))] -= 1;
  free_slots_.insert(e.slot);
  bytes_used_ -= e.size_bytes;
  entries_.erase(it);
  return {};
}

// -- leases
// -----------------------------------------------------------------------------------------

result<segment_lease> segment_store::lease(uint64_t key, int64_t deadline_ms) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return make_error(errc::not_found, "segment not stored");
  entry& e = it->second;
  if (e.n_leases++ == 0) {
    ++n_leased_segments_;
    if (e.in_lru) {
      lru_.erase(e.lru_pos);
      e.in_lru = false;
    }
  }
  const uint64_t id = next_lease_id_++;
  leases_.emplace(id, lease_record{key, deadline_ms});
  return segment_lease{
      id, std::span<const std::byte>(slot_address(e.slot), static_cast<size_t>(e.size_bytes))};
}

void segment_store::end_lease(std::map<uint64_t, lease_record>::iterator it) {
  const uint64_t key = it->second.key;
  leases_.erase(it);
  entry& e = entries_.at(key);
  if (--e.n_leases == 0) {
    --n_leased_segments_;
    touch(key, e);
  }
}

status segment_store::release(uint64_t lease_id) {
  auto it = leases_.find(lease_id);
  if (it == leases_.end())
    return make_error(errc::not_found, "lease " + std::to_string(lease_id) + " is not held");
  end_lease(it);
  return {};
}

size_t segment_store::expire(int64_t now_ms) {
  size_t n = 0;
  for (auto it = leases_.begin(); it != leases_.end();) {
    auto next = std::next(it);
    if (it->second.deadline_ms <= now_ms) {
      end_lease(it);
      ++n;
    }
    it = next;
  }
  return n;
}

bool segment_store::leased(uint64_t key) const {
  auto it = entries_.find(key);
  return it != entries_.end() && it->second.n_leases > 0;
}

// -- memory
// -----------------------------------------------------------------------------------------

compact_report segment_store::compact() {
  compact_report report;
  for (int32_t hi = n_slots_ - 1; hi >= 0 && !free_slots_.empty(); --hi) {
    const int32_t lo = *free_slots_.begin();
    if (lo >= hi) break;  // every slot below hi is occupied
    const uint64_t key = slot_key_[static_cast<size_t>(hi)];
    if (key == 0) continue;
    entry& e = entries_.at(key);
    if (e.n_leases > 0) continue;  // a transfer may be reading it: stays in place
    std::memcpy(slot_address(lo), slot_address(hi), static_cast<size_t>(e.size_bytes));
    free_slots_.erase(free_slots_.begin());
    free_slots_.insert(hi);
    slot_key_[static_cast<size_t>(lo)] = key;
    slot_key_[static_cast<size_t>(hi)] = 0;
    chunk_live_[static_cast<size_t>(chunk_of(lo))] += 1;
    chunk_live_[static_cast<size_t>(chunk_of(hi))] -= 1;
    e.slot = lo;
    ++report.segments_moved;
  }
  for (size_t c = 0; c < chunks_.size(); ++c) {
    if (chunks_[c] && chunk_live_[c] == 0) {
      chunks_[c].reset();
      report.bytes_freed += chunk_bytes(static_cast<int32_t>(c));
    }
  }
  return report;
}

segment_store_stats segment_store::stats() const {
  segment_store_stats s;
  s.capacity_bytes = int64_t{n_slots_} * cfg_.segment_bytes;
  s.bytes_used = bytes_used_;
  for (size_t c = 0; c < chunks_.size(); ++c)
    if (chunks_[c]) s.bytes_allocated += chunk_bytes(static_cast<int32_t>(c));
  s.n_segments = static_cast<int64_t>(entries_.size());
  s.n_leased_segments = n_leased_segments_;
  s.n_leases = static_cast<int64_t>(leases_.size());
  s.evictions = evictions_;
  s.hits = hits_;
  s.misses = misses_;
  return s;
}

}  // namespace weft::cache
