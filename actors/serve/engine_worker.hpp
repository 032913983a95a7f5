#pragma once
/// The engine worker role ("engine_worker"): one engine (model weights + paged KV cache) driven by
/// continuous batching on its own thread. It loads its model, connects to the router named in its
/// config, says hello (signed with the cluster secret), then runs GenerateRequests and streams
/// TokenChunks back, reporting its load every interval. Protocol: actors/serve/serve_atoms.hpp.
///
/// Config (JSON, every field but model and router optional):
///   {"model": PATH, "router": "HOST:PORT", "device": "cpu", "threads": 0,
///    "weights_memory": "huge-pages"|"mmap", "kv_blocks": 1024,
///    "block_size": 16, "max_batch_tokens": 64, "max_running": 32, "policy":
///    "fcfs"|"mlfq"|"priority", "mlfq_prefill_cost": 0.4, "mlfq_starvation_steps": 1024, "role":
///    "both"|"prefill"|"decode", "prefix_cache": true, "load_interval_ms": 200, "kv_lease_ms":
///    5000, "segment_tokens": 0, "pool_timeout_ms": 500}
///
/// Roles: "both" prefills and decodes (colocated). "prefill" hands each sequence's KV off after its
/// first new token (kv_exporter, under a lease) and "decode" pulls it (kv_importer) over the node's
/// transport; both need the node to run one (UCX).

#include <cstdint>
#include <string>

#include "actors/roles.hpp"

namespace weft::serve {

struct worker_config {
  std::string model;
  std::string router_host = "127.0.0.1";
  uint16_t router_port = 0;
  std::string device = "cpu";
  int threads = 0;
  /// Where the weights live: "huge-pages" (default) or "mmap" (gpu::gguf_memory).
  std::string weights_memory = "huge-pages";
  int64_t kv_blocks = 1024;
  int64_t block_size = 16;
  int64_t max_batch_tokens = 64;
  int64_t idle_batch_tokens = 512;  ///< budget of a pass without decodes (engine_config)
  int64_t max_running = 32;
  std::string policy = "fcfs";
  /// MLFQ: cost of one prompt token in decode-iteration units (skip-join placement). ~0.4 measured
  /// on the CPU backend with SmolLM2-135M (docs/serving.md).
  double mlfq_prefill_cost = 0.4;
  int64_t mlfq_starvation_steps = 1024;
  std::string role = "both";
  bool prefix_cache = true;
  uint32_t load_interval_ms = 200;
  /// Disaggregated prefill: how long an offered KV stays leased to the decode side.
  uint64_t kv_lease_ms = 5000;
  /// Prefix-cache pool: tokens per segment (0 = no pool). Workers look a prompt's segments up on
  /// the shards the router announces and publish new ones after prefill.
  int64_t segment_tokens = 0;
  /// Pool lookups and pulls give up after this long (the request is then prefilled cold).
  uint32_t pool_timeout_ms = 500;

  /// Parses and validates the role's JSON config; errors name the field.
  static result<worker_config> from_json(const std::string& json);
  std::string to_json() const;
};

/// Registers "engine_worker" in `roles`.
void add_serve_roles(actors::role_registry& roles);

/// The HMAC purpose and fields a worker signs its hello with (checked by the router).
inline constexpr const char* worker_hello_purpose = "weft.serve.hello";

}  // namespace weft::serve
