#include "actors/roles.hpp"

#include <caf/all.hpp>

#include "actors/atoms.hpp"
#include "schema/caf_bridge.hpp"

namespace weft::actors {

void role_registry::add(const std::string& role, role_factory factory) {
  factories_[role] = std::move(factory);
}

const role_factory* role_registry::find(const std::string& role) const {
  auto it = factories_.find(role);
  return it == factories_.end() ? nullptr : &it->second;
}

std::vector<std::string> role_registry::names() const {
  std::vector<std::string> out;
  for (const auto& [name, _] : factories_) out.push_back(name);
  return out;
}

namespace {

caf::behavior echo_actor(caf::event_based_actor*) {
  return {
      [](ping_atom, const schema::envelope& e) { return e; },
  };
}

}  // namespace

void add_builtin_roles(role_registry& roles) {
  roles.add("echo", [](caf::actor_system& sys, const role_context&) -> result<caf::actor> {
    return sys.spawn(echo_actor);
  });
}

}  // namespace weft::actors
