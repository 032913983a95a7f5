#pragma once
/// One cache shard's host-memory store of KV segments: fixed-size slots in a slab, LRU eviction,
/// leases that pin a segment while a transfer reads it, and compaction that returns free memory.
///
/// The slab is a row of chunks (`slots_per_chunk` slots each), allocated on first use; a slot's
/// address never changes while its chunk lives, so a leased segment can be read in place by a
/// transfer. New segments take the lowest free slot. A leased segment is never evicted,
/// overwritten, erased or moved until every lease on it is released or expired; when every slot is
/// leased, put() fails with `overloaded`. compact() moves unleased segments from the tail into free
/// slots at the front (leased ones stay put) and frees chunks left empty.
///
/// Lease deadlines take effect when the owner calls expire(now_ms): the store has no clock.
///
/// Plain C++ (no CAF). Not thread-safe: one owner (the shard actor); a transfer may read a leased
/// segment's bytes from another thread while the lease is held.

#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <unordered_map>
#include <vector>

#include "schema/status.hpp"

namespace weft::cache {

/// Settings of one store.
struct segment_store_config {
  /// Memory for segments; the store holds capacity_bytes / segment_bytes of them.
  int64_t capacity_bytes = int64_t{1} << 30;
  /// Bytes of one segment slot (> 0, <= capacity_bytes). A segment may be shorter.
  int64_t segment_bytes = int64_t{1} << 20;
  /// Slots per slab chunk (> 0): the unit compaction can return.
  int32_t slots_per_chunk = 64;
};

/// A pinned segment: its bytes stay valid and unchanged until the lease is released or expires.
struct segment_lease {
  uint64_t lease_id = 0;
  std::span<const std::byte> bytes;
};

/// Counters and gauges of one store.
struct segment_store_stats {
  int64_t capacity_bytes = 0;
  int64_t bytes_used = 0;       ///< sum of stored segment sizes
  int64_t bytes_allocated = 0;  ///< slab chunks currently allocated
  int64_t n_segments = 0;
  int64_t n_leased_segments = 0;
  int64_t n_leases = 0;
  uint64_t evictions = 0;
  uint64_t hits = 0;    ///< get() found the key
  uint64_t misses = 0;  ///< get() did not
};

/// What compact() did.
struct compact_report {
  int64_t segments_moved = 0;
  int64_t bytes_freed = 0;  ///< chunk memory returned to the allocator
};

/// Host-memory segment store of one cache shard.
class segment_store {
 public:
  /// Validates `cfg` (sizes > 0, at least one slot); error invalid_argument otherwise.
  static result<segment_store> create(segment_store_config cfg);

  segment_store(segment_store&&) = default;
  segment_store& operator=(segment_store&&) = default;
  segment_store(const segment_store&) = delete;
  segment_store& operator=(const segment_store&) = delete;

  // -- data
  // ----------------------------------------------------------------------------------------

  /// Copies `bytes` in under `key` (!= 0, 1..segment_bytes bytes). Evicts the least recently used
  /// unleased segment when full. An existing unleased key is overwritten; an existing leased key is
  /// left alone (ok if `bytes` are equal, already_exists otherwise). Errors: invalid_argument,
  /// overloaded (every slot is leased).
  status put(uint64_t key, std::span<const std::byte> bytes);

  /// The segment's bytes; marks it most recently used. The span stays valid until the next
  /// mutating call (eviction, compaction, erase) unless the segment is leased. Error not_found.
  result<std::span<const std::byte>> get(uint64_t key);

  /// True if `key` is stored; no LRU or stats effect.
  bool contains(uint64_t key) const { return entries_.count(key) != 0; }

  /// Removes `key`. Errors: not_found, unavailable (leased).
  status erase(uint64_t key);

  // -- leases
  // --------------------------------------------------------------------------------------

  /// Pins `key` until release() or until expire(now_ms) with now_ms >= deadline_ms. A segment may
  /// hold several leases. Error not_found.
  result<segment_lease> lease(uint64_t key, int64_t deadline_ms);

  /// Ends a lease; the segment becomes most recently used when its last lease ends.
  /// Error not_found (unknown or already expired).
  status release(uint64_t lease_id);

  /// Ends every lease with deadline_ms <= now_ms; returns how many.
  size_t expire(int64_t now_ms);

  /// True if `key` is stored and leased.
  bool leased(uint64_t key) const;

  // -- memory
  // --------------------------------------------------------------------------------------

  /// Moves unleased segments from high slots into free low slots (leased ones stay in place), then
  /// frees every chunk left without segments.
  compact_report compact();

  segment_store_stats stats() const;
  const segment_store_config& config() const { return cfg_; }
  /// Number of segment slots (capacity_bytes / segment_bytes).
  int32_t n_slots() const { return n_slots_; }

 private:
  struct entry {
    int32_t slot = 0;
    int64_t size_bytes = 0;
    int32_t n_leases = 0;
    bool in_lru = false;
    std::list<uint64_t>::iterator lru_pos;
  };
  struct lease_record {
    uint64_t key = 0;
    int64_t deadline_ms = 0;
  };

  explicit segment_store(segment_store_config cfg);

  std::byte* slot_address(int32_t slot);
  int32_t chunk_of(int32_t slot) const { return slot / cfg_.slots_per_chunk; }
  int64_t chunk_bytes(int32_t chunk) const;
  void touch(uint64_t key, entry& e);
  void evict_lru();
  void end_lease(std::map<uint64_t, lease_record>::iterator it);

  segment_store_config cfg_;
  int32_t n_slots_ = 0;
  std::vector<std::unique_ptr<std::byte[]>> chunks_;  // null until first use
  std::vector<int32_t> chunk_live_;                   // segments per chunk
  std::set<int32_t> free_slots_;
  std::vector<uint64_t> slot_key_;  // 0 = free
  std::unordered_map<uint64_t, entry> entries_;
  std::list<uint64_t> lru_;  // unleased segments only; front = most recent
  std::map<uint64_t, lease_record> leases_;
  uint64_t next_lease_id_ = 1;
  int64_t bytes_used_ = 0;
  int64_t n_leased_segments_ = 0;
  uint64_t evictions_ = 0;
  uint64_t hits_ = 0;
  uint64_t misses_ = 0;
};

}  // namespace weft::cache
