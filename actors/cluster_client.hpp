#pragma once
/// Blocking helpers for programs that drive a cluster from outside an actor: the `weft` app, tests
/// and embedders' main functions. Each call has a timeout; none blocks forever.

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "actors/auth.hpp"
#include "actors/interfaces.hpp"
#include "actors/supervisor.hpp"
#include "schema/envelope.hpp"

namespace weft::actors {

/// Connects to a head published at host:port (mutual TLS; the system must be configured with
/// secure_runtime, actors/runtime.hpp).
result<head_actor> connect_head(caf::actor_system& sys, const std::string& host, uint16_t port);

/// Connects to a node agent published at host:port.
result<node_agent_actor> connect_node_agent(caf::actor_system& sys, const std::string& host,
                                            uint16_t port);

/// Runs the join handshake for `agent` (challenge, proof) and starts its heartbeats.
status join_cluster(caf::actor_system& sys, const head_actor& head, const node_agent_actor& agent,
                    const cluster_secret& secret, uint64_t timeout_ms = 5'000);

/// The head's ClusterStatus.
result<schema::envelope> cluster_status(caf::actor_system& sys, const head_actor& head,
                                        uint64_t timeout_ms = 5'000);

/// Spawns `role` as `name` on a live node chosen by the head. Returns the actor.
result<caf::actor> spawn_on_cluster(caf::actor_system& sys, const head_actor& head,
                                    const cluster_secret& secret, const std::string& role,
                                    const std::string& name, const std::string& config_json = "",
                                    uint64_t timeout_ms = 10'000);

/// Starts a supervisor on the head with `children` placed on live nodes; returns it once every
/// child runs.
result<caf::actor> supervise_on_cluster(caf::actor_system& sys, const head_actor& head,
                                        const cluster_secret& secret, const std::string& name,
                                        restart_strategy strategy, restart_intensity intensity,
                                        backoff_policy backoff,
                                        const std::vector<child_spec>& children,
                                        uint64_t timeout_ms = 30'000);

/// The registered actor `name`, or an error if the head does not know it.
result<caf::actor> lookup_on_cluster(caf::actor_system& sys, const head_actor& head,
                                     const std::string& name, uint64_t timeout_ms = 5'000);

/// ClusterStatus as JSON (what `weft cluster status --json` prints).
std::string cluster_status_json(const schema::envelope& status);

/// ClusterStatus as a human-readable table.
std::string cluster_status_table(const schema::envelope& status);

}  // namespace weft::actors
