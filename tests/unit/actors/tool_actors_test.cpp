// The tool actors of agentic rollouts (actors/rl/tool_actors.hpp): every call is answered once
// with the tool's result, a tool actor killed with calls in flight is restarted and its calls
// sent again, and a tool that never answers gives its calls an error result; tools of your own
// (a program speaking JSON lines) answer, are restarted after a crash, and fail as a result.
#include <gtest/gtest.h>
#include <httplib.h>
#include <nlohmann/json.hpp>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/send.hpp>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "actors/rl/tool_actors.hpp"
#include "actors/rl/tool_http.hpp"

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

TEST(tool_actors, a_tool_of_your_own_runs_as_several_processes) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("weft-tool-procs-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  tool_actors_config c;
  c.tools = {"who"};
  c.timeout_ms = 10'000;
  c.processes = 3;
  // Each call takes 0.5 s and answers with the process's pid: three calls given at once are in
  // three processes (each goes to the least busy), and so are the next three.
  c.commands = {{"who", python_tool(dir, "who",
                                    "    import time; time.sleep(0.5)\n"
                                    "    print(json.dumps({'id': r['id'], 'result': "
                                    "r['args'] + ' ' + str(os.getpid())}))\n")}};
  auto t = tool_actors::create(c);
  ASSERT_TRUE(t.ok()) << t.error().to_string();
  for (uint64_t i = 0; i < 6; ++i) {
    ASSERT_TRUE((*t)->call(i, grl::tool_call{"who", "call" + std::to_string(i)}));
  }
  auto got = collect(**t, 6);
  ASSERT_EQ(got.size(), 6u);
  std::map<std::string, int> calls_of;
  for (uint64_t i = 0; i < 6; ++i) {
    const std::string want = "call" + std::to_string(i) + " ";
    ASSERT_EQ(got[i].rfind(want, 0), 0u) << got[i];
    ++calls_of[got[i].substr(want.size())];
  }
  EXPECT_EQ(calls_of.size(), 3u) << "three processes";
  for (const auto& [pid, n] : calls_of) EXPECT_EQ(n, 2) << "process " << pid;
  std::filesystem::remove_all(dir);
}

