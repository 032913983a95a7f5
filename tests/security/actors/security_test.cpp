// The security tier (docs/security.md): a process without the cluster secret, on loopback, tries
// every published door of a running cluster — the head, a node agent, an actor's node — as a
// plain-TCP CAF peer, as a TLS peer of another cluster, and with raw bytes. Every attempt must be
// refused at the handshake, and nothing in the cluster may change. Also: the secret file is
// created 0600 and never replaced, and no product code opens a door that skips mutual TLS.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <thread>

#include "actors/child_process.hpp"
#include "actors/cluster_client.hpp"
#include "actors/cluster_tls.hpp"
#include "actors/runtime.hpp"
#include "gpu/tiny_model.hpp"
#include "tests/support/local_cluster.hpp"

namespace weft::testing {
namespace {

namespace fs = std::filesystem;

/// What the cluster looks like from the inside: node ids with states, actor names, event count.
std::string fingerprint(local_cluster& cluster) {
  auto env = cluster.status();
  auto v = env.read<schema::wire::ClusterStatus>();
  std::ostringstream out;
  for (auto n : v->get().getNodes()) {
    out << n.getNode().getNodeId().cStr() << ":" << static_cast<int>(n.getState()) << "[";
    for (auto a : n.getActors()) out << a.getName().cStr() << ",";
    out << "] ";
  }
  out << "events=" << v->get().getEvents().size();
  return out.str();
}

uint16_t agent_port_of(local_cluster& cluster, const std::string& node_id) {
  auto env = cluster.status();
  auto v = env.read<schema::wire::ClusterStatus>();
  for (auto n : v->get().getNodes()) {
    if (node_id == n.getNode().getNodeId().cStr()) return n.getNode().getPort();
  }
  return 0;
}

/// A CAF peer speaking plain TCP (CAF's middleman without TLS), weft's message types announced.
struct plain_peer {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  plain_peer() {
    schema::add_message_types(cfg);
    cfg.load<caf::io::middleman>();
    cfg.set("middleman.connection-timeout", caf::timespan{std::chrono::seconds(2)});
    cfg.set("logger.console", caf::atom("none"));
    sys = std::make_unique<caf::actor_system>(cfg);
  }
};

/// Sends `bytes` to 127.0.0.1:port on a fresh TCP connection; true if the peer closed it.
bool peer_closes_after(uint16_t port, const std::string& bytes) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return true;
  }
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  char buf[4096];
  bool closed = false;
  for (int i = 0; i < 100; ++i) {
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n == 0 || (n < 0 && errno != EINTR)) {
      closed = n == 0 || errno != EAGAIN;
      break;
    }
  }
  ::close(fd);
  return closed;
}

class security : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    cluster_ = new local_cluster({.nodes = 2, .secret = "security-tier-secret-0123456789"});
    ASSERT_TRUE(eventually([] { return cluster_->node_state("node-1") == "alive"; }, 5000));
    auto a = actors::spawn_on_cluster(cluster_->system(), cluster_->head(), cluster_->secret(),
                                      "echo", "sec-echo");
    ASSERT_TRUE(a.ok()) << a.error().to_string();
    echo_ = new caf::actor(*a);
  }
  static void TearDownTestSuite() {
    delete echo_;
    delete cluster_;
  }
  static local_cluster* cluster_;
  static caf::actor* echo_;
};
local_cluster* security::cluster_ = nullptr;
caf::actor* security::echo_ = nullptr;

TEST_F(security, plain_tcp_peer_reaches_no_door) {
  auto before = fingerprint(*cluster_);
  plain_peer peer;
  auto& mm = peer.sys->middleman();
  // Untyped and typed: the head, and the node agents of both nodes (node-1 hosts the echo actor).
  EXPECT_FALSE(mm.remote_actor("127.0.0.1", cluster_->port()));
  EXPECT_FALSE(mm.remote_actor<actors::head_actor>("127.0.0.1", cluster_->port()));
  for (const char* node : {"node-0", "node-1"}) {
    uint16_t p = agent_port_of(*cluster_, node);
    ASSERT_NE(p, 0) << node;
    EXPECT_FALSE(mm.remote_actor("127.0.0.1", p)) << node;
    EXPECT_FALSE(mm.remote_actor<actors::node_agent_actor>("127.0.0.1", p)) << node;
  }
  EXPECT_TRUE(cluster_->ping(*echo_, 11)) << "the cluster stopped serving its own members";
  EXPECT_EQ(fingerprint(*cluster_), before);
}

