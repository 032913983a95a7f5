#include "actors/roles.hpp"

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

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

result<caf::actor> spawn_blob_role(caf::actor_system& sys, const role_context& ctx);

namespace {

caf::behavior echo_actor(caf::event_based_actor*) {
  return {
      [](ping_atom, const schema::envelope& e) { return e; },
  };
}

caf::behavior crasher_actor(caf::event_based_actor* self, uint64_t after_ms) {
  self->delayed_send(self, std::chrono::milliseconds(after_ms), shutdown_atom::value);
  return {
      [self](shutdown_atom) { self->quit(caf::sec::runtime_error); },
      [](ping_atom, const schema::envelope& e) { return e; },
  };
}

}  // namespace

void add_builtin_roles(role_registry& roles) {
  roles.add("blob", spawn_blob_role);
  roles.add("echo", [](caf::actor_system& sys, const role_context&) -> result<caf::actor> {
    return sys.spawn(echo_actor);
  });
  roles.add("crasher", [](caf::actor_system& sys, const role_context& ctx) -> result<caf::actor> {
    uint64_t after_ms = 0;
    if (!ctx.config_json.empty()) {
      auto cfg = nlohmann::json::parse(ctx.config_json, nullptr, false);
      if (cfg.is_discarded() || !cfg.is_object()) {
        return make_error(errc::invalid_argument, "crasher: config is not a JSON object");
      }
      after_ms = cfg.value("after_ms", uint64_t{0});
    }
    return sys.spawn(crasher_actor, after_ms);
  });
}

}  // namespace weft::actors
