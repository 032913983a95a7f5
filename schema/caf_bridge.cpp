#include "schema/caf_bridge.hpp"

#include <caf/all.hpp>

namespace weft::schema {

void add_message_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<envelope>("weft.envelope");
}

}  // namespace weft::schema
