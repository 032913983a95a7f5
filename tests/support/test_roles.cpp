#include "tests/support/test_roles.hpp"

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/atoms.hpp"
#include "schema/caf_bridge.hpp"

namespace weft::actors {
result<caf::actor> spawn_blob_role(caf::actor_system& sys, const role_context& ctx);
}  // namespace weft::actors

namespace weft::testing {

namespace {

caf::behavior crasher_actor(caf::event_based_actor* self, uint64_t after_ms) {
  self->delayed_send(self, std::chrono::milliseconds(after_ms), actors::shutdown_atom::value);
  return {
      [self](actors::shutdown_atom) { self->quit(caf::sec::runtime_error); },
      [](actors::ping_atom, const schema::envelope& e) { return e; },
  };
}

}  // namespace

void add_test_roles(actors::role_registry& roles) {
  roles.add("blob", actors::spawn_blob_role);
  roles.add("crasher",
            [](caf::actor_system& sys, const actors::role_context& ctx) -> result<caf::actor> {
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

}  // namespace weft::testing
