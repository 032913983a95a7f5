// A head and two worker node processes on loopback: join, status, remote spawn and messaging.

#include "tests/support/local_cluster.hpp"

#include <set>

namespace weft::testing {
namespace {

TEST(cluster, nodes_join_and_report_status) {
  local_cluster cluster;
  ASSERT_TRUE(eventually([&] { return cluster.node_state("node-2") == "alive"; }, 5000));
  auto env = cluster.status();
  auto v = env.read<schema::wire::ClusterStatus>();
  ASSERT_TRUE(v.ok());
  ASSERT_EQ(v->get().getNodes().size(), 3u);
  std::set<uint32_t> pids;
  for (auto n : v->get().getNodes()) {
    EXPECT_EQ(n.getState(), schema::wire::NodeState::ALIVE);
    EXPECT_STREQ(n.getNode().getHost().cStr(), "127.0.0.1");
    EXPECT_GT(n.getNode().getPort(), 0u);
    EXPECT_GT(n.getNode().getRoles().size(), 0u);
    pids.insert(n.getNode().getPid());
  }
  EXPECT_EQ(pids.size(), 3u) << "three distinct processes";
  EXPECT_EQ(pids.count(static_cast<uint32_t>(cluster.process(1).pid())), 1u);
  // The CLI shows the same, as JSON.
  auto cli = apps::child_process::start({WEFT_BIN, "cluster", "status", "--json", "--head",
                                         "127.0.0.1:" + std::to_string(cluster.port())});
  ASSERT_TRUE(cli.ok());
  std::string out;
  while (auto line = cli->read_line(5000)) out += *line + "\n";
  EXPECT_NE(out.find("\"node-1\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"alive\""), std::string::npos) << out;
}

TEST(cluster, spawns_actors_on_remote_nodes_and_messages_them) {
  local_cluster cluster;
  auto& sys = cluster.system();
  std::set<std::string> hosts;
  for (int i = 0; i < 3; ++i) {
    std::string name = "echo-" + std::to_string(i);
    auto a = actors::spawn_on_cluster(sys, cluster.head(), cluster.secret(), "echo", name);
    ASSERT_TRUE(a.ok()) << a.err().to_string();
    EXPECT_TRUE(cluster.ping(*a, 100 + i));
    hosts.insert(cluster.node_of(name));
    auto looked_up = actors::lookup_on_cluster(sys, cluster.head(), name);
    ASSERT_TRUE(looked_up.ok());
    EXPECT_TRUE(cluster.ping(*looked_up, 200 + i));
  }
  EXPECT_EQ(hosts.size(), 3u) << "least-loaded placement spreads actors over the nodes";
  auto missing = actors::spawn_on_cluster(sys, cluster.head(), cluster.secret(), "no-such-role", "x");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.err().code, errc::unavailable);
}

TEST(cluster, a_client_without_the_secret_cannot_spawn) {
  local_cluster cluster;
  auto a = actors::spawn_on_cluster(cluster.system(), cluster.head(),
                                    actors::cluster_secret{"wrong-secret-but-long-enough"}, "echo",
                                    "intruder");
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.err().code, errc::unauthorized);
  EXPECT_EQ(cluster.node_of("intruder"), "");
}

}  // namespace
}  // namespace weft::testing
