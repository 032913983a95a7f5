#pragma once
/// The role table of a node: role name -> factory that spawns a local actor of that role.
/// Apps and embedders add their own roles (engine worker, cache shard, ...) next to the built-ins.

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "actors/auth.hpp"
#include "schema/status.hpp"

namespace weft::transport {
class engine;
}

namespace weft::actors {

/// What a role factory gets to build its actor.
struct role_context {
  std::string name;         ///< registry name of the new actor
  std::string config_json;  ///< role-specific settings
  std::string node_id;      ///< the node it runs on
  /// The node's data-plane engine (shared by every role on the node); may be null when the node
  /// runs without one (`--transport none`).
  std::shared_ptr<transport::engine> engine;
  /// The cluster secret, for roles that authenticate to actors outside the node protocol (an
  /// engine worker signing its hello to the router).
  cluster_secret secret;
};

using role_factory = std::function<result<caf::actor>(caf::actor_system&, const role_context&)>;

/// Role name -> factory. Not thread-safe: fill it before the node agent starts.
class role_registry {
 public:
  void add(const std::string& role, role_factory factory);
  const role_factory* find(const std::string& role) const;
  std::vector<std::string> names() const;

 private:
  std::map<std::string, role_factory> factories_;
};

/// Adds weft's built-in roles:
/// - "echo": answers (ping_atom, envelope) with the same envelope (measurement, tests);
/// - "crasher": fails after `{"after_ms": N}` (default 0) — exercises supervision;
/// - "blob": owns `{"size_bytes": N, "seed": S}` bytes of registered memory; answers
///   (region_atom) with a TransferRequest describing them (descriptor, checksum) and pulls another
///   blob's bytes on (transfer_atom, TransferRequest) over the node's transport, verifying the
///   checksum — the data-plane path of KV and weight transfers, exercised end to end.
void add_builtin_roles(role_registry& roles);

}  // namespace weft::actors
