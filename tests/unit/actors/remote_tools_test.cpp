// The controller of `weft rl --tool-workers` (actors/rl/remote_tools.hpp) against workers of the
// test's own: every call is answered once with its result; a worker that dies with calls in
// flight, answers a message of another kind, or answers nothing by the deadline is stopped and
// its calls go to another; with no worker left a call's result is an error; a worker that could
// not start its tools fails the start with its error; the worker's configuration round-trips.
// (The real role runs in tests/integration/rl/test_rl_tools.py.)
#include <gtest/gtest.h>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "actors/rl/remote_tools.hpp"
#include "actors/rl/rl_atoms.hpp"
#include "schema/caf_bridge.hpp"

namespace weft::rl {
namespace {

using schema::envelope;
namespace wire = schema::wire;

enum class manner { good, other_kind, silent, dies_on_call, no_tools };

/// A worker of the test: the result of a call is "<tool>(<args>)".
caf::behavior fake_worker(caf::event_based_actor* self, caf::actor ctrl, int worker, manner m) {
  caf::send_as(caf::actor_cast<caf::actor>(self), ctrl, tw_hello_atom::value,
               envelope::build<wire::ToolWorkerHello>([&](wire::ToolWorkerHello::Builder b) {
                 b.setWorker(static_cast<uint32_t>(worker));
                 b.setPid(static_cast<uint32_t>(::getpid()));
                 if (m == manner::no_tools) b.setError("tool search: no such program");
               }));
  return {[self, m](tw_call_atom, const envelope& env) {
    auto c = env.read<wire::ToolCallMsg>();
    if (!c || m == manner::silent) return;
    if (m == manner::dies_on_call) {
      self->quit(caf::exit_reason::kill);
      return;
    }
    auto to = caf::actor_cast<caf::actor>(self->current_sender());
    if (m == manner::other_kind) {
      caf::send_as(caf::actor_cast<caf::actor>(self), to, tw_result_atom::value,
                   envelope::build<wire::ToolWorkerHello>([](wire::ToolWorkerHello::Builder) {}));
      return;
    }
    const auto a = c->get().getArgs();
    const std::string text = std::string(c->get().getTool().cStr()) + "(" +
                             std::string(reinterpret_cast<const char*>(a.begin()), a.size()) + ")";
    caf::send_as(caf::actor_cast<caf::actor>(self), to, tw_result_atom::value,
                 envelope::build<wire::ToolResultMsg>([&](wire::ToolResultMsg::Builder r) {
                   r.setId(c->get().getId());
                   r.setText(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(text.data()),
                                                 text.size()));
                 }));
  }};
}

struct fixture {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::unique_ptr<remote_tools> tools;

  explicit fixture(const std::vector<manner>& workers, uint32_t timeout_ms = 30'000) {
    schema::add_message_types(cfg);
    cfg.set("scheduler.max-threads", 2);
    sys = std::make_unique<caf::actor_system>(cfg);
    remote_tools_config rc;
    rc.workers = static_cast<int>(workers.size());
    rc.tools = {"calc", "lookup"};
    rc.call_timeout_ms = timeout_ms;
    rc.no_worker_timeout_ms = 2000;
    auto t = remote_tools::create(*sys, rc);
    EXPECT_TRUE(t.ok());
    tools = std::move(*t);
    for (size_t i = 0; i < workers.size(); ++i) {
      sys->spawn(fake_worker, tools->controller(), static_cast<int>(i), workers[i]);
    }
  }
  ~fixture() {
    tools->shutdown();
    tools.reset();
  }

