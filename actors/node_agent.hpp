#pragma once
/// The node agent: one per process. Owns the process's role table (and, through its roles, its
/// devices and transport endpoint), spawns and stops role actors on authenticated requests, keeps a
/// sentinel actor whose death tells the head that this node is gone, and sends heartbeats.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "actors/auth.hpp"
#include "actors/interfaces.hpp"
#include "actors/roles.hpp"
#include "actors/signed_requests.hpp"

namespace weft::actors {

struct node_agent_config {
  std::string node_id;
  std::string host = "127.0.0.1";
  /// Where the agent is published (reported in status); shared because it is known only after
  /// the agent has been spawned and published.
  std::shared_ptr<std::atomic<uint16_t>> port = std::make_shared<std::atomic<uint16_t>>(0);
  std::vector<std::string> roles;  ///< roles accepted here; empty = every role in the table
  cluster_secret secret;
  uint32_t heartbeat_interval_ms = 200;
  std::shared_ptr<const role_registry> role_table;
  std::string transport_address;              ///< data-plane endpoint (bytes), reported in NodeInfo
  std::shared_ptr<transport::engine> engine;  ///< handed to every role actor
  std::string build_version;
};

/// Spawns a node agent and its sentinel. The agent starts heartbeats once it receives
/// (join_atom, head) after a successful join.
node_agent_actor spawn_node_agent(caf::actor_system& sys, node_agent_config cfg);

/// The sentinel of an agent (the actor the head monitors). Blocking request; for apps and tests.
caf::actor sentinel_of(caf::actor_system& sys, const node_agent_actor& agent);

}  // namespace weft::actors
