#pragma once
/// Internal to the router role (router.cpp: admission, dispatch, migration, disaggregation
/// hand-offs; router_route.cpp: worker choice; router_pool.cpp: the router's picture of the
/// workers' caches and the prefix-cache pool — shards, the pool directory, plans and replica
/// orders). Not public API.

#include <caf/actor.hpp>
#include <caf/stateful_actor.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "actors/cache/directory.hpp"
#include "actors/cache/segment_keys.hpp"
#include "actors/serve/router.hpp"
#include "actors/serve/wire_convert.hpp"
#include "schema/caf_bridge.hpp"

namespace weft::serve::router_internal {

namespace wire = schema::wire;
using clock_type = std::chrono::steady_clock;

/// A bounded set of prefix keys, least recently used dropped first: the router's picture of what a
/// worker's prefix cache (or the pool) holds, from the prompts it sent there.
class key_lru {
 public:
  void set_capacity(size_t n) { capacity_ = std::max<size_t>(n, 1); }
  void touch(uint64_t key) {
    if (auto it = pos_.find(key); it != pos_.end()) {
      order_.splice(order_.begin(), order_, it->second);
      return;
    }
    order_.push_front(key);
    pos_[key] = order_.begin();
    while (order_.size() > capacity_) {
      pos_.erase(order_.back());
      order_.pop_back();
    }
  }
  /// Leading keys of `keys` held.
  size_t leading(const std::vector<uint64_t>& keys) const {
    size_t n = 0;
    while (n < keys.size() && pos_.count(keys[n]) != 0) ++n;
    return n;
  }
  void clear() {
    order_.clear();
    pos_.clear();
  }

