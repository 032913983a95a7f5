// Linked into `weft_test` only: the node command's hook for extra roles registers the test roles.

#include "apps/commands.hpp"
#include "tests/support/test_roles.hpp"

#include <cstdlib>
#include <cstring>

#include "actors/rl/rollout_agent.hpp"
#include "actors/serve/router.hpp"

namespace weft::apps {

namespace {
// The deliberately broken build of the chaos test: $WEFT_TEST_DROP_TOKEN_ON_MIGRATION=1 makes this
// binary's router drop a token of every migrated stream (actors/serve/router.hpp).
const bool broken_router = [] {
  const char* v = std::getenv("WEFT_TEST_DROP_TOKEN_ON_MIGRATION");
  const bool on = v != nullptr && std::strcmp(v, "1") == 0;
  if (on) serve::test_hooks::drop_token_on_migration = true;
  return on;
}();
// $WEFT_TEST_CORRUPT_ROUTES=N: this binary's rollout agents send N outputs with an invalid expert
// id in their routes (actors/rl/rollout_agent.hpp), per node process.
const int corrupt_routes = [] {
  const char* v = std::getenv("WEFT_TEST_CORRUPT_ROUTES");
  const int n = v != nullptr ? std::atoi(v) : 0;
  rl::test_hooks::corrupt_routes = n;
  return n;
}();
}  // namespace

void add_extra_roles(actors::role_registry& roles) {
  testing::add_test_roles(roles);
}

}  // namespace weft::apps
