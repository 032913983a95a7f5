// Example 4 (docs/chaos.md, "In your own tests"): fault tests of your own with weft::testing.
//
// Both tests start real `weft` processes: set WEFT_BINARY to the weft executable if it is not on
// PATH, and WEFT_MODEL to a GGUF if weft's default model is not fetched.

#include <gtest/gtest.h>

#include <weft/actors/cluster_client.hpp>
#include <weft/testing/chaos.hpp>
#include <weft/testing/local_cluster.hpp>

namespace {

namespace actors = weft::actors;

// A supervised actor survives the SIGKILL of the node it runs on: the head notices the node is
// gone, and the supervisor restarts the actor on a survivor, where it answers again.
TEST(my_cluster, a_supervised_actor_survives_its_node) {
  weft::testing::local_cluster cluster({.nodes = 3});
  auto sup = actors::supervise_on_cluster(cluster.system(), cluster.head(), cluster.secret(),
                                          "mine", actors::restart_strategy::one_for_one,
                                          {5, 10'000}, {50, 500, 2.0, 5'000},
                                          {{"a", "echo", "", actors::restart_type::permanent},
                                           {"b", "echo", "", actors::restart_type::permanent}});
  ASSERT_TRUE(sup.ok()) << sup.error().to_string();
  std::string victim, actor;
  for (const char* name : {"a", "b"}) {
    auto n = cluster.node_of(name);
    if (!n.empty() && n != "node-0") {  // not the head
      victim = n;
      actor = name;
      break;
    }
  }
  ASSERT_FALSE(victim.empty());
  cluster.kill_node(weft::testing::local_cluster::index_of(victim));
  ASSERT_TRUE(cluster.wait_node_state(victim, "dead", 10'000));
  ASSERT_TRUE(weft::testing::eventually(
      [&] {
        auto n = cluster.node_of(actor);
        return !n.empty() && n != victim;
      },
      15'000));
  auto moved = actors::lookup_on_cluster(cluster.system(), cluster.head(), actor);
  ASSERT_TRUE(moved.ok());
  EXPECT_TRUE(cluster.ping(*moved, 1));
}

// weft serve with two workers keeps every invariant while a worker is killed and another stopped
// under load.
class my_serve_chaos : public weft::testing::serve_chaos_test {
 protected:
  std::vector<std::string> serve_args() const override { return {"--workers", "2"}; }
};

TEST_F(my_serve_chaos, survives_a_killed_and_a_stopped_worker) {
  auto r = chaos({"--duration", "12", "--rate", "2", "--max-tokens", "32", "--min-inflight", "0",
                  "--fault", "kill:any@3", "--fault", "stop:any@7+1"});
  EXPECT_TRUE(weft::testing::invariants_hold(r));
  ASSERT_TRUE(r.report.is_object());
  EXPECT_EQ(r.report["faults"].size(), 2u);
  EXPECT_EQ(r.report["counts"]["lost"], 0);
}

}  // namespace
