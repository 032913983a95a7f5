#pragma once
/// Reward workers (`weft rl --reward-workers K`, docs/rl.md "Rewards from your own program"): the
/// user's reward program runs on other nodes. Each worker (role "reward_worker") runs the program
/// on its node — `procs` copies (gpu::rl::reward_process_pool), each restarted there when it
/// crashes or hangs, its unanswered samples sent again — and scores the parts the run's controller
/// sends it, each split over the copies.
///
/// The controller side (remote_rewards) splits a batch over the live workers and waits for every
/// part. A worker that dies (its node SIGKILLed, its link cut) or does not answer within its
/// deadline is stopped — its supervisor restarts it — and its parts are scored again by another
/// worker: nothing is lost and, rewards being a function of the sample, nothing changes. An
/// answer that is not a reward fails the batch with an error naming the sample, never a silent 0.
/// Only workers that said hello are obeyed, and a worker only the controller it said hello to.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "gpu/rl/reward_process.hpp"
#include "schema/status.hpp"

namespace weft::actors {
class role_registry;
}

namespace weft::rl {

struct reward_worker_config {
  int worker = 0;
  std::string command;  ///< run with /bin/sh -c on the worker's node
  int procs = 1;        ///< copies of it; a part is split over them (1..64)
  double timeout_s = 60.0;
  int max_restarts = 3;
  std::string controller_host = "127.0.0.1";
  uint16_t controller_port = 0;

  std::string to_json() const;
  static result<reward_worker_config> from_json(const std::string& json);
};

/// Registers the "reward_worker" role.
void add_reward_worker_role(actors::role_registry& roles);

struct remote_rewards_config {
  int workers = 1;
  /// One part's deadline: what its worker may take, restarts of the program included.
  double part_timeout_s = 300.0;
  /// How long a batch may wait with no live worker before it fails.
  uint32_t no_worker_timeout_ms = 120'000;
  /// Called about every 100 ms while waiting (e.g. to relaunch dead node processes).
  std::function<void()> on_idle;
};

class remote_rewards {
 public:
  static result<std::unique_ptr<remote_rewards>> create(caf::actor_system& sys,
                                                        remote_rewards_config cfg);
  ~remote_rewards();
  remote_rewards(const remote_rewards&) = delete;
  remote_rewards& operator=(const remote_rewards&) = delete;

  /// The controller actor: publish it for the workers.
  caf::actor controller() const;
  /// Waits until every worker has said hello.
  status wait_ready(uint32_t timeout_ms);
  /// The rewards of `items`, in order. Blocks; called from one thread at a time.
  gpu::result<std::vector<double>> score(std::span<const gpu::rl::reward_request> items);
  /// Workers lost (died, stopped) and parts scored again since the start.
  int64_t workers_lost() const;
  int64_t parts_rescored() const;
  /// JSON: per worker {worker, state ready|down, pid, parts}, and the counters. Any thread.
  std::string status_json() const;
  /// Stops the controller actor (call it while the actor system lives; the destructor does).
  void shutdown();

  struct impl;

 private:
  explicit remote_rewards(std::unique_ptr<impl> d);
  std::unique_ptr<impl> d_;
};

}  // namespace weft::rl
