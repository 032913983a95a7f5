// The tool actors of agentic rollouts (actors/rl/tool_actors.hpp): every call is answered once
// with the tool's result, a tool actor killed with calls in flight is restarted and its calls
// sent again, and a tool that never answers gives its calls an error result; tools of your own
// (a program speaking JSON lines) answer, are restarted after a crash, and fail as a result.
#include <gtest/gtest.h>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/send.hpp>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "actors/rl/tool_actors.hpp"

namespace {

using weft::rl::tool_actors;
using weft::rl::tool_actors_config;
namespace grl = weft::gpu::rl;

/// Waits for `n` results (at most 20 s).
std::map<uint64_t, std::string> collect(tool_actors& t, size_t n) {
  std::map<uint64_t, std::string> got;
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (got.size() < n && std::chrono::steady_clock::now() < end) {
    for (auto& r : t.ready(true)) {
      EXPECT_TRUE(got.emplace(r.id, r.text).second) << "call " << r.id << " answered twice";
    }
  }
  return got;
}

TEST(tool_actors, answer_every_call_once_with_the_tools_result) {
  tool_actors_config c;
  c.tools = {"calc", "lookup"};
  c.latency_ms = 20;
  auto t = tool_actors::create(c);
  ASSERT_TRUE(t.ok()) << t.error().to_string();
  for (uint64_t i = 0; i < 20; ++i) {
    ASSERT_TRUE((*t)->call(i, grl::tool_call{"calc", std::to_string(i) + " * 3"}));
  }
  ASSERT_TRUE((*t)->call(100, grl::tool_call{"lookup", "river"}));
  EXPECT_FALSE((*t)->call(101, grl::tool_call{"search", "x"}));
  EXPECT_EQ((*t)->pending(), 21);
  auto got = collect(**t, 21);
  ASSERT_EQ(got.size(), 21u);
  for (uint64_t i = 0; i < 20; ++i) EXPECT_EQ(got[i], std::to_string(i * 3));
  EXPECT_EQ(got[100], grl::lookup("river"));
  EXPECT_EQ((*t)->pending(), 0);
  EXPECT_EQ((*t)->calls(), 21);
  EXPECT_TRUE((*t)->ready(true).empty()) << "nothing pending: returns at once";
}

TEST(tool_actors, a_killed_tool_is_restarted_and_its_calls_sent_again) {
  tool_actors_config c;
  c.tools = {"calc"};
  c.latency_ms = 400;
  auto t = tool_actors::create(c);
  ASSERT_TRUE(t.ok());
  for (uint64_t i = 0; i < 8; ++i) ASSERT_TRUE((*t)->call(i, grl::tool_call{"calc", "2 + 2"}));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  auto victim = (*t)->tool_actor("calc");
  ASSERT_TRUE(victim);
  caf::anon_send_exit(victim, caf::exit_reason::kill);
  auto got = collect(**t, 8);
  ASSERT_EQ(got.size(), 8u);
  for (const auto& [id, text] : got) EXPECT_EQ(text, "4") << id;
  EXPECT_EQ((*t)->restarts(), 1);
  EXPECT_GE((*t)->resent(), 1);
  EXPECT_NE((*t)->tool_actor("calc"), victim);
}

TEST(tool_actors, a_tool_that_never_answers_gives_an_error_result) {
  tool_actors_config c;
  c.tools = {"lookup"};
  c.latency_ms = 5000;  // far past the deadline: every attempt times out
  c.timeout_ms = 100;
  c.max_attempts = 2;
  auto t = tool_actors::create(c);
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE((*t)->call(7, grl::tool_call{"lookup", "river"}));
  auto got = collect(**t, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[7], "error: the lookup tool did not answer");
  EXPECT_GE((*t)->resent(), 1);
}

/// A Python tool in `dir`: `body` runs per request r (a dict), `answer` is printed.
std::string python_tool(const std::filesystem::path& dir, const std::string& name,
                        const std::string& body) {
  const auto path = dir / (name + ".py");
  std::ofstream(path) << "import json, os, sys\n"
                         "for line in sys.stdin:\n"
                         "    r = json.loads(line)\n"
                      << body << "    sys.stdout.flush()\n";
  return "python3 " + path.string();
}

TEST(tool_actors, a_tool_of_your_own_answers_restarts_and_fails_as_a_result) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("weft-tools-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  tool_actors_config c;
  c.tools = {"shout", "flaky", "babble"};
  c.timeout_ms = 5000;
  c.max_attempts = 2;
  c.commands = {
      {"shout", python_tool(dir, "shout",
                            "    print(json.dumps({'id': r['id'], 'result': r['args'].upper() + "
                            "'!' if r['tool'] == 'shout' else 'wrong tool'}))\n")},
      // Dies on its first request (a marker file remembers), then answers.
      {"flaky",
       python_tool(dir, "flaky",
                   "    m = '" + (dir / "flaky.marker").string() +
                       "'\n"
                       "    if not os.path.exists(m):\n"
                       "        open(m, 'w').close(); os._exit(3)\n"
                       "    print(json.dumps({'id': r['id'], 'result': 'ok ' + r['args']}))\n")},
      {"babble", python_tool(dir, "babble", "    print('hello')\n")},
  };
  auto t = tool_actors::create(c);
  ASSERT_TRUE(t.ok()) << t.error().to_string();
  ASSERT_TRUE((*t)->call(1, grl::tool_call{"shout", "hi there"}));
  ASSERT_TRUE((*t)->call(2, grl::tool_call{"shout", "again"}));
  ASSERT_TRUE((*t)->call(3, grl::tool_call{"flaky", "x"}));
  ASSERT_TRUE((*t)->call(4, grl::tool_call{"babble", "x"}));
  auto got = collect(**t, 4);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[1], "HI THERE!");
  EXPECT_EQ(got[2], "AGAIN!");
  EXPECT_EQ(got[3], "ok x") << "restarted after its crash and asked again";
  EXPECT_EQ(got[4], "error: the babble tool failed") << "an answer that is not one";
  std::filesystem::remove_all(dir);
}

TEST(tool_actors, are_refused_without_known_tools) {
  tool_actors_config c;
  EXPECT_FALSE(tool_actors::create(c).ok());
  c.tools = {"search"};
  auto bad = tool_actors::create(c);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().to_string().find("unknown tool 'search'"), std::string::npos);
}

}  // namespace
