// The Prometheus metrics the router exports: names, kinds and help texts (values are set in
// router.cpp and router_pool.cpp).

#include "actors/serve/router.hpp"

namespace weft::serve {

namespace {

/// The series of a counter labelled by outcome, shown at 0 from the start.
std::vector<metric_labels> outcomes(std::initializer_list<const char*> names) {
  std::vector<metric_labels> out;
  for (const char* n : names) out.push_back({{"outcome", n}});
  return out;
}

}  // namespace

void declare_router_metrics(metrics_registry& m) {
  m.declare_counter("weft_router_requests_total", "Sequences submitted to the router, by outcome",
                    outcomes({"ok", "rejected", "aborted", "error"}));
  m.declare_counter("weft_router_migrations_total",
                    "Sequences re-dispatched after their worker died");
  m.declare_counter("weft_router_worker_deaths_total",
                    "Engine workers lost (process killed, link cut, hung)");
  m.declare_counter("weft_router_hung_workers_total",
                    "Engine workers treated as dead because they made no progress for the stall "
                    "limit");
  m.declare_gauge("weft_router_stall_limit_seconds",
                  "How long a worker may go without an engine step or a load report before it "
                  "is hung: --stall-ms, or 4x the longest step the workers measured they may take");
  m.declare_gauge("weft_router_pending", "Sequences waiting for a live worker");
  m.declare_gauge("weft_router_running", "Sequences dispatched and unfinished");
  m.declare_gauge("weft_workers", "Engine workers by state");
  m.declare_gauge(
      "weft_queue_depth",
      "Live sequences per scheduling level, summed over workers (level 0 = highest priority)");
  m.declare_gauge("weft_kv_blocks_used", "KV blocks in use, per worker");
  m.declare_gauge("weft_kv_blocks_free", "KV blocks free, per worker");
  m.declare_counter("weft_worker_preemptions_total",
                    "Preemptions so far, per worker (current incarnation)", {});
  m.declare_gauge("weft_worker_swapped", "Sequences swapped to host memory, per worker");
  m.declare_counter("weft_worker_steps_total",
                    "Forward passes so far, per worker (current incarnation)", {});
  m.declare_counter("weft_worker_seconds_total",
                    "Seconds of a worker's step loop by stage (current incarnation): forward "
                    "passes, sampling, the engine's scheduling and detokenizing (schedule), "
                    "sending outputs (outputs), waiting for the next step's turn (between)",
                    {});
  m.declare_gauge("weft_cache_segments", "Segments held, per prefix-cache shard");
  m.declare_counter("weft_worker_prompt_tokens_total",
                    "Prompt tokens admitted, per worker (current incarnation)", {});
  m.declare_counter(
      "weft_cache_hit_tokens_total",
      "Prompt tokens served from a prefix cache, per worker and source (local blocks or the pool)",
      {});
  m.declare_counter("weft_cache_pool_bytes_in_total",
                    "Segment bytes a worker pulled from the pool (current incarnation)", {});
  m.declare_counter("weft_migration_pool_tokens_total",
                    "KV tokens of resumed (migrated) sequences a worker took from the pool instead "
                    "of recomputing them (current incarnation)",
                    {});
  m.declare_counter("weft_cache_checkpoint_segments_total",
                    "Segments of running sequences (prompt + generated tokens) the router asked "
                    "workers to publish to the pool");
  m.declare_counter("weft_cache_prefix_waits_total",
                    "Requests that waited for another request's in-flight prefill of their prefix, "
                    "per worker (current incarnation)",
                    {});
  m.declare_gauge("weft_cache_bytes_used", "Segment bytes held, per prefix-cache shard");
  m.declare_counter("weft_cache_shard_lookups_total",
                    "Keys looked up so far, per shard (current incarnation)", {});
  m.declare_counter("weft_cache_shard_hits_total",
                    "Keys found so far, per shard (current incarnation)", {});
  m.declare_counter("weft_cache_shard_bytes_in_total",
                    "Segment bytes published into the shard (current incarnation)", {});
  m.declare_counter("weft_cache_shard_bytes_out_total",
                    "Segment bytes served by the shard (current incarnation)", {});
  m.declare_counter("weft_cache_shard_evictions_total",
                    "Segments evicted so far, per shard (current incarnation)", {});
  m.declare_gauge("weft_cache_shard_imbalance", "Segments on the fullest shard / mean over shards");
  m.declare_counter("weft_cache_shard_deaths_total", "Prefix-cache shards lost");
  m.declare_gauge("weft_cache_replica_segments",
                  "Replica copies of hot pool segments (homes not counted), per the directory");
  m.declare_gauge("weft_cache_replicated_keys", "Pool segments held by more than one shard");
  m.declare_gauge("weft_cache_hot_segments", "Pool segments the access-rate sketch counts as hot");
  m.declare_gauge("weft_cache_directory_load",
                  "Segments homed on a shard plus replicas it holds, per the directory");
  m.declare_counter("weft_cache_replications_total", "Hot-segment copies ordered, by outcome",
                    outcomes({"copied", "failed"}));
  m.declare_counter("weft_cache_key_moves_total",
                    "Segments copied to the shard that became their home (a shard joined, or a "
                    "rebalance), by outcome",
                    outcomes({"copied", "failed"}));
  m.declare_gauge("weft_cache_pending_moves",
                  "Segments whose home moved (a shard joined, or a rebalance) and are not copied "
                  "there yet");
  m.declare_counter("weft_cache_rebalance_moves_total",
                    "Segments re-homed by the periodic rebalance off shards above the load bound");
  m.declare_counter("weft_router_colocated_fallback_total",
                    "Sequences a prefill worker decoded itself because no decode worker was alive");
  m.declare_counter("weft_kv_handoffs_total",
                    "Disaggregated KV handoffs (prefill -> decode worker), by outcome",
                    outcomes({"ok", "failed"}));
  m.declare_counter("weft_kv_transfer_bytes_total", "KV bytes pulled by decode workers");
  m.declare_counter("weft_kv_leases_expired_total",
                    "Offered KV leases nobody released before their deadline");
  m.declare_histogram("weft_kv_transfer_seconds", "Time of one KV pull (prefill -> decode worker)",
                      metrics_registry::latency_buckets_s());
  m.declare_histogram(
      "weft_migration_resume_seconds",
      "From a worker's death to the first token of a migrated sequence on its new worker",
      metrics_registry::latency_buckets_s());
}

}  // namespace weft::serve
