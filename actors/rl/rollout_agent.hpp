#pragma once
/// The rollout agent role ("rollout_agent"): one engine of a `weft rl --agents N` run, spawned on
/// a node by the run's supervisor (docs/rl.md, "Rollout agents").
///
/// The actor is detached; its engine loop runs on a thread of its own so that the actor keeps
/// answering while a step computes. The agent loads the model file (the trainer's starting
/// weights, stored as the run's rollout type), says hello to the run's controller with its
/// node's transport address, and then: starts the rollouts the controller sends (a migrated one
/// replays the tokens generated before with decode numerics, so it continues bit for bit), reports
/// every engine step's tokens with the weight version that sampled them, and between two engine
/// steps pulls each offered weight version over the transport (checksummed), writes it into the
/// engine in place and acknowledges it; rollouts in flight continue with the new version. Only
/// the controller it said hello to is obeyed. A failure (a model that does not load, a failed
/// engine step) ends the actor abnormally; its supervisor restarts it and the controller moves its
/// rollouts elsewhere.

#include <atomic>
#include <cstdint>
#include <string>

#include "schema/status.hpp"

namespace weft::actors {
class role_registry;
}

namespace weft::rl {

struct rollout_agent_config {
  std::string model_path;
  int agent = 0;
  std::string weight_type = "f32";  ///< f32, bf16 or f16
  std::string device = "cpu";
  int threads = 1;
  int64_t max_sequences = 64;
  int32_t max_new_tokens = 32;
  int64_t max_running = 0;     ///< rollout_engine_params::max_running (0: max_sequences)
  bool priority = false;       ///< rollout_engine_params::priority
  bool record_routes = false;  ///< rollout_engine_params::record_routes
  std::string controller_host = "127.0.0.1";
  uint16_t controller_port = 0;

  std::string to_json() const;
  static result<rollout_agent_config> from_json(const std::string& json);
};

/// Registers the "rollout_agent" role.
void add_rl_roles(actors::role_registry& roles);

namespace test_hooks {
/// A deliberately broken agent, for showing that the controller checks what agents send: while
/// positive, each output that carries routes gets an expert id out of range and the count drops
/// by one (per node process). The `weft` binary never sets it; the test binary `weft_test` sets it
/// from $WEFT_TEST_CORRUPT_ROUTES (tests/integration/rl/test_rl_cli.py).
extern std::atomic<int> corrupt_routes;
}  // namespace test_hooks

}  // namespace weft::rl