TEST_F(security, peer_of_another_cluster_fails_the_handshake) {
  auto before = fingerprint(*cluster_);
  for (const char* other : {"another-cluster-secret-000000", "security-tier-secret-012345678"}) {
    auto rt = actors::secure_runtime({}, actors::cluster_secret{other});
    ASSERT_TRUE(rt.ok());
    actors::runtime_config cfg{*rt};
    caf::actor_system sys{cfg};
    auto head = actors::connect_head(sys, "127.0.0.1", cluster_->port());
    ASSERT_FALSE(head.ok()) << "a peer with secret '" << other << "' reached the head";
    EXPECT_NE(head.error().message.find("check the cluster secret"), std::string::npos)
        << head.error().message;
    EXPECT_FALSE(actors::connect_node_agent(sys, "127.0.0.1", agent_port_of(*cluster_, "node-1")));
  }
  EXPECT_EQ(fingerprint(*cluster_), before);
}

TEST_F(security, raw_bytes_and_handshake_floods_change_nothing) {
  auto before = fingerprint(*cluster_);
  std::mt19937_64 rng(42);
  std::vector<uint16_t> ports = {cluster_->port(), agent_port_of(*cluster_, "node-0"),
                                 agent_port_of(*cluster_, "node-1")};
  for (uint16_t port : ports) {
    for (int i = 0; i < 20; ++i) {
      std::string junk(1 + rng() % 4096, '\0');
      for (auto& c : junk) c = static_cast<char>(rng());
      EXPECT_TRUE(peer_closes_after(port, junk)) << "port " << port << " kept a junk connection";
    }
    // A TLS ClientHello-looking prefix followed by garbage, and an empty connection.
    EXPECT_TRUE(peer_closes_after(
        port, std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc", 9) + std::string(600, 'A')));
  }
  EXPECT_TRUE(cluster_->ping(*echo_, 12));
  EXPECT_EQ(fingerprint(*cluster_), before);
}

TEST_F(security, members_still_work_after_the_attempts) {
  // The control: the same requests from a member succeed (the refusals above were not vacuous).
  auto h = actors::connect_head(cluster_->system(), "127.0.0.1", cluster_->port());
  ASSERT_TRUE(h.ok()) << h.error().to_string();
  auto agent = actors::connect_node_agent(cluster_->system(), "127.0.0.1",
                                          agent_port_of(*cluster_, "node-1"));
  ASSERT_TRUE(agent.ok()) << agent.error().to_string();
  EXPECT_TRUE(cluster_->ping(*echo_, 13));
}

TEST_F(security, the_product_binary_has_no_test_roles) {
  // `weft` nodes (this cluster) accept weft's roles only: the test roles live in weft_test.
  for (const char* role : {"blob", "crasher"}) {
    auto a = actors::spawn_on_cluster(cluster_->system(), cluster_->head(), cluster_->secret(),
                                      role, std::string("sec-") + role);
    ASSERT_FALSE(a.ok()) << role << " spawned on a product node";
    EXPECT_NE(a.error().message.find("no live node accepts role"), std::string::npos)
        << a.error().message;
  }
}

/// Inside the boundary the receivers still check who sends what changes state: a member cannot
/// keep a stopped node alive with heartbeats in its name, write `actor_failed` events, redirect a
/// node's heartbeats, or start timer chains with ticks (docs/security.md, "Inside the boundary").
TEST(security_members, state_changes_are_checked_at_the_receiver) {
  local_cluster cluster({.nodes = 2, .secret = "security-members-secret-01234"});
  ASSERT_TRUE(eventually([&] { return cluster.node_state("node-1") == "alive"; }, 5000));
  auto& sys = cluster.system();
  caf::scoped_actor self{sys};
  auto head = cluster.head();

  // A fake actor_failed event (as a supervisor would report it) is not recorded.
  auto fake_status = schema::envelope::build<schema::wire::ActorStatus>([](auto b) {
    b.setName("forged-sup");
    b.setRole("supervisor");
    b.setState(schema::wire::ActorState::FAILED);
  });
  self->send(head, actors::status_atom::value, fake_status);
  // Ticks from outside start no timer chain (and change nothing visible).
  for (int i = 0; i < 1000; ++i) self->send(head, actors::tick_atom::value);

  // Pointing node-0's heartbeats at an actor of ours is ignored: it hears nothing.
  auto heard = std::make_shared<std::atomic<int>>(0);
  auto sink = sys.spawn([heard]() -> caf::behavior {
    return {[heard](actors::heartbeat_atom, const schema::envelope&) { ++*heard; }};
  });
  auto agent = actors::connect_node_agent(sys, "127.0.0.1", agent_port_of(cluster, "node-0"));
  ASSERT_TRUE(agent.ok()) << agent.error().to_string();
  self->send(*agent, actors::join_atom::value, sink);

  // Heartbeats in node-1's name do not keep it alive once it stops.
  cluster.process(1).signal(SIGSTOP);
  auto hb = schema::envelope::build<schema::wire::Heartbeat>([](auto b) { b.setNodeId("node-1"); });
  bool dead = false;
  for (int i = 0; i < 60 && !dead; ++i) {
    self->send(head, actors::heartbeat_atom::value, hb);
    caf::anon_send(head, actors::heartbeat_atom::value, hb);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    dead = cluster.node_state("node-1") == "dead";
  }
  cluster.process(1).signal(SIGCONT);
  EXPECT_TRUE(dead) << "forged heartbeats kept a stopped node alive";
  EXPECT_EQ(heard->load(), 0) << "a member redirected node-0's heartbeats";
  EXPECT_EQ(cluster.node_state("node-0"), "alive");
  auto env = cluster.status();
  for (auto e : env.read<schema::wire::ClusterStatus>()->get().getEvents()) {
    EXPECT_STRNE(e.getSubject().cStr(), "forged-sup") << e.getKind().cStr();
  }
  caf::anon_send_exit(sink, caf::exit_reason::user_shutdown);
}

TEST(security_tls, derived_identity_is_deterministic_and_secret_bound) {
  auto a1 = actors::derived_certificate_pem(actors::cluster_secret{"secret-one-0123456789"});
  auto a2 = actors::derived_certificate_pem(actors::cluster_secret{"secret-one-0123456789"});
  auto b = actors::derived_certificate_pem(actors::cluster_secret{"secret-two-0123456789"});
  ASSERT_TRUE(a1.ok() && a2.ok() && b.ok());
  EXPECT_EQ(*a1, *a2);
  EXPECT_NE(*a1, *b);
  auto tls = actors::derive_cluster_tls(actors::cluster_secret{"secret-one-0123456789"});
  ASSERT_TRUE(tls.ok());
  // The key lives in this process's memory only.
  EXPECT_EQ(tls->key.rfind("/proc/self/fd/", 0), 0u) << tls->key;
  std::ifstream key(tls->key);
  std::string first;
  std::getline(key, first);
  EXPECT_EQ(first, "-----BEGIN PRIVATE KEY-----");
}

TEST(security_tls, partial_certificate_options_are_refused) {
  actors::cluster_secret s{"secret-one-0123456789"};
  auto r = actors::cluster_tls(s, "/etc/hostname", "", "");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("go together"), std::string::npos) << r.error().message;
  auto missing = actors::cluster_tls(s, "/nope.pem", "/nope.key", "/nope-ca.pem");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("/nope.pem"), std::string::npos);
}

