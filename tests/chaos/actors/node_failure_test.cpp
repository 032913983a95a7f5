// Killing and freezing node processes: detection, reporting, restart of actors on survivors, and
// the intensity limit of a crash-looping child. Detection times are printed, not asserted tightly
// (speed targets live in bench/); the bounds here only catch "never detected".

#include <csignal>

#include "tests/support/local_cluster.hpp"

namespace weft::testing {
namespace {

using clock_type = std::chrono::steady_clock;

bool has_event(local_cluster& c, const std::string& kind, const std::string& subject) {
  auto env = c.status();
  auto v = env.read<schema::wire::ClusterStatus>();
  for (auto e : v->get().getEvents()) {
    if (kind == e.getKind().cStr() && subject == e.getSubject().cStr()) return true;
  }
  return false;
}

TEST(chaos, sigkill_of_a_node_restarts_its_actors_on_a_survivor) {
  local_cluster cluster;
  auto& sys = cluster.system();
  std::vector<actors::child_spec> children = {{"w1", "echo", "", actors::restart_type::permanent},
                                              {"w2", "echo", "", actors::restart_type::permanent},
                                              {"w3", "echo", "", actors::restart_type::permanent}};
  auto sup = actors::supervise_on_cluster(sys, cluster.head(), cluster.secret(), "workers",
                                          actors::restart_strategy::one_for_one, {5, 10'000},
                                          {20, 500, 2.0, 5'000}, children);
  ASSERT_TRUE(sup.ok()) << sup.error().to_string();
  // Kill a worker node (not the head) that hosts one of the children.
  std::string victim, victim_actor;
  for (const auto& c : children) {
    auto n = cluster.node_of(c.name);
    if (!n.empty() && n != "node-0") {
      victim = n;
      victim_actor = c.name;
      break;
    }
  }
  ASSERT_FALSE(victim.empty());
  auto t0 = clock_type::now();
  cluster.process(local_cluster::index_of(victim)).signal(SIGKILL);
  ASSERT_TRUE(eventually([&] { return cluster.node_state(victim) == "dead"; }, 5000));
  auto detected_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - t0).count();
  ASSERT_TRUE(eventually(
      [&] {
        auto n = cluster.node_of(victim_actor);
        return !n.empty() && n != victim;
      },
      10'000));
  auto restarted_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - t0).count();
  std::printf("sigkill: detected after %lld ms, '%s' running on %s after %lld ms\n",
              static_cast<long long>(detected_ms), victim_actor.c_str(),
              cluster.node_of(victim_actor).c_str(), static_cast<long long>(restarted_ms));
  EXPECT_TRUE(has_event(cluster, "node_down", victim));
  auto a = actors::lookup_on_cluster(sys, cluster.head(), victim_actor);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(cluster.ping(*a, 7));
  // The other children were not disturbed (one_for_one) and still answer.
  for (const auto& c : children) {
    auto h = actors::lookup_on_cluster(sys, cluster.head(), c.name);
    ASSERT_TRUE(h.ok()) << c.name;
    EXPECT_TRUE(cluster.ping(*h, 8)) << c.name;
  }
}

TEST(chaos, a_hung_node_is_detected_by_missing_heartbeats) {
  local_cluster cluster;
  auto t0 = clock_type::now();
  cluster.process(2).signal(SIGSTOP);
  bool dead = eventually([&] { return cluster.node_state("node-2") == "dead"; }, 6000);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - t0).count();
  cluster.process(2).signal(SIGCONT);
  ASSERT_TRUE(dead);
  std::printf("sigstop: node-2 declared dead after %lld ms\n", static_cast<long long>(ms));
  EXPECT_TRUE(has_event(cluster, "node_suspect", "node-2") ||
              has_event(cluster, "node_down", "node-2"));
}

TEST(chaos, crash_looping_child_stops_at_the_intensity_limit) {
  local_cluster cluster;
  std::vector<actors::child_spec> children = {
      {"looper", "crasher", R"({"after_ms": 10})", actors::restart_type::permanent}};
  // The supervisor may report the failure before or after it "started": both are fine, what
  // matters is that it stops restarting and the head records it.
  (void)actors::supervise_on_cluster(cluster.system(), cluster.head(), cluster.secret(), "loop-sup",
                                     actors::restart_strategy::one_for_one, {3, 60'000},
                                     {5, 20, 2.0, 60'000}, children, 10'000);
  ASSERT_TRUE(eventually([&] { return has_event(cluster, "actor_failed", "loop-sup"); }, 10'000));
  // No more restarts after giving up.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(cluster.node_of("looper"), "");
  // And the status says so: the child is listed as failed, with its restarts counted.
  auto env = cluster.status();
  auto v = env.read<schema::wire::ClusterStatus>();
  bool listed_failed = false;
  for (auto n : v->get().getNodes()) {
    for (auto a : n.getActors()) {
      if (std::string("looper") == a.getName().cStr()) {
        listed_failed = a.getState() == schema::wire::ActorState::FAILED && a.getRestarts() >= 1;
      }
    }
  }
  EXPECT_TRUE(listed_failed) << "cluster status does not show 'looper' as failed";
  EXPECT_TRUE(has_event(cluster, "actor_restarting", "looper"));
}

TEST(chaos, a_node_with_the_wrong_secret_is_refused) {
  local_cluster cluster({.nodes = 1});
  // stderr (where the refusal is logged) joins stdout.
  auto c = actors::child_process::start({"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1", WEFT_BIN,
                                         "node", "--join",
                                         "127.0.0.1:" + std::to_string(cluster.port()), "--node-id",
                                         "intruder", "--secret", "not-the-cluster-secret-123"});
  ASSERT_TRUE(c.ok());
  std::string out;
  while (auto line = c->read_line(10'000)) out += *line + "\n";
  int status = 0;
  ASSERT_TRUE(eventually([&] { return c->exited(&status); }, 10'000));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0);
  EXPECT_EQ(cluster.node_state("intruder"), "");
  // Refused at the TLS handshake (docs/security.md), before any join message reached the head.
  EXPECT_NE(out.find("check the cluster secret"), std::string::npos) << out;
}

}  // namespace
}  // namespace weft::testing
