#pragma once
/// The supervisor actor: starts its children in order through a spawner (a node agent for local
/// children, the head for children placed anywhere in the cluster), monitors them, and applies its
/// restart strategy, intensity limit and backoff (actors/restart_policy.hpp) when one ends. A child
/// on a node that dies is restarted through the spawner, which places it on a live node.
///
/// Protocol (dynamically typed, every body an envelope):
///   (supervise_atom)        -> SupervisorStatus once every child started (or Error)
///   (status_atom)           -> SupervisorStatus
///   (lookup_atom, name)     -> the child's current actor (invalid while restarting)
///   (node_down_atom, node)  -> children on that node are treated as crashed (sent by the head
///                              when heartbeats stop, which can precede CAF's connection timeout)
/// When the intensity limit is hit the supervisor marks itself failed, tells its observer
/// (status_atom, ActorStatus{failed}) and exits with reason "restart intensity exceeded".

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include <string>
#include <vector>

#include "actors/auth.hpp"
#include "actors/restart_policy.hpp"

namespace weft::actors {

struct child_spec {
  std::string name;
  std::string role;
  std::string config_json;
  restart_type restart = restart_type::permanent;
};

struct supervisor_config {
  std::string name = "supervisor";
  restart_strategy strategy = restart_strategy::one_for_one;
  restart_intensity intensity;
  backoff_policy backoff;
  std::vector<child_spec> children;
  /// Understands (spawn_atom, SpawnRequest) -> (envelope, actor): a node agent or the head.
  caf::actor spawner;
  /// Optional: receives (status_atom, ActorStatus) when the supervisor fails.
  caf::actor observer;
  cluster_secret secret;
  uint64_t spawn_timeout_ms = 10'000;
};

caf::actor spawn_supervisor(caf::actor_system& sys, supervisor_config cfg);

}  // namespace weft::actors
