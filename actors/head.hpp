#pragma once
/// The head actor: the cluster's membership, failure detector, name registry and placement.
///
/// - Join: a node asks for a challenge (random nonce) and answers with HMAC(secret, nonce|node id);
///   a wrong proof is refused and logged.
/// - Failure detection: the head monitors each node's sentinel actor (SIGKILL closes the TCP
///   connection: detected in milliseconds) and tracks heartbeats (a hung node stops sending them:
///   suspect after `suspect_after_ms`, dead after `dead_after_ms`). A dead node's actors leave the
///   registry and supervisors are told (node_down_atom) so they restart children on survivors.
/// - Placement: spawn requests go to the live node that accepts the role with the fewest actors.

#include <cstdint>
#include <string>

#include "actors/auth.hpp"
#include "actors/interfaces.hpp"

namespace weft::actors {

struct head_config {
  std::string head_id = "head";  ///< node::start names it after the head's node
  cluster_secret secret;
  uint32_t heartbeat_interval_ms = 200;
  uint32_t suspect_after_ms = 600;
  uint32_t dead_after_ms = 1'500;
  uint64_t spawn_timeout_ms = 10'000;
  size_t max_events = 256;
};

head_actor spawn_head(caf::actor_system& sys, head_config cfg);

}  // namespace weft::actors
