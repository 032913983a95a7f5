// Supervisors in one process, with a node agent as the spawner: strategies, intensity, backoff.

#include <gtest/gtest.h>
#include <caf/all.hpp>

#include <thread>

#include "actors/node_agent.hpp"
#include "actors/runtime.hpp"
#include "actors/supervisor.hpp"
#include "tests/support/test_roles.hpp"

namespace weft::actors {
namespace {

using namespace std::chrono_literals;

struct supervisor_fixture : ::testing::Test {
  runtime_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  cluster_secret secret{"supervisor-test-secret-0123"};
  node_agent_actor agent;

  void SetUp() override {
    sys = std::make_unique<caf::actor_system>(cfg);
    auto roles = std::make_shared<role_registry>();
    add_builtin_roles(*roles);
    testing::add_test_roles(*roles);
    node_agent_config acfg;
    acfg.node_id = "local";
    acfg.secret = secret;
    acfg.role_table = roles;
    agent = spawn_node_agent(*sys, acfg);
  }
  std::vector<caf::actor> supervisors;
  void TearDown() override {
    for (auto& s : supervisors) caf::anon_send_exit(s, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(agent, caf::exit_reason::user_shutdown);
  }

  caf::actor start(restart_strategy s, std::vector<child_spec> children,
                   restart_intensity intensity = {5, 10'000}) {
    supervisor_config c;
    c.name = "sup";
    c.strategy = s;
    c.intensity = intensity;
    c.backoff = backoff_policy{5, 50, 2.0, 5'000};
    c.children = std::move(children);
    c.spawner = caf::actor_cast<caf::actor>(agent);
    c.secret = secret;
    auto sup = spawn_supervisor(*sys, c);
    supervisors.push_back(sup);
    caf::scoped_actor self{*sys};
    bool started = false;
    self->request(sup, 10s, supervise_atom::value)
        .receive([&](const schema::envelope& e) { started = schema::error_from(e).ok(); },
                 [&](caf::error&) {});
    EXPECT_TRUE(started);
    return sup;
  }

  caf::actor child(const caf::actor& sup, const std::string& name) {
    caf::scoped_actor self{*sys};
    caf::actor out;
    self->request(sup, 5s, lookup_atom::value, name)
        .receive([&](caf::actor a) { out = a; }, [&](caf::error&) {});
    return out;
  }

  /// Waits until every child runs again and none of them is `old` (bounded).
  std::vector<caf::actor> wait_children(const caf::actor& sup,
                                        const std::vector<std::string>& names,
                                        const caf::actor& old) {
    for (int i = 0; i < 400; ++i) {
      std::vector<caf::actor> now;
      bool all = true;
      for (const auto& n : names) {
        auto c = child(sup, n);
        all = all && c && c != old;
        now.push_back(c);
      }
      if (all) return now;
      std::this_thread::sleep_for(10ms);
    }
    ADD_FAILURE() << "children did not come back";
    return {};
  }

  /// Polls until every child in `names` is live and differs from its handle in `olds` (a restart
  /// of several children is not atomic: one may already be new while another is still the old).
  std::vector<caf::actor> wait_all_replaced(const caf::actor& sup,
                                            const std::vector<std::string>& names,
                                            const std::vector<caf::actor>& olds) {
    for (int i = 0; i < 400; ++i) {
      std::vector<caf::actor> now;
      bool all = true;
      for (size_t k = 0; k < names.size(); ++k) {
        auto c = child(sup, names[k]);
        all = all && c && c != olds[k];
        now.push_back(c);
      }
      if (all) return now;
      std::this_thread::sleep_for(10ms);
    }
    ADD_FAILURE() << "children were not all replaced";
    return {};
  }

  static std::vector<child_spec> three() {
    return {{"a", "echo", "", restart_type::permanent},
            {"b", "echo", "", restart_type::permanent},
            {"c", "echo", "", restart_type::permanent}};
  }
};

TEST_F(supervisor_fixture, one_for_one_restarts_only_the_dead_child) {
  auto sup = start(restart_strategy::one_for_one, three());
  auto a = child(sup, "a"), b = child(sup, "b"), c = child(sup, "c");
  ASSERT_TRUE(a && b && c);
  caf::anon_send_exit(b, caf::exit_reason::kill);
  auto now = wait_children(sup, {"a", "b", "c"}, b);
  ASSERT_EQ(now.size(), 3u);
  EXPECT_EQ(now[0], a);
  EXPECT_NE(now[1], b);
  EXPECT_EQ(now[2], c);
}

TEST_F(supervisor_fixture, one_for_all_restarts_every_child) {
  auto sup = start(restart_strategy::one_for_all, three());
  auto a = child(sup, "a"), b = child(sup, "b"), c = child(sup, "c");
  caf::anon_send_exit(b, caf::exit_reason::kill);
  auto now = wait_all_replaced(sup, {"a", "b", "c"}, {a, b, c});
  ASSERT_EQ(now.size(), 3u);
  EXPECT_NE(now[0], a);
  EXPECT_NE(now[1], b);
  EXPECT_NE(now[2], c);
}

TEST_F(supervisor_fixture, rest_for_one_restarts_later_children) {
  auto sup = start(restart_strategy::rest_for_one, three());
  auto a = child(sup, "a"), b = child(sup, "b"), c = child(sup, "c");
  caf::anon_send_exit(b, caf::exit_reason::kill);
  // b and c must both be new ("a" is only required to be live here; it is compared below).
  auto now = wait_all_replaced(sup, {"a", "b", "c"}, {caf::actor{}, b, c});
  ASSERT_EQ(now.size(), 3u);
  EXPECT_EQ(now[0], a);
  EXPECT_NE(now[1], b);
  EXPECT_NE(now[2], c);
}

TEST_F(supervisor_fixture, crash_loop_stops_at_the_intensity_limit) {
  supervisor_config c;
  c.name = "looping";
  c.strategy = restart_strategy::one_for_one;
  c.intensity = restart_intensity{3, 60'000};
  c.backoff = backoff_policy{1, 5, 2.0, 60'000};
  c.children = {{"crash", "crasher", R"({"after_ms": 5})", restart_type::permanent}};
  c.spawner = caf::actor_cast<caf::actor>(agent);
  c.secret = secret;
  auto sup = spawn_supervisor(*sys, c);
  caf::scoped_actor self{*sys};
  self->monitor(sup);
  bool down = false;
  std::string reason;
  self->receive(
      [&](caf::down_msg& dm) {
        down = true;
        reason = caf::to_string(dm.reason);
      },
      caf::after(15s) >> [] {});
  EXPECT_TRUE(down) << "supervisor kept restarting a crash-looping child";
  EXPECT_NE(reason.find("intensity"), std::string::npos) << reason;
}

TEST_F(supervisor_fixture, refuses_spawns_without_the_secret) {
  auto req = make_spawn_request(cluster_secret{"not-the-right-secret!"}, 1, "echo", "x", "", 5000);
  caf::scoped_actor self{*sys};
  schema::envelope reply;
  caf::actor spawned;
  self->request(agent, 5s, spawn_atom::value, req)
      .receive(
          [&](schema::envelope e, caf::actor a) {
            reply = std::move(e);
            spawned = a;
          },
          [&](caf::error&) {});
  EXPECT_FALSE(spawned);
  EXPECT_EQ(schema::error_from(reply).code, errc::unauthorized);
}

}  // namespace
}  // namespace weft::actors