 private:
  size_t capacity_ = 4096;
  std::list<uint64_t> order_;
  std::unordered_map<uint64_t, std::list<uint64_t>::iterator> pos_;
};

struct worker_info {
  std::string name;
  caf::actor handle;
  std::string node_id;
  uint32_t pid = 0;
  wire::WorkerRole role = wire::WorkerRole::BOTH;
  std::string model;
  std::string policy;
  uint32_t kv_blocks_total = 0;
  uint32_t max_running = 0;
  uint32_t n_ctx = 0;
  // latest load report
  uint32_t n_waiting = 0, n_running = 0, n_swapped = 0, kv_used = 0, kv_free = 0;
  uint64_t steps = 0, preemptions = 0, prefill_tokens = 0, decode_tokens = 0, swaps_out = 0,
           prefix_hits = 0, prefix_waits = 0;
  uint64_t queued_prefill_tokens = 0;
  uint64_t last_step_unix_ms = 0;
  uint64_t pool_hit_tokens = 0, prompt_tokens = 0, pool_bytes_in = 0;
  uint64_t resume_pool_tokens = 0;  ///< KV tokens of resumed sequences it took from the pool
  /// Cumulative seconds of its step loop by stage (WorkerLoad.stepSeconds ...).
  double step_s = 0.0, forward_s = 0.0, sample_s = 0.0, output_s = 0.0, between_s = 0.0;
  uint32_t block_size = 16;
  uint32_t segment_tokens = 0;                ///< the worker's pool segment size (0: no pool)
  cache::segment_key_config pool_key_config;  ///< how it hashes pool segment keys (empty: no pool)
  uint64_t kv_bytes_per_token = 0;
  key_lru recent;  ///< prefix keys of prompts it prefilled lately (its cache, roughly)
  std::vector<uint32_t> levels;
  float prefill_rate = 0.0f;  ///< EWMA of measured prefill tokens/s while prefilling
  float decode_rate = 0.0f;
  clock_type::time_point last_report = clock_type::now();
  uint64_t dispatched_prompt_tokens = 0;  ///< prompt tokens dispatched since the last load report
  std::set<uint64_t> inflight;
  clock_type::time_point hello_at = clock_type::now();
};

struct request_info {
  generate_spec spec;
  std::vector<int32_t> generated;
  std::string worker;  ///< empty while pending
  caf::actor client;
  clock_type::time_point submitted = clock_type::now();
  clock_type::time_point pending_since = clock_type::now();
  std::optional<clock_type::time_point> orphaned_at;  ///< when its worker died (migration clock)
  // Disaggregation: while the decode worker (`worker`) pulls the KV, the prefill worker
  // `kv_owner` holds it under `lease_id`; the router releases the lease exactly when the transfer
  // stage ends (pulled, failed, aborted, either worker lost).
  bool transferring = false;
  std::string kv_owner;
  uint64_t lease_id = 0;
  uint32_t handoff_failures = 0;
  /// Leading segments of prompt + generated tokens planned into the pool so far (the dispatch's
  /// plan, then checkpoints): a resumed attempt reads at most these.
  uint32_t pool_segments = 0;
};

/// A prefix-cache pool shard (actors/cache/cache_shard.hpp), as its load reports show it.
struct shard_info {
  std::string name;
  caf::actor handle;
  std::string node_id;
  uint32_t pid = 0;
  uint64_t slots = 0;
  uint64_t n_segments = 0, bytes_used = 0, capacity_bytes = 0, lookups = 0, hits = 0, publishes = 0,
           evictions = 0, bytes_in = 0, bytes_out = 0;
};

struct router_state {
  static inline const char* name = "weft.router";
  router_config cfg;
  std::map<std::string, worker_info> workers;
  /// WorkerLoad.stepBoundMs by worker name, kept after a worker is lost (stall_limit).
  std::map<std::string, uint32_t> step_bounds;
  std::map<std::string, shard_info> shards;
  key_lru pool_keys;        ///< prefix keys the pool holds, roughly (prompts prefilled with a pool)
  uint64_t pool_slots = 0;  ///< segment slots over all shards
  cache::pool_directory directory;  ///< homes, replicas and read choice of pool segments
  std::map<cache::shard_id, std::string> shard_by_id;
  std::map<uint64_t, request_info> requests;
  std::deque<uint64_t> pending;
  uint64_t deaths = 0;
  uint64_t migrations = 0;
  uint64_t round_robin = 0;  ///< next turn of route = round-robin
  uint64_t tie_turn = 0;     ///< rotates equal TTFT estimates (least-ttft, least-load)
  uint64_t ticks = 0;        ///< router ticks (100 ms) so far
};

using router_ptr = caf::stateful_actor<router_state>*;

/// What a prompt would find cached on `w`: tokens in its own cache, tokens in the pool.
struct cache_estimate {
  int64_t local_tokens = 0;
  int64_t pool_tokens = 0;
};

// -- worker choice (router_route.cpp) -------------------------------------------------------------

bool can_prefill(const worker_info& w);
/// Whether any decode worker is alive (disaggregated mode).
bool has_decoder(const router_state& st);
/// The decode worker for a handed-off sequence: the fewest live sequences per slot, then the most
/// free KV blocks.
worker_info* choose_decoder(router_state& st);
/// Predicted time to first token of a `prompt_tokens` prompt on `w`, in ms; `cached` (when given)
/// is what its cache or the pool already holds (the pool's part costs a transfer).
double predicted_ttft_ms(const router_state& st, const worker_info& w, size_t prompt_tokens,
                         const cache_estimate& cached = {});
/// The worker for a prompt (prompt + `extra` resumed tokens) by the configured route; its
/// predicted TTFT in *ttft_ms.
worker_info* choose_worker(router_state& st, std::span<const int32_t> prompt, size_t extra,
                           double* ttft_ms);

// -- the cache picture and the pool (router_pool.cpp) -------------------------------------------

int64_t key_tokens(const worker_info& w);
std::vector<uint64_t> prefix_keys(const worker_info& w, std::span<const int32_t> prompt);
cache_estimate estimate_cache(const router_state& st, const worker_info& w,
                              const std::vector<uint64_t>& keys, size_t prompt_tokens);
void note_prefill(router_state& st, worker_info& w, std::span<const int32_t> prompt);
cache::shard_id shard_id_of(const std::string& name);
void plan_pool(router_ptr self, const worker_info& w, generate_spec& spec);
/// After new tokens of `r` on `w`: plans the segments of prompt + generated tokens that are now
/// whole in the worker's KV and asks it to publish them (PoolCheckpoint).
void checkpoint_pool(router_ptr self, request_info& r, const worker_info& w);
/// Sends the copies the directory wants now (moved keys, hot-key replicas) to their target shards.
void send_copy_orders(router_ptr self);
/// Periodic memory rebalancing between shards (router tick): moves keys off shards above the load
/// bound and sends the copies.
void rebalance_pool(router_ptr self);
void send_shards(router_ptr self, const caf::actor& to);
void broadcast_shards(router_ptr self);
void on_shard_hello(router_ptr self, const std::string& name, wire::WorkerHello::Reader hello);
void on_shard_load(router_ptr self, const schema::envelope& env);
/// A monitored actor went down: if it was a shard, forget it and its segments; true if it was.
bool on_shard_down(router_ptr self, const caf::actor_addr& source, const std::string& reason);
/// A shard reports the end of a replica copy it was ordered to make.
void on_replica_copied(router_ptr self, uint64_t key, const std::string& shard, bool ok);

}  // namespace weft::serve::router_internal
