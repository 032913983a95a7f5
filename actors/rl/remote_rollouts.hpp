#pragma once
/// The controller side of `weft rl --agents N` (docs/rl.md, "Rollout agents"): a rollout backend
/// whose engines are rollout agents in other processes. A CAF actor (the controller, published for
/// the agents) turns their messages into events; the GRPO loop's thread consumes them in add /
/// poll / publish, so the loop stays a plain synchronous class.
///
/// - Dispatch: a batch's groups (the samples of one prompt stay together) are placed on the ready
///   agents longest-predicted-first onto the least-loaded agent (rl::place_longest_first, lengths
///   from an online rl::length_ranker), or round-robin; each agent starts its longest first.
/// - Weights: publish() copies the trainer's tensors into a registered f32 image, offers it to
/// every
///   live agent and waits (bounded) until each has pulled and applied it; an agent that does not
///   acknowledge in time, or fails to, is stopped (its supervisor restarts it). An agent that says
///   hello later is offered the current version and gets no rollout before it acknowledges.
///   A joining agent pulls the current version from a live peer agent that holds it (its pull
///   buffer), falling back to the controller when that fails. With weight_fanout F > 0 a version
///   leaves the controller F times and spreads through the agents as a tree.
/// - Failures: when an agent dies, each of its unfinished rollouts moves to a live agent with the
///   tokens generated so far, which it replays (decode numerics, the seeded sampler skips the draws
///   they used) and continues: the same tokens an undisturbed run gives. Nothing is lost or counted
///   twice; outputs of a lost agent that arrive late are dropped.
/// - Tail consolidation (consolidate_tail > 0): a step's last rollouts move the same way off the
///   agents holding the fewest, which are then free.

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "gpu/rl/rollout_backend.hpp"
#include "gpu/train/moe_ops.hpp"
#include "schema/status.hpp"

namespace weft::rl {

struct remote_rollouts_config {
  int agents = 2;
  /// How long an agent may take to pull and apply a weight version.
  uint32_t weight_timeout_ms = 60'000;
  /// true: longest-predicted-first onto the least-loaded agent; false: round-robin.
  bool length_aware = true;
  /// Tail consolidation (RLHFuse's inter-stage fusion; 0: off): once the ready agents' unfinished
  /// rollouts fit on half of the agents that hold them, at most this many an agent
  /// (rl::consolidation_targets), the others' rollouts move there — aborted where they run,
  /// replayed with their tokens so far — and the freed agents take the next rollouts (or leave
  /// their cores to the trainer).
  int64_t consolidate_tail = 0;
  /// --weight-fanout F (0: every agent pulls each version from the controller at once): F agents
  /// pull a new version from the controller's image, the others from agents that already hold
  /// it (their pull buffers), at most F pulls at a time from each — a tree through the agents —
  /// so the version leaves the trainer's process F times, not once per agent.
  int weight_fanout = 0;
  /// How long rollouts may wait with no ready agent before poll() fails.
  uint32_t no_agent_timeout_ms = 180'000;
  /// Called about every 100 ms while waiting (e.g. to relaunch dead node processes).
  std::function<void()> on_idle;
  /// Routing replay: the routes an agent's outputs carry (layers x experts used ids per
  /// position); an output whose routes do not fit it is malformed (its agent restarts). All zero:
  /// outputs carry no routes.
  gpu::train::route_shape routes;
  /// Parameters of the controller's UCX engine (e.g. "ucx.tls" = "tcp" across namespaces).
  std::map<std::string, std::string> transport_params;
};

class remote_rollouts final : public gpu::rl::rollout_backend {
 public:
  static result<std::unique_ptr<remote_rollouts>> create(caf::actor_system& sys,
                                                         remote_rollouts_config cfg);
  ~remote_rollouts() override;

  /// The controller actor: publish it for the agents.
  caf::actor controller() const;
  /// The agents as the controller saw them at its last look (JSON: weight_version, rollouts_live,
  /// rollouts_waiting, agents_lost, rollouts_moved, rollouts_consolidated, peer_weight_pulls,
  /// and per agent: agent,
  /// state ready|syncing|down, pid, rollouts, load, pulled_version). Any thread.
  std::string status_json() const;
  /// Waits until every agent of the run has said hello and holds the current weights.
  status wait_ready(uint32_t timeout_ms);
  gpu::rl::rollout_backend_stats stats() const override;
  /// Stops the controller actor and drops every actor handle (call it while the actor system
  /// lives; the destructor does if nobody did). The backend is unusable after it.
  void shutdown();

  gpu::status add(std::vector<gpu::rl::rollout_request> requests) override;
  gpu::status abort(gpu::request_id id) override;
  gpu::result<std::vector<gpu::rl::rollout_output>> poll() override;
  bool has_work() const override;
  gpu::status publish(int64_t version, std::span<const gpu::rl::named_weights> tensors) override;

  struct impl;

 private:
  explicit remote_rollouts(std::unique_ptr<impl> d);
  std::unique_ptr<impl> d_;
};

}  // namespace weft::rl
