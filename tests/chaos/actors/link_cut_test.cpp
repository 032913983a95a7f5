// A local cluster whose nodes live in their own network namespaces (weft cluster up --netns):
// cutting one node's link is detected through missing heartbeats, like a network partition.

#include <unistd.h>

#include <csignal>

#include "tests/support/local_cluster.hpp"

namespace weft::testing {
namespace {

TEST(chaos, a_cut_link_is_detected) {
  if (::geteuid() != 0 || std::system("ip netns list >/dev/null 2>&1") != 0) {
    GTEST_SKIP() << "needs root and iproute2 to create network namespaces";
  }
  uint16_t port = free_port();
  auto up =
      actors::child_process::start({WEFT_BIN, "cluster", "up", "--netns", "-n", "3", "--port",
                                    std::to_string(port), "--secret", "netns-test-secret-0123456"});
  ASSERT_TRUE(up.ok());
  std::string head;
  for (int i = 0; i < 20 && head.empty(); ++i) {
    auto line = up->read_line(20'000);
    if (!line) break;
    if (line->rfind("weft-cluster-ready head=", 0) == 0) {
      head = line->substr(24, line->find(' ', 24) - 24);
    }
  }
  ASSERT_FALSE(head.empty()) << "cluster did not come up";
  auto host = head.substr(0, head.find(':'));
  auto rt = actors::secure_runtime({}, actors::cluster_secret{"netns-test-secret-0123456"});
  ASSERT_TRUE(rt.ok()) << rt.error().to_string();
  actors::runtime_config cfg{*rt};
  caf::actor_system sys{cfg};
  auto h = actors::connect_head(sys, host, port);
  ASSERT_TRUE(h.ok()) << h.error().to_string();
  auto state = [&](const std::string& id) {
    auto st = actors::cluster_status(sys, *h);
    if (!st) return std::string{};
    auto v = st->read<schema::wire::ClusterStatus>();
    for (auto n : v->get().getNodes()) {
      if (id == n.getNode().getNodeId().cStr()) {
        return std::string(n.getState() == schema::wire::NodeState::DEAD ? "dead" : "up");
      }
    }
    return std::string{};
  };
  ASSERT_TRUE(eventually([&] { return state("node-2") == "up"; }, 5000));
  std::string veth = "wv" + std::to_string(up->pid()) + "n2";
  auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(std::system(("ip link set " + veth + " down").c_str()), 0);
  bool dead = eventually([&] { return state("node-2") == "dead"; }, 8000);
  auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  EXPECT_TRUE(dead);
  std::printf("link cut: node-2 declared dead after %lld ms\n", static_cast<long long>(ms));
  EXPECT_EQ(state("node-1"), "up");
  up->signal(SIGTERM);
  int status = 0;
  EXPECT_TRUE(eventually([&] { return up->exited(&status); }, 10'000));
  EXPECT_TRUE(eventually(
      [&] { return std::system(("ip link show " + veth + " >/dev/null 2>&1").c_str()) != 0; },
      5000))
      << "namespaces and links are removed when the cluster stops";
}

}  // namespace
}  // namespace weft::testing
