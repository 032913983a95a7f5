#pragma once
/// Internal to the engine worker role (engine_worker.cpp: the actor, batching, disaggregation;
/// engine_worker_pool.cpp: the prefix-cache pool client). Not part of the public API.

#include <caf/actor.hpp>
#include <caf/stateful_actor.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "actors/auth.hpp"
#include "actors/cache/rma_pull.hpp"
#include "actors/cache/segment_keys.hpp"
#include "actors/serve/engine_worker.hpp"
#include "actors/serve/kv_transfer.hpp"
#include "actors/serve/model_host.hpp"
#include "actors/serve/stall_watch.hpp"
#include "actors/serve/wire_convert.hpp"
#include "gpu/engine.hpp"
#include "schema/caf_bridge.hpp"

namespace weft::serve::worker_internal {

struct running_request {
  uint32_t attempt = 0;
  uint32_t next_position = 0;  ///< position of the next token this worker generates
  uint32_t n_prompt = 0;
  uint32_t n_prefill = 0;  ///< prompt + resumed tokens to compute before the first new token
  bool started = false;    ///< produced its first token here
  bool want_logprobs = false;
  bool handoff = false;  ///< disaggregated prefill: offer the KV after the first new token
  bool publish = false;  ///< publish the prompt's segments to the pool after its prefill
  /// A migrated request being rebuilt here (prompt + resumed tokens) until its first new token.
  bool rebuilding = false;
  std::vector<int32_t> prompt;  ///< kept only when publishing
  /// Home shard of each leading segment (the router directory's plan), for the publish.
  std::vector<pool_segment> pool_plan;
  std::string trace_id;
};

/// A request waiting for its prefix segments from the pool (lookups, then pulls).
struct pending_fetch {
  generate_spec spec;
  std::vector<uint64_t> keys;   ///< segment keys of the sequence's leading full segments
  std::vector<int32_t> tokens;  ///< the sequence: prompt + resumed tokens
  int64_t local_tokens = 0;     ///< what the worker's own prefix cache already holds
  size_t replies_left = 0;
  struct hit {
    size_t shard = 0;  ///< index in the shard list at lookup time
    uint64_t offset = 0, size = 0, lease = 0;
    std::vector<std::byte> address, region;
  };
  std::map<uint64_t, hit> hits;    ///< key -> where to pull it
  std::vector<caf::actor> shards;  ///< the shard list at lookup time
  gpu::seq_id seq = 0;             ///< allocated once pulling
  int64_t n_tokens = 0;            ///< tokens being pulled
  size_t pulls_left = 0;
  bool failed = false;
  bool aborted = false;  ///< aborted (or superseded) while pulling
  uint64_t bytes = 0;
};

/// A KV pull in flight (disaggregated decode).
struct pending_import {
  generate_spec spec;
  uint64_t lease_id = 0;
  bool aborted = false;  ///< the request was aborted or superseded while its bytes were moving
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
};

struct worker_state {
  static inline const char* name = "weft.engine_worker";
  std::string worker_name;
  std::string node_id;
  worker_config cfg;
  actors::cluster_secret secret;
  std::unique_ptr<model_host> host;
  std::unique_ptr<gpu::engine> engine;
  std::shared_ptr<gpu::schedule_policy> policy;
  caf::actor router;
  std::map<uint64_t, running_request> requests;
  // Disaggregation: the node's transport, the prefill side's exporter, the decode side's importer.
  std::shared_ptr<transport::engine> transport;
  std::unique_ptr<kv_exporter> exporter;
  std::unique_ptr<kv_importer> importer;
  std::map<uint64_t, pending_import> imports;  ///< pull id -> pull
  std::map<uint64_t, uint64_t> import_of;      ///< request id -> pull id
  // Prefix-cache pool (cfg.segment_tokens > 0 and shards known): segment keys, the live shards
  // (where each segment is read and published comes with each request, from the router's
  // directory), lookups and pulls in flight, publishes under KV leases.
  cache::segment_key_config keys;
  std::vector<caf::actor> shards;
  std::map<std::string, size_t> shard_by_name;  ///< shard name -> index in `shards`
  std::unique_ptr<cache::rma_puller> puller;
  std::map<uint64_t, pending_fetch> fetches;  ///< request id -> fetch
  std::map<uint64_t, uint64_t> fetch_pulls;   ///< pull id -> request id
  std::map<uint64_t, size_t> publish_leases;  ///< KV lease -> shard answers outstanding
  std::unordered_set<uint64_t> published;     ///< keys the pool has (recently published or fetched)
  std::deque<uint64_t> published_order;
  uint64_t pool_hit_tokens = 0, prompt_tokens = 0, pool_bytes_in = 0;
  uint64_t resume_pool_tokens = 0;   ///< KV tokens of resumed sequences taken from the pool
  uint64_t checkpoint_segments = 0;  ///< segments of running sequences offered to the pool
  bool stepping = false;
  /// Compute threads borrowed beyond the configured ones while migrated requests are rebuilt.
  bool borrowing_cores = false;
  // load accounting
  uint64_t last_decode = 0;
  double last_prefill_pass_s = 0.0;  ///< engine_stats::prefill_pass_s at the last load report
  int64_t last_prefill_pass_tokens = 0;
  std::chrono::steady_clock::time_point last_load_at = std::chrono::steady_clock::now();
  uint64_t last_step_unix_ms = 0;
  step_history
      steps;  ///< how long its steps take (the router's stall limit, WorkerLoad.stepBoundMs)
  int64_t rebuild_batch_tokens = 0;  ///< engine_config::rebuild_batch_tokens
  /// Per-stage time of the step loop (docs/serving.md, "Where the serving path's time goes"): in
  /// run_step after the engine's step (chunks to the router), and between a step and the next
  /// (the step message waiting in the mailbox behind other messages).
  double output_s = 0.0, between_s = 0.0;
  std::chrono::steady_clock::time_point step_sent_at{};
  bool step_sent = false;
};

using worker_ptr = caf::stateful_actor<worker_state>*;

// -- engine_worker.cpp
// ------------------------------------------------------------------------------

/// Queues a request in the engine (`prefilled`: a sequence already holding its prompt prefix).
void admit(worker_ptr self, generate_spec d, gpu::seq_id prefilled);
/// Frees the KV sequence of an ended lease.
void free_leased(worker_ptr self, const kv_lease& l);

// -- engine_worker_pool.cpp: the prefix-cache pool client -----------------------------------------

/// Router -> worker: the live shards.
void on_shards(worker_ptr self, std::vector<std::string> names, std::vector<caf::actor> handles);
/// Looks the prompt's leading segments up in the pool; true if the request now waits for it.
bool start_fetch(worker_ptr self, generate_spec& d);
/// Gives the shards their staging slots back.
void release_hits(worker_ptr self, const pending_fetch& f);
void on_cache_reply(worker_ptr self, const schema::envelope& env);
void on_fetch_timeout(worker_ptr self, uint64_t id);
void on_fetch_pulled(worker_ptr self, uint64_t pull_id, bool ok, const std::string& err);
/// After a request's prefill: offers its prompt's KV to the planned home shards.
void publish_segments(worker_ptr self, uint64_t id, running_request& r);
void on_publish_done(worker_ptr self, const schema::envelope& env);
/// Router -> worker: publishes more segments (prompt + generated tokens) of a running sequence.
void on_pool_checkpoint(worker_ptr self, const schema::envelope& env);

}  // namespace weft::serve::worker_internal
