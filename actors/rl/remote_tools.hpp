#pragma once
/// Tool workers (`weft rl --tools ... --tool-workers K`, docs/rl.md "Agentic rollouts"): the tools
/// of agentic rollouts run on other nodes. Each worker (role "tool_worker") runs the run's tools as
/// tool_actors on its node — built-ins with their latency, programs of your own (restarted there
/// when they crash or hang), endpoints — and answers the calls the run's controller sends it.
///
/// The controller side (remote_tools) is the GRPO loop's gpu::rl::tool_backend: each call goes to
/// the live worker with the fewest calls in flight (ties in turn). A worker that dies (its node
/// SIGKILLed, its link cut) or does not answer a call within its deadline is stopped — its
/// supervisor restarts it — and its calls go to another worker (or wait for the restarted one): a
/// tool's result being a function of the call, nothing changes in the run. With no worker for
/// `no_worker_timeout_ms`, a call's result is an error, as from a tool that failed. Only workers
/// that said hello are obeyed, and a worker only the controller it said hello to.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "actors/rl/tool_actors.hpp"
#include "gpu/rl/tools.hpp"
#include "schema/status.hpp"

namespace weft::actors {
class role_registry;
}

namespace weft::rl {

struct tool_worker_config {
  int worker = 0;
  tool_actors_config tools;  ///< what each worker runs (as the run would in its own process)
  std::string controller_host = "127.0.0.1";
  uint16_t controller_port = 0;

  std::string to_json() const;
  static result<tool_worker_config> from_json(const std::string& json);
};

/// Registers the "tool_worker" role.
void add_tool_worker_role(actors::role_registry& roles);

struct remote_tools_config {
  int workers = 1;
  std::vector<std::string> tools;  ///< the enabled tools (a call to another is refused)
  /// One call's deadline on its worker, the worker's own retries included.
  uint32_t call_timeout_ms = 60'000;
  /// How long a call may wait with no live worker before its result is an error.
  uint32_t no_worker_timeout_ms = 120'000;
  /// Called about every 100 ms while waiting (e.g. to relaunch dead node processes).
  std::function<void()> on_idle;
};

class remote_tools final : public gpu::rl::tool_backend {
 public:
  static result<std::unique_ptr<remote_tools>> create(caf::actor_system& sys,
                                                      remote_tools_config cfg);
  ~remote_tools() override;
  remote_tools(const remote_tools&) = delete;
  remote_tools& operator=(const remote_tools&) = delete;

  /// The controller actor: publish it for the workers.
  caf::actor controller() const;
  /// Waits until every worker runs its tools (or one could not start them: its error).
  status wait_ready(uint32_t timeout_ms);

  /// The loop's thread only (one thread at a time).
  gpu::status call(uint64_t id, gpu::rl::tool_call c) override;
  std::vector<gpu::rl::tool_result> ready(bool wait) override;
  int64_t pending() const override;
  int64_t calls() const override;

  /// Workers lost (died, stopped) and calls sent again since the start. Any thread.
  int64_t workers_lost() const;
  int64_t resent() const;
  /// JSON: per worker {worker, state ready|down, pid, calls}, pending, and the counters. Any
  /// thread.
  std::string status_json() const;
  /// Stops the controller actor (call it while the actor system lives; the destructor does).
  void shutdown();

  struct impl;

 private:
  explicit remote_tools(std::unique_ptr<impl> d);
  std::unique_ptr<impl> d_;
};

}  // namespace weft::rl