  /// Calls 0..n-1 ("calc", "<i>") and their results, collected for at most 20 s.
  std::map<uint64_t, std::string> run(int n) {
    for (int i = 0; i < n; ++i) {
      EXPECT_TRUE(tools->call(static_cast<uint64_t>(i), {"calc", std::to_string(i)}).ok());
    }
    std::map<uint64_t, std::string> got;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (tools->pending() > 0 && std::chrono::steady_clock::now() < end) {
      for (auto& r : tools->ready(true)) {
        EXPECT_TRUE(got.emplace(r.id, r.text).second) << "call " << r.id << " answered twice";
      }
    }
    return got;
  }
};

void expect_results(const std::map<uint64_t, std::string>& got, int n) {
  ASSERT_EQ(got.size(), static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(got.at(static_cast<uint64_t>(i)), "calc(" + std::to_string(i) + ")");
  }
}

TEST(remote_tools, answer_every_call_once_spread_over_the_workers) {
  fixture f({manner::good, manner::good});
  ASSERT_TRUE(f.tools->wait_ready(10'000).ok());
  EXPECT_FALSE(f.tools->call(99, {"search", "x"}).ok());
  expect_results(f.run(10), 10);
  EXPECT_EQ(f.tools->calls(), 10);
  EXPECT_EQ(f.tools->workers_lost(), 0);
  // Both workers took calls (how many each depends on when answers come back).
  const auto st = nlohmann::json::parse(f.tools->status_json());
  ASSERT_EQ(st["workers"].size(), 2u);
  EXPECT_GT(st["workers"][0]["calls"].get<int>(), 0) << st;
  EXPECT_GT(st["workers"][1]["calls"].get<int>(), 0) << st;
  EXPECT_EQ(st["workers"][0]["calls"].get<int>() + st["workers"][1]["calls"].get<int>(), 10);
}

TEST(remote_tools, a_worker_dying_with_calls_in_flight_loses_none_of_them) {
  fixture f({manner::dies_on_call, manner::good});
  ASSERT_TRUE(f.tools->wait_ready(10'000).ok());
  expect_results(f.run(8), 8);
  EXPECT_EQ(f.tools->workers_lost(), 1);
  EXPECT_GE(f.tools->resent(), 1);
}

TEST(remote_tools, stops_a_worker_that_answers_a_message_of_another_kind) {
  fixture f({manner::other_kind, manner::good});
  ASSERT_TRUE(f.tools->wait_ready(10'000).ok());
  expect_results(f.run(6), 6);
  EXPECT_EQ(f.tools->workers_lost(), 1);
}

TEST(remote_tools, stops_a_silent_worker_at_the_deadline) {
  fixture f({manner::silent, manner::good}, 500);
  ASSERT_TRUE(f.tools->wait_ready(10'000).ok());
  expect_results(f.run(4), 4);
  EXPECT_EQ(f.tools->workers_lost(), 1);
  EXPECT_GE(f.tools->resent(), 1);
}

TEST(remote_tools, without_a_worker_a_call_gets_an_error_result) {
  fixture f({manner::dies_on_call});
  ASSERT_TRUE(f.tools->wait_ready(10'000).ok());
  auto got = f.run(1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].rfind("error: no tool worker", 0), 0u) << got[0];
}

TEST(remote_tools, a_worker_that_could_not_start_its_tools_fails_the_start) {
  fixture f({manner::good, manner::no_tools});
  auto st = f.tools->wait_ready(10'000);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message.find("tool worker 1: tool search: no such program"), std::string::npos)
      << st.message;
}

TEST(tool_worker_config, survives_the_json_round_trip_and_refuses_bad_values) {
  tool_worker_config c;
  c.worker = 1;
  c.tools.tools = {"calc", "mine"};
  c.tools.commands = {{"mine", "python3 mine.py", false}};
  c.tools.latency_ms = 30;
  c.tools.exponential_latency = true;
  c.tools.processes = 2;
  c.controller_port = 4242;
  auto back = tool_worker_config::from_json(c.to_json());
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->to_json(), c.to_json());
  auto refused = [](tool_worker_config x) {
    return !tool_worker_config::from_json(x.to_json()).ok();
  };
  auto x = c;
  x.controller_port = 0;
  EXPECT_TRUE(refused(x));
  x = c;
  x.tools.tools.clear();
  EXPECT_TRUE(refused(x));
  x = c;
  x.tools.processes = 0;
  EXPECT_TRUE(refused(x));
  EXPECT_FALSE(tool_worker_config::from_json("{}").ok());
}

}  // namespace
}  // namespace weft::rl
