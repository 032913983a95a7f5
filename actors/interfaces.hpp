#pragma once
/// The typed protocols of weft's runtime actors. Every body is a schema::envelope (Cap'n Proto);
/// actor handles travel next to it where a reply must name an actor.
///
/// Include this header only in TUs that define or talk to these actors: it pulls in CAF.

#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <string>

#include "actors/atoms.hpp"
#include "schema/caf_bridge.hpp"

namespace weft::actors {

using schema::envelope;

/// The node agent: one per process. Spawns and stops role actors on request, reports status.
/// Every spawn/stop request carries a token made with the cluster secret (see actors/auth.hpp).
using node_agent_actor = caf::typed_actor<
    // SpawnRequest -> SpawnReply (or Error) and the new actor (invalid on error).
    caf::replies_to<spawn_atom, envelope>::with<envelope, caf::actor>,
    // StopRequest -> SpawnReply with ok / Error.
    caf::replies_to<stop_atom, envelope>::with<envelope>,
    // -> NodeStatus.
    caf::replies_to<status_atom>::with<envelope>,
    // TransportFaults (signed) -> the applied TransportFaults, or Error (the node's transport is
    // not the fault-injecting decorator).
    caf::replies_to<fault_atom, envelope>::with<envelope>,
    // Ping -> Ping (echo; round-trip measurement).
    caf::replies_to<ping_atom, envelope>::with<envelope>,
    // The head handle after a successful join (sent by the app; the agent starts heartbeats).
    caf::reacts_to<join_atom, caf::actor>,
    // -> the sentinel actor that the head monitors.
    caf::replies_to<sentinel_atom>::with<caf::actor>, caf::reacts_to<tick_atom>>;

/// The head: cluster membership (authenticated join), failure detection (sentinel monitors +
/// heartbeats), the cluster-wide name registry, placement of spawns on live nodes, supervisors.
using head_actor = caf::typed_actor<
    // -> JoinChallenge (a fresh nonce).
    caf::replies_to<challenge_atom>::with<envelope>,
    // JoinRequest, the node agent, its sentinel -> JoinReply.
    caf::replies_to<join_atom, envelope, caf::actor, caf::actor>::with<envelope>,
    // Heartbeat from a node.
    caf::reacts_to<heartbeat_atom, envelope>,
    // SpawnRequest -> placed on a live node: SpawnReply/Error and the actor.
    caf::replies_to<spawn_atom, envelope>::with<envelope, caf::actor>,
    // SupervisorSpec -> SpawnReply/Error once every child started, and the supervisor.
    caf::replies_to<supervise_atom, envelope>::with<envelope, caf::actor>,
    // -> ClusterStatus.
    caf::replies_to<status_atom>::with<envelope>,
    // An actor status change reported by a supervisor (e.g. failed).
    caf::reacts_to<status_atom, envelope>,
    // Registry lookup by name -> actor (invalid if unknown).
    caf::replies_to<lookup_atom, std::string>::with<caf::actor>, caf::reacts_to<tick_atom>>;

}  // namespace weft::actors
