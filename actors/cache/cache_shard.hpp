#pragma once
/// The cache-shard role ("cache_shard"): one shard of the cluster's prefix-cache segment pool
/// (TokenLake). It keeps KV segments in host memory (actors/cache/segment_store.hpp), keyed by
/// their chained hash, and serves engine workers:
///   - publish: a worker offers a sequence's KV under a lease (KvDescriptor) and names the segments
///     homed here; the shard pulls their blocks over the transport into a staging slot, stores
///     them (LRU eviction among unleased segments) and answers CachePublishDone;
///   - lookup: a worker asks which of its keys the shard holds; each hit is copied into a leased
///     staging slot the worker pulls from over the transport, then releases (or the lease expires).
/// Segment bytes never travel through mailboxes. Staging slots are one registered region
/// (registered once); the store's own memory is never exposed to a transfer, so eviction and
/// compaction never race a reader. A restarted shard starts empty: a killed shard costs misses,
/// never stale data. It says hello to the router (signed, role cacheShard) and reports its load.
///
/// Config (JSON): {"router": "HOST:PORT", "capacity_bytes": N, "segment_bytes": N,
///   "staging_slots": 32, "lease_ms": 2000, "load_interval_ms": 500}

#include <cstdint>
#include <string>

#include "actors/roles.hpp"

namespace weft::cache {

struct shard_config {
  std::string router_host = "127.0.0.1";
  uint16_t router_port = 0;
  int64_t capacity_bytes = int64_t{256} << 20;
  int64_t segment_bytes = 0;   ///< bytes of one segment (segment tokens x KV bytes per token)
  int32_t staging_slots = 32;  ///< segments in flight at once (lookups + publishes)
  uint32_t lease_ms = 2000;    ///< how long a worker may take to pull a staged hit
  uint32_t load_interval_ms = 500;

  static result<shard_config> from_json(const std::string& json);
  std::string to_json() const;
};

/// Registers "cache_shard" in `roles`.
void add_cache_roles(actors::role_registry& roles);

}  // namespace weft::cache
