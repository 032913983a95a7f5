#pragma once
/// A pool of engine workers for your own program (docs/embedding.md): a router in this process
/// and N engine workers under a one-for-one supervisor, placed by the cluster's head on nodes that
/// accept the "engine_worker" role (this node, if its role list allows it, or `weft node` processes
/// that joined). A killed worker is restarted by the supervisor; its requests migrate to the
/// others and finish without a lost or repeated token.
///
///   auto roles = std::make_shared<weft::actors::role_registry>();
///   weft::actors::add_builtin_roles(*roles);
///   weft::serve::add_serve_roles(*roles);        // "engine_worker"
///   auto node = weft::actors::node::start(head_options, roles);
///   auto pool = weft::serve::engine_pool::start(**node, {.model = path, .workers = 2});
///   auto out  = (*pool)->generate_text("Hello", params);
///
/// start() and generate*() block (call them from main() or your own threads, not from inside an
/// actor; actors talk to router() with the protocol of actors/serve/generate_client.hpp).

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "actors/node.hpp"
#include "actors/serve/generate_client.hpp"
#include "actors/serve/model_host.hpp"

namespace weft::serve {

struct engine_pool_options {
  std::string model;         ///< GGUF path (empty: default_model_path())
  int workers = 1;           ///< engine workers
  int threads = 0;           ///< compute threads per worker (0: cores / workers, at least 1)
  int64_t kv_blocks = 1024;  ///< KV blocks per worker (block_size tokens each)
  int64_t block_size = 16;
  int64_t max_batch_tokens = 64;
  int64_t idle_batch_tokens = 512;  ///< budget of a pass without decodes
  std::string policy = "fcfs";  ///< "fcfs", "mlfq" or "priority" (actors/serve/engine_worker.hpp)
  std::string name = "engine-pool";  ///< the supervisor's name; workers are <name>-worker-<i>
  uint32_t max_restarts = 5;         ///< per minute, before the supervisor gives up
  uint32_t restart_delay_ms = 500;   ///< first restart backoff
  uint32_t ready_timeout_s = 180;    ///< start() fails if the workers are not loaded by then
  uint32_t max_outstanding = 1024;   ///< router admission bound
  /// Prefix-cache pool (TokenLake, docs/cache_pool.md): shards that hold KV segments for every
  /// worker (0: each worker keeps only its own prefix cache). Needs nodes with a data-plane
  /// transport (node_options::transport "ucx") and cache::add_cache_roles in their role table.
  int cache_shards = 0;
  int64_t segment_tokens = 64;  ///< tokens per pool segment (a multiple of block_size)
  double cache_mem_gb = 1.0;    ///< memory of each shard
};

class engine_pool {
 public:
  /// Spawns the router (published on 127.0.0.1, mutual TLS under the node's cluster secret) and
  /// the supervised workers; returns once every worker has loaded the model. Errors name the step.
  static result<std::unique_ptr<engine_pool>> start(actors::node& node, engine_pool_options opts);
  ~engine_pool();
  engine_pool(const engine_pool&) = delete;
  engine_pool& operator=(const engine_pool&) = delete;

  /// The router: send it (submit_atom, GenerateRequest) from your actors.
  caf::actor router() const;
  /// "127.0.0.1:PORT": for roles on other nodes (connect_actor).
  std::string router_address() const;
  /// The workers' supervisor.
  caf::actor supervisor() const;
  /// Names of the workers (as registered on the cluster: lookup_on_cluster finds them), then of
  /// the cache shards.
  std::vector<std::string> worker_names() const;
  /// Workers and cache shards that have said hello to the router (serving) right now.
  int ready_workers() const;
  /// The model's tokenizer and chat template (loaded without weights in this process).
  const model_host& model() const;

  /// Blocking generation from token ids (see serve::generate).
  result<generation> generate(std::span<const int32_t> prompt, gpu::sampling_params params,
                              uint32_t timeout_ms = 60'000);
  /// Blocking generation from text: `prompt` as one user turn through the model's chat template
  /// (raw text when the model has none), the model's end-of-generation tokens as stop tokens.
  /// Returns the generation and its text.
  result<std::pair<generation, std::string>> generate_text(const std::string& prompt,
                                                           gpu::sampling_params params,
                                                           uint32_t timeout_ms = 60'000);

  /// Stops the supervisor (and so the workers), then the router. Idempotent; the destructor
  /// calls it.
  void stop();

 private:
  engine_pool() = default;
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace weft::serve
