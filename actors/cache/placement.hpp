#pragma once
/// Where each cache segment lives: consistent hashing with bounded load (Mirrokni, Thorup,
/// Zadimoghaddam, SODA'18) over a ring of cache shards with virtual nodes, plus replica choice for
/// hot segments and read spreading over replicas.
///
/// A key's home is the first shard clockwise from the key's ring position whose load (segments
/// homed there) is below ceil((1 + epsilon) * mean load), the mean counting the key being placed.
/// So no shard ever holds more than that bound when a key is placed, and a key's home only changes
/// when shards come or go: adding a shard moves only keys that now reach it first (about 1/n of
/// them), removing one moves only its own keys. Removing keys (unassign) can leave a shard above
/// the lowered bound; rebalance() restores it.
///
/// Replicas of hot keys go on the least-loaded other shards (load = homed + replica segments).
///
/// Plain C++ (no CAF), deterministic: no global RNG, ties broken by ring order and ids. Not
/// thread-safe: one owner (the pool directory actor or the simulator).

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "schema/status.hpp"

namespace weft::cache {

/// Identifies one cache shard (one segment_store).
using shard_id = uint32_t;

/// Settings of the ring.
struct placement_config {
  /// Virtual nodes per shard (> 0): more even arcs, longer ring.
  int32_t vnodes_per_shard = 64;
  /// Load bound factor: a shard takes a new key only while its load < ceil((1+epsilon) * mean).
  /// Smaller is more even but moves more keys on membership changes (the paper's O(1/epsilon^2)).
  double epsilon = 0.25;
  /// Seed of the ring hash; every directory of one pool must use the same.
  uint64_t seed = 0x77656674;  // "weft"
};

/// One key changing shard (its segment should be copied from `from` to `to`).
struct key_move {
  uint64_t key = 0;
  shard_id from = 0;
  shard_id to = 0;
};

/// The ring, the key → home map and per-shard loads.
class placement {
 public:
  explicit placement(placement_config cfg = {});

  // -- membership
  // ----------------------------------------------------------------------------------

  /// Adds a shard and moves to it the keys whose walk now reaches it before their home, while it
  /// is below the load bound. Error already_exists if present.
  result<std::vector<key_move>> add_shard(shard_id id);

  /// Removes a shard and re-homes its keys (other keys stay). Replicas on it are dropped. Errors:
  /// not_found; unavailable when it is the last shard and still homes keys.
  result<std::vector<key_move>> remove_shard(shard_id id);

  // -- keys
  // ----------------------------------------------------------------------------------------

  /// The key's home: its owner if assigned, else the shard assign() would pick now.
  /// Error unavailable when there are no shards.
  result<shard_id> home(uint64_t key) const;

  /// Homes `key` (idempotent: an assigned key keeps its shard) and counts it in that shard's load.
  result<shard_id> assign(uint64_t key);

  /// Forgets `key` and its replicas. Error not_found if it is not assigned.
  status unassign(uint64_t key);

  /// The key's home if assigned.
  std::optional<shard_id> owner(uint64_t key) const;

  /// Moves keys off shards above the current bound (after unassigns lowered the mean).
  std::vector<key_move> rebalance();

  // -- replicas
  // ------------------------------------------------------------------------------------

  /// Suggested replica set of size min(k, n_shards): home first, then the k-1 other shards with the
  /// least load (homed + replicas), ties broken by the key's ring walk order. Empty if no shards.
  std::vector<shard_id> replicas(uint64_t key, size_t k) const;

  /// Records that `shard` holds a replica of the assigned `key` (counts in its load).
  /// Errors: not_found (key not assigned, shard unknown), already_exists (home or duplicate).
  status add_replica(uint64_t key, shard_id shard);

  /// Forgets one replica. Error not_found.
  status drop_replica(uint64_t key, shard_id shard);

  /// Where the key can be read: home first, then recorded replicas. Empty if not assigned.
  std::vector<shard_id> locations(uint64_t key) const;

  // -- observers
  // -----------------------------------------------------------------------------------

  /// Keys homed on `id` (0 for an unknown shard).
  int64_t load(shard_id id) const;
  /// Replica segments held by `id` (0 for an unknown shard).
  int64_t replica_load(shard_id id) const;
  /// ceil((1+epsilon) * n_assigned / n_shards): the bound every shard obeys after rebalance().
  int64_t load_bound() const { return bound(n_assigned_); }
  /// Largest load over shards.
  int64_t max_load() const;
  size_t n_shards() const { return shards_.size(); }
  int64_t n_assigned() const { return n_assigned_; }
  /// Shard ids in increasing order.
  std::vector<shard_id> shard_ids() const;
  const placement_config& config() const { return cfg_; }

 private:
  struct ring_point {
    uint64_t pos;
    shard_id shard;
  };
  struct shard_state {
    int64_t load = 0;
    int64_t replica_load = 0;
  };

  int64_t bound(int64_t n_keys) const;
  uint64_t position(uint64_t key) const;
  /// Distinct shards in clockwise order from the key's position.
  std::vector<shard_id> walk(uint64_t key) const;
  /// First shard in the walk, other than `skip`, with load < `cap`.
  std::optional<shard_id> first_below(uint64_t key, int64_t cap,
                                      std::optional<shard_id> skip = std::nullopt) const;
  void move_key(uint64_t key, shard_id from, shard_id to);
  std::vector<uint64_t> sorted_keys_of(std::optional<shard_id> shard) const;

  placement_config cfg_;
  std::vector<ring_point> ring_;  // sorted by (pos, shard)
  std::map<shard_id, shard_state> shards_;
  std::unordered_map<uint64_t, shard_id> owner_;
  std::unordered_map<uint64_t, std::vector<shard_id>> replicas_;  // excludes the home
  int64_t n_assigned_ = 0;
};

/// Read spreading: the index in `replicas` with the fewest outstanding reads (`outstanding[i]`,
/// missing entries count as 0). Ties are broken round-robin from an offset derived from `key` and
/// `read_seq` (e.g. a per-key read counter), so idle replicas share reads evenly. Deterministic.
/// Returns 0 when `replicas` is empty.
size_t pick_replica(uint64_t key, std::span<const shard_id> replicas,
                    std::span<const int64_t> outstanding, uint64_t read_seq);

}  // namespace weft::cache
