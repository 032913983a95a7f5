// Linked into `weft_test` only: the node command's hook for extra roles registers the test roles.

#include "apps/commands.hpp"
#include "tests/support/test_roles.hpp"

namespace weft::apps {

void add_extra_roles(actors::role_registry& roles) {
  testing::add_test_roles(roles);
}

}  // namespace weft::apps
