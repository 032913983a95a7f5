#pragma once
/// The KL reference on nodes of its own (`weft rl --reference-workers K`, docs/rl.md "KL to the
/// reference"): each worker (role "rl_reference") loads the starting model on its node and
/// computes the log-probs of the batches the run's controller sends it — the frozen reference
/// policy leaves the trainer's process, its memory and its cores.
///
/// The controller side (remote_reference) is a gpu::rl::reference_policy: it spreads a call's
/// batches over the live workers and waits for every one. A worker that dies (its node SIGKILLed,
/// its link cut) or does not answer within its deadline is stopped — its supervisor restarts it —
/// and its batches go to another worker (or wait for the restarted one): the reference being a
/// function of its inputs, the run continues bit for bit. A worker whose model does not load ends
/// the run with its error. Only workers that said hello are obeyed, and a worker only the
/// controller it said hello to.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "gpu/rl/reference.hpp"
#include "schema/status.hpp"

namespace weft::actors {
class role_registry;
}

namespace weft::rl {

struct reference_worker_config {
  int worker = 0;
  std::string model_path;  ///< the starting model, at this path on the worker's node
  int threads = 1;         ///< the worker's compute threads
  float temperature = 1.0f;
  /// Where the forward runs: "cpu" (the host path), or a device by name — cpu:0, cuda, cuda:N —
  /// the `weft rl --device` of the run, so that the workers give the in-process reference's bits.
  std::string device = "cpu";
  std::string controller_host = "127.0.0.1";
  uint16_t controller_port = 0;

  std::string to_json() const;
  static result<reference_worker_config> from_json(const std::string& json);
};

/// Registers the "rl_reference" role.
void add_reference_worker_role(actors::role_registry& roles);

struct remote_reference_config {
  int workers = 1;
  /// One batch's deadline on its worker.
  double batch_timeout_s = 300.0;
  /// How long a call may wait with no live worker before it fails.
  uint32_t no_worker_timeout_ms = 120'000;
  /// Called about every 100 ms while waiting (e.g. to relaunch dead node processes).
  std::function<void()> on_idle;
};

class remote_reference final : public gpu::rl::reference_policy {
 public:
  static result<std::unique_ptr<remote_reference>> create(caf::actor_system& sys,
                                                          remote_reference_config cfg);
  ~remote_reference() override;
  remote_reference(const remote_reference&) = delete;
  remote_reference& operator=(const remote_reference&) = delete;

  /// The controller actor: publish it for the workers.
  caf::actor controller() const;
  /// Waits until every worker has loaded its model (or one failed to: its error).
  status wait_ready(uint32_t timeout_ms);
  /// Blocks; called from one thread at a time.
  gpu::result<std::vector<std::vector<float>>> logprobs(
      std::span<const gpu::train::train_batch* const> batches) override;
  bool runs_elsewhere() const override { return true; }
  /// Workers lost (died, stopped) and batches sent again since the start.
  int64_t workers_lost() const;
  int64_t batches_resent() const;
  /// JSON: per worker {worker, state ready|down, pid, batches}, and the counters. Any thread.
  std::string status_json() const;
  /// Stops the controller actor (call it while the actor system lives; the destructor does).
  void shutdown();

  struct impl;

 private:
  explicit remote_reference(std::unique_ptr<impl> d);
  std::unique_ptr<impl> d_;
};

}  // namespace weft::rl