/// An HTTP tool server on a free local port: POST /shout answers {"result": ARGS!} after 100 ms
/// (counting the requests in flight at once), /teapot 418, /babble text, /flaky 503 on its first
/// request.
class tool_server {
 public:
  tool_server() {
    server_.Post("/shout", [this](const httplib::Request& req, httplib::Response& res) {
      const int now = ++in_flight_;
      int seen = max_in_flight_.load();
      while (now > seen && !max_in_flight_.compare_exchange_weak(seen, now)) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const auto j = nlohmann::json::parse(req.body);
      std::string up = j.at("args").get<std::string>();
      std::transform(up.begin(), up.end(), up.begin(), ::toupper);
      res.set_content(nlohmann::json{{"result", j.at("tool").get<std::string>() == "shout"
                                                    ? up + "!"
                                                    : std::string("wrong tool")}}
                          .dump(),
                      "application/json");
      --in_flight_;
    });
    server_.Post("/teapot",
                 [](const httplib::Request&, httplib::Response& res) { res.status = 418; });
    server_.Post("/babble", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("hello", "text/plain");
    });
    server_.Post("/flaky", [this](const httplib::Request&, httplib::Response& res) {
      if (flaky_++ == 0) {
        res.status = 503;
        return;
      }
      res.set_content(R"({"result": "ok"})", "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread{[this] { server_.listen_after_bind(); }};
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~tool_server() {
    server_.stop();
    thread_.join();
  }
  std::string url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(port_) + path;
  }
  int max_in_flight() const { return max_in_flight_.load(); }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::atomic<int> in_flight_{0}, max_in_flight_{0}, flaky_{0};
};

TEST(tool_actors, a_tool_behind_an_http_endpoint_answers_several_calls_at_once) {
  tool_server srv;
  tool_actors_config c;
  c.tools = {"shout", "teapot", "babble", "flaky", "gone"};
  c.timeout_ms = 5000;
  c.max_attempts = 2;
  c.concurrency = 4;
  for (const auto& [name, path] :
       std::vector<std::pair<std::string, std::string>>{{"shout", "/shout"},
                                                        {"teapot", "/teapot"},
                                                        {"babble", "/babble"},
                                                        {"flaky", "/flaky"}}) {
    auto e = weft::rl::parse_tool_endpoint(name + "=" + srv.url(path));
    ASSERT_TRUE(e.ok()) << e.error().message();
    EXPECT_TRUE(e->http);
    c.commands.push_back(*e);
  }
  // Nothing listens there: refused connections, tried max_attempts times.
  c.commands.push_back(*weft::rl::parse_tool_endpoint("gone=http://127.0.0.1:1/x"));
  auto t = tool_actors::create(c);
  ASSERT_TRUE(t.ok()) << t.error().to_string();
  for (uint64_t i = 0; i < 8; ++i) {
    ASSERT_TRUE((*t)->call(i, grl::tool_call{"shout", "call " + std::to_string(i)}));
  }
  ASSERT_TRUE((*t)->call(20, grl::tool_call{"teapot", "x"}));
  ASSERT_TRUE((*t)->call(21, grl::tool_call{"babble", "x"}));
  ASSERT_TRUE((*t)->call(22, grl::tool_call{"flaky", "x"}));
  ASSERT_TRUE((*t)->call(23, grl::tool_call{"gone", "x"}));
  auto got = collect(**t, 12);
  ASSERT_EQ(got.size(), 12u);
  for (uint64_t i = 0; i < 8; ++i) EXPECT_EQ(got[i], "CALL " + std::to_string(i) + "!");
  EXPECT_EQ(got[20], "error: the teapot tool refused the call (HTTP 418)");
  EXPECT_EQ(got[21], "error: the babble tool gave no result");
  EXPECT_EQ(got[22], "ok") << "a 503 is sent again";
  EXPECT_EQ(got[23], "error: the gone tool did not answer");
  // Eight 100 ms calls on four workers: several at once, never more than four.
  EXPECT_GE(srv.max_in_flight(), 2);
  EXPECT_LE(srv.max_in_flight(), 4);
  const auto status = nlohmann::json::parse((*t)->status_json());
  EXPECT_EQ(status["tools"][0]["kind"], "http");
}

TEST(tool_actors, tool_endpoints_are_checked_when_given) {
  std::string base, path;
  EXPECT_TRUE(weft::rl::split_http_url("http://127.0.0.1:8000", base, path));
  EXPECT_EQ(base, "http://127.0.0.1:8000");
  EXPECT_EQ(path, "/");
  EXPECT_TRUE(weft::rl::split_http_url("http://search:9/v1/retrieve?k=3", base, path));
  EXPECT_EQ(path, "/v1/retrieve?k=3");
  for (const char* bad : {"https://x/y", "127.0.0.1:80", "http://", "http://a b/"}) {
    EXPECT_FALSE(weft::rl::split_http_url(bad, base, path)) << bad;
  }
  auto noeq = weft::rl::parse_tool_endpoint("search");
  ASSERT_FALSE(noeq.ok());
  EXPECT_NE(noeq.error().message().find("is not NAME=URL"), std::string::npos);
  auto scheme = weft::rl::parse_tool_endpoint("search=ftp://x/");
  ASSERT_FALSE(scheme.ok());
  EXPECT_NE(scheme.error().message().find("is not http://host[:port][/path]"), std::string::npos);
  EXPECT_FALSE(weft::rl::parse_tool_endpoint("Search=http://x/").ok());
  EXPECT_FALSE(weft::rl::parse_tool_endpoint("search=").ok());
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
