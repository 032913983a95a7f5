#pragma once
/// The prefix-cache pool's directory: which shard is each segment's home (consistent hashing with
/// bounded load), which shards hold replicas of hot segments, and which one a read should go to.
///
/// The router owns one and consults it when it dispatches a prompt: `route()` gives, per leading
/// segment key, the shard to read from (home or a replica, reads spread) and the home to publish
/// to. So homes obey the load bound without any shard or worker keeping a directory of its own,
/// and a hot segment is read from several shards.
///
/// The directory only tracks keys it routed. Shards evict on their own (LRU), so it forgets keys
/// least recently routed once it tracks more than the pool's slots; a read sent to a shard that
/// evicted the segment is a miss, never a wrong answer (keys are content hashes).
///
/// Plain C++ (no CAF), deterministic, one owner thread.

#include <algorithm>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <set>
#include <span>
#include <unordered_map>
#include <vector>

#include "actors/cache/heavy_hitters.hpp"
#include "actors/cache/placement.hpp"

namespace weft::cache {

/// Ring settings of the directory: a tighter load bound than placement's default (epsilon 0.1:
/// no shard homes more than 1.1x the mean), because the directory never copies the keys a
/// membership change moves (they are re-published), so the extra moves cost only misses.
inline placement_config directory_placement() {
  placement_config c;
  c.epsilon = 0.1;
  return c;
}

struct directory_config {
  placement_config placement = directory_placement();
  heavy_hitters_config hot;
  /// Most shards holding one segment (home included); 1 turns replication off.
  uint32_t max_replicas = 2;
  /// Keys tracked before the least recently routed is forgotten (set to the pool's slots).
  size_t capacity = 4096;
  /// Copies of keys a joining shard took over that are in flight at once (the rest queue).
  uint32_t max_moves_in_flight = 4;
};

/// Where one segment of a routed prompt is read from and published to.
struct segment_route {
  uint64_t key = 0;
  shard_id read = 0;  ///< home or a replica
  shard_id home = 0;  ///< where a worker that computed the segment publishes it
};

/// Copy `key` from shard `from` to shard `to`: a new replica of a hot key (from = its home), or a
/// key whose home moved to a joining shard (from = the shard that still holds it).
struct replica_order {
  uint64_t key = 0;
  shard_id from = 0;
  shard_id to = 0;
};

/// What a finished copy order was.
enum class copy_kind { replica, move };

class pool_directory {
 public:
  explicit pool_directory(directory_config cfg = {});

  // -- membership
  /// A (re)started, empty shard joins and homes the keys bounded-load hashing now gives it. Those
  /// keep being read from the shard that holds them while take_replica_orders() hands out copies
  /// of them to their new home (at most max_moves_in_flight at once).
  void add_shard(shard_id id);
  /// A shard left (died): its keys are re-homed, its replicas dropped.
  void remove_shard(shard_id id);
  /// Memory rebalancing between shards, for a periodic timer: forgetting keys (LRU) lowers the
  /// mean load and can leave shards above the bound; their excess keys are re-homed on shards below
  /// it and copied there like a joining shard's keys (read where they are until the copy lands).
  /// Returns the moves queued.
  size_t rebalance();
  size_t n_shards() const { return placement_.n_shards(); }
  /// Keys tracked before the least recently routed is forgotten (the pool's slots).
  void set_capacity(size_t n) { cfg_.capacity = std::max<size_t>(n, 1); }

  // -- routing
  /// Routes the leading segment keys of a prompt: homes new keys (bounded load), counts the
  /// accesses, spreads reads over the replicas. Empty without shards.
  std::vector<segment_route> route(std::span<const uint64_t> keys);
  /// Homes keys about to be written (a running sequence's checkpointed segments) without
  /// counting a read: a sequence's own checkpoints never make its keys hot. `read` is the home.
  std::vector<segment_route> place(std::span<const uint64_t> keys);

  /// Copies to make now: moved keys to their new home (up to the in-flight limit), then hot keys
  /// that want one more replica (at most one order per key in flight). Call after route() and
  /// after membership changes; report each order's outcome with replica_done().
  std::vector<replica_order> take_replica_orders();

  /// Outcome of an order. A replica serves reads on success. A moved key is read from its new home
  /// either way (after a failed copy it is a miss there until published again).
  copy_kind replica_done(uint64_t key, shard_id to, bool ok);

  // -- observers
  /// Segments homed on `id` plus replicas it holds, as far as the directory knows.
  int64_t load(shard_id id) const { return placement_.load(id) + placement_.replica_load(id); }
  /// Keys with more than one location.
  size_t replicated_keys() const;
  /// Replica copies recorded (not counting homes).
  int64_t replicas() const;
  /// Keys the sketch counts as hot now.
  size_t hot_keys() const;
  size_t tracked_keys() const { return lru_.size(); }
  /// Moved keys whose copy to the new home has not finished (queued or in flight).
  size_t pending_moves() const { return moves_.size(); }
  std::vector<shard_id> locations(uint64_t key) const { return placement_.locations(key); }

 private:
  void touch(uint64_t key);
  /// Queues copies of keys whose home moved (a join, a rebalance).
  void queue_moves(const std::vector<key_move>& moved);
  /// Forgets the pending move of `key`, if any.
  void drop_move(uint64_t key);

  struct pending_move {
    shard_id from = 0;  ///< holds the segment
    shard_id to = 0;    ///< its home now
    bool ordered = false;
  };

  directory_config cfg_;
  placement placement_;
  heavy_hitters hot_;
  std::list<uint64_t> lru_;  // most recently routed first
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> lru_pos_;
  std::unordered_map<uint64_t, uint64_t> reads_;  // read sequence per key (read spreading)
  std::set<uint64_t> ordered_;                    // keys with a replica order in flight
  std::vector<uint64_t> candidates_;              // hot keys seen by the last route() calls
  std::unordered_map<uint64_t, pending_move> moves_;
  std::deque<uint64_t> move_queue_;  // keys of moves_ not yet ordered, oldest first
  uint32_t moves_in_flight_ = 0;
};

}  // namespace weft::cache