TEST(security_tls, a_system_without_tls_opens_no_door) {
  actors::runtime_config cfg;  // no TLS identity
  caf::actor_system sys{cfg};
  auto a = sys.spawn([]() -> caf::behavior { return {[](int x) { return x; }}; });
  auto p = actors::publish_actor(sys, a, 0, "127.0.0.1");
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.error().code, errc::unauthorized);
  auto c = actors::connect_actor(sys, "127.0.0.1", 1);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().code, errc::unauthorized);
  caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
}

/// Every door in the product goes through publish_actor / connect_actor (mutual TLS): no source
/// file outside actors/runtime.cpp calls CAF's plain middleman publish or remote_actor.
TEST(security_tls, no_plain_tcp_door_in_the_product) {
  std::regex plain(
      R"(middleman\(\)\s*\.\s*(publish|remote_actor|open)\b|io::publish\b|io::remote_actor\b)");
  std::vector<std::string> offenders;
  for (const char* dir : {"actors", "apps", "transport", "gpu", "schema"}) {
    for (auto& e : fs::recursive_directory_iterator(fs::path(WEFT_SOURCE_DIR) / dir)) {
      auto ext = e.path().extension();
      if (ext != ".cpp" && ext != ".hpp") continue;
      std::ifstream in(e.path());
      std::stringstream ss;
      ss << in.rdbuf();
      std::string text = ss.str();
      if (std::regex_search(text, plain)) offenders.push_back(e.path().string());
    }
  }
  EXPECT_TRUE(offenders.empty()) << "plain-TCP doors in: " << offenders.front();
  // And the scan itself finds what it looks for (it cannot pass vacuously).
  EXPECT_TRUE(std::regex_search(std::string("sys.middleman().publish(a, 0)"), plain));
}

