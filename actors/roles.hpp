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
/// - "echo": answers (ping_atom, envelope) with the same envelope (round-trip measurement).
/// The serving roles come from serve::add_serve_roles and cache::add_cache_roles. Roles that exist
/// only to test the runtime ("crasher", "blob") live in tests/support and are registered only by
/// the test build of the binary (`weft_test`), never by `weft`.
void add_builtin_roles(role_registry& roles);

}  // namespace weft::actors
