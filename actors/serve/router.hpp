#pragma once
/// The router / scheduler actor of `weft serve`: admission (bounded outstanding requests, early
/// rejection when the predicted TTFT misses the SLO), the choice of worker (least predicted TTFT:
/// queued prefill tokens / measured prefill rate), worker membership (signed hellos, monitors),
/// token-stream deduplication by position, and request migration: when a worker dies, each of its
/// requests is re-dispatched to a live worker with the tokens generated so far, which that worker
/// prefills before continuing; the client sees every token exactly once.
///
/// The iteration-level queue policy (FCFS, skip-join MLFQ) runs inside each worker's engine, which
/// sees every iteration; the router never holds a request a live worker could take.

#include <caf/fwd.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "actors/auth.hpp"
#include "actors/serve/metrics.hpp"

namespace weft::serve {

struct router_config {
  actors::cluster_secret secret;       ///< workers sign their hello with it
  size_t max_outstanding = 1024;       ///< accepted and unfinished requests (beyond: 429)
  uint32_t ttft_slo_ms = 0;            ///< reject early when the predicted TTFT exceeds it (0: off)
  uint32_t queue_timeout_ms = 30'000;  ///< a request with no live worker for this long fails
  float prefill_tokens_per_s_hint = 500.0f;  ///< prefill rate assumed until a worker measured one
  /// Worker choice (plain functions of the router's view, see router.cpp):
  ///  "least-ttft"      least predicted TTFT = queueing + prefill of what the worker's cache (or
  ///  the
  ///                    pool, plus the transfer) does not hold — Mooncake's conductor;
  ///  "cache-affinity"  longest prefix match in the worker's own cache, then least TTFT (SGLang,
  ///                    Dynamo style);
  ///  "least-load"      least predicted TTFT ignoring caches (load balancing);
  ///  "round-robin".
  std::string route = "least-ttft";
  /// Bandwidth assumed for pool -> worker segment pulls (TTFT estimates), GB/s.
  double pool_gbps = 2.0;
  /// Shards that may hold one hot pool segment (its home included; 1: no replicas).
  uint32_t cache_replicas = 2;
  /// With a pool: running sequences publish the KV of their generated tokens too, one segment at
  /// a time as it fills (PoolCheckpoint), so a migrated sequence resumes from the pool instead of
  /// recomputing its prompt and streamed tokens.
  bool pool_generated = true;
  /// A worker with work and no engine step for this long (or no load report at all) is hung: it
  /// is treated as dead (its requests migrate) and `on_hung` is called to end its process.
  uint32_t stall_ms = 10'000;
  /// Called (on the router's thread; keep it short) with the name and pid of a hung worker, e.g.
  /// to SIGKILL its process so that it is restarted. May be empty.
  std::function<void(const std::string& name, uint32_t pid)> on_hung;
  std::shared_ptr<metrics_registry> metrics;  ///< may be null
};

/// Declares the router's metric families in `m`.
void declare_router_metrics(metrics_registry& m);

/// Spawns the router.
caf::actor spawn_router(caf::actor_system& sys, router_config cfg);

namespace test_hooks {
/// A deliberately broken router, for showing that chaos checks catch a broken build: when set,
/// the first token a migrated request produces on its new worker is never sent to the client.
/// The `weft` binary never sets it; the test binary `weft_test` sets it when
/// $WEFT_TEST_DROP_TOKEN_ON_MIGRATION is 1 (tests/chaos/serve/test_weft_chaos.py).
extern std::atomic<bool> drop_token_on_migration;
}  // namespace test_hooks

}  // namespace weft::serve