/// The default model, or "" (then the serve test is skipped locally and fails under CI=true).
std::string default_model() {
  if (const char* m = std::getenv("WEFT_MODEL"); m != nullptr && fs::exists(m)) return m;
  fs::path dir =
      std::getenv("WEFT_CACHE_DIR") != nullptr
          ? fs::path(std::getenv("WEFT_CACHE_DIR"))
          : fs::path(std::getenv("HOME") ? std::getenv("HOME") : "/tmp") / ".cache" / "weft";
  auto p = dir / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf";
  return fs::exists(p) ? p.string() : "";
}

/// `weft serve` publishes its router and its head's node agent on loopback. Neither door lets a
/// local process without the run's secret in — plain TCP or another secret's TLS — and the server
/// keeps serving HTTP afterwards.
TEST(security_serve, router_and_agent_refuse_strangers) {
  if (default_model().empty()) {
    const char* ci = std::getenv("CI");
    if (ci != nullptr && *ci && std::string(ci) != "false")
      FAIL() << "CI=true and no default model";
    GTEST_SKIP() << "default model not found (scripts/fetch_model.sh)";
  }
  auto srv = actors::child_process::start({"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1", WEFT_BIN,
                                           "serve", "--port", "0", "--workers", "1"});
  ASSERT_TRUE(srv.ok());
  std::regex router_re(R"(router published on 127\.0\.0\.1:(\d+))");
  std::regex agent_re(R"(agent on 127\.0\.0\.1:(\d+))");
  std::regex ready_re(R"(weft-serve-ready url=(\S+))");
  uint16_t router_port = 0, agent_port = 0;
  std::string url;
  for (int i = 0; i < 400 && url.empty(); ++i) {
    auto line = srv->read_line(120'000);
    if (!line) break;
    std::smatch m;
    if (std::regex_search(*line, m, router_re))
      router_port = static_cast<uint16_t>(std::stoi(m[1]));
    if (agent_port == 0 && std::regex_search(*line, m, agent_re)) {
      agent_port = static_cast<uint16_t>(std::stoi(m[1]));
    }
    if (std::regex_search(*line, m, ready_re)) url = m[1];
  }
  ASSERT_FALSE(url.empty()) << "weft serve did not become ready";
  ASSERT_NE(router_port, 0);
  ASSERT_NE(agent_port, 0);
  plain_peer peer;
  auto rt = actors::secure_runtime({}, actors::cluster_secret{"a-guess-at-the-serve-secret-000"});
  ASSERT_TRUE(rt.ok());
  actors::runtime_config other_cfg{*rt};
  caf::actor_system other{other_cfg};
  for (uint16_t port : {router_port, agent_port}) {
    EXPECT_FALSE(peer.sys->middleman().remote_actor("127.0.0.1", port)) << port;
    EXPECT_FALSE(actors::connect_actor(other, "127.0.0.1", port).ok()) << port;
    EXPECT_TRUE(peer_closes_after(port, std::string(512, '\x17'))) << port;
  }
  httplib::Client http(url);
  auto health = http.Get("/health");
  ASSERT_TRUE(health) << "the server stopped answering HTTP";
  EXPECT_EQ(health->status, 200);
  srv->stop(10'000);
}

/// `weft train --trainers 2` publishes its coordinator (and the head's doors) on loopback: a local
/// process without the run's secret gets in neither with plain TCP nor with another secret's TLS
/// nor with raw bytes, and the group keeps training (then stops cleanly on SIGTERM).
TEST(security_train, coordinator_refuses_strangers) {
  const fs::path dir = fs::temp_directory_path() / ("weft-sec-train-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  gpu::tiny_model_config tc;
  ASSERT_TRUE(gpu::write_tiny_model(tc, dir / "tiny.gguf").ok());
  {
    std::ofstream data(dir / "train.jsonl");
    for (int i = 0; i < 64; ++i) {
      data << R"({"prompt": ")" << i << R"(+1=", "completion": ")" << i + 1 << "\"}\n";
    }
  }
  auto run = actors::child_process::start({"/bin/sh",
                                           "-c",
                                           "exec \"$0\" \"$@\" 2>&1",
                                           WEFT_BIN,
                                           "train",
                                           "--model",
                                           (dir / "tiny.gguf").string(),
                                           "--data",
                                           (dir / "train.jsonl").string(),
                                           "--trainers",
                                           "2",
                                           "--threads",
                                           "1",
                                           "--steps",
                                           "1000000",
                                           "--batch-tokens",
                                           "64",
                                           "--checkpoint-dir",
                                           (dir / "ckpt").string(),
                                           "--checkpoint-every",
                                           "1000000"});
  ASSERT_TRUE(run.ok());
  std::regex coord_re(R"(train coordinator published on 127\.0\.0\.1:(\d+))");
  uint16_t port = 0;
  bool training = false;
  for (int i = 0; i < 2000 && !training; ++i) {
    auto line = run->read_line(60'000);
    if (!line) break;
    std::smatch m;
    if (std::regex_search(*line, m, coord_re)) port = static_cast<uint16_t>(std::stoi(m[1]));
    training = line->rfind("step ", 0) == 0;
  }
  ASSERT_NE(port, 0);
  ASSERT_TRUE(training) << "the group did not start training";
  plain_peer peer;
  auto rt = actors::secure_runtime({}, actors::cluster_secret{"a-guess-at-the-train-secret-00"});
  ASSERT_TRUE(rt.ok());
  actors::runtime_config other_cfg{*rt};
  caf::actor_system other{other_cfg};
  EXPECT_FALSE(peer.sys->middleman().remote_actor("127.0.0.1", port));
  EXPECT_FALSE(actors::connect_actor(other, "127.0.0.1", port).ok());
  EXPECT_TRUE(peer_closes_after(port, std::string(512, '\x17')));
  // Still training: new steps after the attempts.
  int more = 0;
  for (int i = 0; i < 5000 && more < 3; ++i) {
    auto line = run->read_line(30'000);
    if (!line) break;
    if (line->rfind("step ", 0) == 0) ++more;
  }
  EXPECT_EQ(more, 3) << "the group stopped training after the attempts";
  run->signal(SIGTERM);
  int st = 0;
  // Drain its output while it stops (a full pipe would block its progress lines).
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!run->exited(&st) && std::chrono::steady_clock::now() < deadline)
    (void)run->read_line(100);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 143) << "status " << st;
  fs::remove_all(dir);
}

/// `weft cluster up` creates the secret file 0600 and never replaces an existing one, even when
/// the run fails (a short --secret is refused before anything is written).
TEST(security_secret_file, created_private_and_never_replaced) {
  char tmpl[] = "/tmp/weft-secret-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  std::string file = dir + "/cluster.secret";
  { std::ofstream(file) << "users-own-secret-please-keep-0001\n"; }
  auto short_run =
      actors::child_process::start({WEFT_BIN, "cluster", "up", "-n", "1", "--secret", "short",
                                    "--secret-file", file, "--port", std::to_string(free_port())},
                                   {"WEFT_CLUSTER_SECRET="});
  ASSERT_TRUE(short_run.ok());
  int status = 0;
  ASSERT_TRUE(eventually([&] { return short_run->exited(&status); }, 10000));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status;
  std::ifstream kept(file);
  std::string line;
  std::getline(kept, line);
  EXPECT_EQ(line, "users-own-secret-please-keep-0001");

  // A fresh file: created 0600 (a cluster of one node starts, then is stopped).
  std::string fresh = dir + "/fresh/cluster.secret";
  auto up = actors::child_process::start({WEFT_BIN, "cluster", "up", "-n", "1", "--secret-file",
                                          fresh, "--port", std::to_string(free_port())},
                                         {"WEFT_CLUSTER_SECRET="});
  ASSERT_TRUE(up.ok());
  bool ready = false;
  for (int i = 0; i < 20 && !ready; ++i) {
    auto l = up->read_line(20000);
    if (!l) break;
    ready = l->rfind("weft-cluster-ready", 0) == 0;
  }
  ASSERT_TRUE(ready);
  struct stat st {};
  ASSERT_EQ(::stat(fresh.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  up->stop(5000);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace weft::testing
