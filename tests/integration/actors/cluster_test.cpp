// A head and two worker node processes on loopback: join, status, remote spawn and messaging.

#include "tests/support/local_cluster.hpp"

#include <filesystem>
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
  auto cli = actors::child_process::start({WEFT_BIN, "cluster", "status", "--json", "--head",
                                           "127.0.0.1:" + std::to_string(cluster.port())},
                                          {"WEFT_CLUSTER_SECRET=" + cluster.secret().bytes});
  ASSERT_TRUE(cli.ok());
  std::string out;
  while (auto line = cli->read_line(5000)) out += *line + "\n";
  EXPECT_NE(out.find("\"node-1\""), std::string::npos) << out;
  EXPECT_NE(out.find("\"alive\""), std::string::npos) << out;
}

/// Many messages in flight at once over mutual TLS: records that OpenSSL reads ahead of CAF's
/// 50-reads-per-event loop are consumed (actors/runtime.cpp) — small ones queued by the thousand,
/// and large ones of many TLS records each. A stall would leave replies unread until the timeout.
TEST(cluster, bursts_of_messages_cross_tls_without_stalling) {
  local_cluster cluster({.nodes = 2});
  ASSERT_TRUE(eventually([&] { return cluster.node_state("node-1") == "alive"; }, 5000));
  auto a = actors::spawn_on_cluster(cluster.system(), cluster.head(), cluster.secret(), "echo",
                                    "burst-echo");
  ASSERT_TRUE(a.ok()) << a.error().to_string();
  caf::scoped_actor self{cluster.system()};
  auto burst = [&](const schema::envelope& e, int n) {
    for (int i = 0; i < n; ++i) self->send(*a, actors::ping_atom::value, e);
    int got = 0;
    bool late = false;
    while (got < n && !late) {
      self->receive(
          [&](const schema::envelope& r) {
            if (r.size_bytes() == e.size_bytes()) ++got;
          },
          caf::after(std::chrono::seconds(30)) >> [&] { late = true; });
    }
    return got;
  };
  auto small = schema::envelope::build<schema::wire::Ping>([](auto b) { b.setSeq(7); });
  EXPECT_EQ(burst(small, 5000), 5000);
  std::vector<std::byte> bytes(256 * 1024);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::byte>(i * 31 + 7);
  auto large = schema::envelope::from_bytes(schema::kind::ping, bytes);
  EXPECT_EQ(burst(large, 64), 64);
  EXPECT_EQ(burst(small, 2000), 2000);
}

/// `weft cluster status` with another cluster's secret, or with no head at the address, says so in
/// one line and exits 1 (no raw CAF error).
TEST(cluster, status_cli_names_a_wrong_secret_or_a_missing_head) {
  local_cluster cluster({.nodes = 1});
  auto run = [](std::vector<std::string> argv, const std::string& secret) {
    // stderr (where the error is logged) joins stdout.
    argv.insert(argv.begin(), {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1"});
    auto c = actors::child_process::start(argv, {"WEFT_CLUSTER_SECRET=" + secret});
    std::string out;
    while (auto line = c->read_line(10000)) out += *line + "\n";
    int status = 0;
    eventually([&] { return c->exited(&status); }, 10000);
    return std::make_pair(status, out);
  };
  auto [st, out] =
      run({WEFT_BIN, "cluster", "status", "--head", "127.0.0.1:" + std::to_string(cluster.port())},
          "not-this-clusters-secret-00000");
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1) << st << out;
  EXPECT_NE(out.find("no weft head at 127.0.0.1:"), std::string::npos) << out;
  EXPECT_NE(out.find("check the cluster secret"), std::string::npos) << out;
  auto [st2, out2] =
      run({WEFT_BIN, "cluster", "status", "--head", "127.0.0.1:" + std::to_string(free_port())},
          cluster.secret().bytes);
  EXPECT_TRUE(WIFEXITED(st2) && WEXITSTATUS(st2) == 1) << st2 << out2;
  EXPECT_NE(out2.find("no weft head at 127.0.0.1:"), std::string::npos) << out2;
  EXPECT_EQ(out2.find("system_error("), std::string::npos) << out2;
  // A client lists only the options it uses: the credentials, not a node's timings.
  auto [st3, help] = run({WEFT_BIN, "cluster", "status", "--help"}, "");
  EXPECT_TRUE(WIFEXITED(st3) && WEXITSTATUS(st3) == 0) << st3;
  EXPECT_NE(help.find("--secret"), std::string::npos) << help;
  EXPECT_EQ(help.find("--heartbeat-ms"), std::string::npos) << help;
  EXPECT_EQ(help.find("--decode-threads"), std::string::npos) << help;
}

/// Join challenges are a table fed by whoever asks: it is bounded (1024 outstanding), and beyond
/// the bound the head answers an explicit `overloaded` error instead of growing.
TEST(cluster, a_challenge_flood_is_bounded) {
  local_cluster cluster({.nodes = 1});
  caf::scoped_actor self{cluster.system()};
  int nonces = 0, refused = 0, other = 0;
  for (int i = 0; i < 1100; ++i) {
    self->request(cluster.head(), std::chrono::seconds(5), actors::challenge_atom::value)
        .receive(
            [&](const schema::envelope& e) {
              if (e.what() == schema::kind::join_challenge) {
                ++nonces;
              } else if (auto err = schema::error_from(e); err.code == errc::overloaded) {
                ++refused;
              } else {
                ++other;
              }
            },
            [&](caf::error&) { ++other; });
  }
  EXPECT_EQ(nonces, 1024);
  EXPECT_EQ(refused, 1100 - 1024);
  EXPECT_EQ(other, 0);
  // The head still answers everything else.
  EXPECT_EQ(cluster.node_state("node-0"), "alive");
}

/// Actor names are cluster-unique: a second spawn under a running actor's name is refused.
TEST(cluster, a_taken_name_is_refused) {
  local_cluster cluster({.nodes = 2});
  auto& sys = cluster.system();
  auto first = actors::spawn_on_cluster(sys, cluster.head(), cluster.secret(), "echo", "e1");
  ASSERT_TRUE(first.ok()) << first.error().to_string();
  auto second = actors::spawn_on_cluster(sys, cluster.head(), cluster.secret(), "echo", "e1");
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.error().code, errc::already_exists) << second.error().to_string();
  EXPECT_TRUE(cluster.ping(*first, 7)) << "the first e1 must be untouched";
}

TEST(cluster, spawns_actors_on_remote_nodes_and_messages_them) {
  local_cluster cluster;
  auto& sys = cluster.system();
  std::set<std::string> hosts;
  for (int i = 0; i < 3; ++i) {
    std::string name = "echo-" + std::to_string(i);
    auto t0 = std::chrono::steady_clock::now();
    auto ms = [&] {
      return std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::steady_clock::now() - t0)
          .count();
    };
    auto a = actors::spawn_on_cluster(sys, cluster.head(), cluster.secret(), "echo", name);
    ASSERT_TRUE(a.ok()) << a.error().to_string();
    auto t_spawn = ms();
    EXPECT_TRUE(cluster.ping(*a, 100 + i));
    auto t_ping = ms();
    hosts.insert(cluster.node_of(name));
    auto looked_up = actors::lookup_on_cluster(sys, cluster.head(), name);
    ASSERT_TRUE(looked_up.ok());
    auto t_lookup = ms();
    EXPECT_TRUE(cluster.ping(*looked_up, 200 + i));
    std::printf("%s: spawn %lld ms, first ping %lld ms, lookup %lld ms, ping %lld ms\n",
                name.c_str(), (long long)t_spawn, (long long)(t_ping - t_spawn),
                (long long)(t_lookup - t_ping), (long long)(ms() - t_lookup));
  }
  EXPECT_EQ(hosts.size(), 3u) << "least-loaded placement spreads actors over the nodes";
  auto missing =
      actors::spawn_on_cluster(sys, cluster.head(), cluster.secret(), "no-such-role", "x");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, errc::unavailable);
}

TEST(cluster, a_client_without_the_secret_cannot_spawn) {
  local_cluster cluster;
  auto a = actors::spawn_on_cluster(cluster.system(), cluster.head(),
                                    actors::cluster_secret{"wrong-secret-but-long-enough"}, "echo",
                                    "intruder");
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.error().code, errc::unauthorized);
  EXPECT_EQ(cluster.node_of("intruder"), "");
}

}  // namespace
}  // namespace weft::testing

namespace weft::testing {
namespace {

/// Two blobs on different node processes; the target pulls 64 MiB from the source over UCX with
/// descriptors and rkeys carried in actor messages, and verifies the checksum.
void pull_64mib(const std::string& ucx_tls) {
  local_cluster cluster({.nodes = 3, .extra_args = {"--ucx-tls", ucx_tls}});
  auto& sys = cluster.system();
  constexpr uint64_t size = 64ull << 20;
  auto src = actors::spawn_on_cluster(sys, cluster.head(), cluster.secret(), "blob", "src",
                                      R"({"size_bytes": 67108864, "seed": 7})");
  ASSERT_TRUE(src.ok()) << src.error().to_string();
  auto dst = actors::spawn_on_cluster(sys, cluster.head(), cluster.secret(), "blob", "dst",
                                      R"({"size_bytes": 67108864, "seed": 0})");
  ASSERT_TRUE(dst.ok()) << dst.error().to_string();
  ASSERT_NE(cluster.node_of("src"), cluster.node_of("dst"));
  caf::scoped_actor self{sys};
  schema::envelope descriptor;
  self->request(*src, std::chrono::seconds(10), actors::region_atom::value)
      .receive([&](schema::envelope e) { descriptor = std::move(e); }, [&](caf::error&) {});
  auto d = descriptor.read<schema::wire::TransferRequest>();
  ASSERT_TRUE(d.ok()) << d.error().to_string();
  ASSERT_EQ(d->get().getSizeBytes(), size);
  uint64_t expected = d->get().getChecksum();
  auto req = schema::envelope::build<schema::wire::TransferRequest>([&](auto b) {
    b.setTransferId(1);
    b.setSource(d->get().getSource());
    b.setSizeBytes(size);
    b.setChecksum(expected);
    b.setLayout("blob:u8");
    b.setDeadlineMs(actors::now_ms() + 60'000);
  });
  schema::envelope reply;
  self->request(*dst, std::chrono::seconds(90), actors::transfer_atom::value, req)
      .receive([&](schema::envelope e) { reply = std::move(e); }, [&](caf::error&) {});
  auto r = reply.read<schema::wire::TransferReply>();
  ASSERT_TRUE(r.ok()) << r.error().to_string() << " / " << schema::error_from(reply).to_string();
  ASSERT_TRUE(r->get().getOk()) << r->get().getError().getMessage().cStr();
  EXPECT_EQ(r->get().getChecksum(), expected);
  double gib_s = static_cast<double>(size) / (1 << 30) / (r->get().getElapsedUs() / 1e6);
  std::printf("64 MiB pull over UCX_TLS=%s: %.2f GiB/s\n", ucx_tls.c_str(), gib_s);
  // A mismatched layout is refused, never guessed.
  auto wrong = schema::envelope::build<schema::wire::TransferRequest>([&](auto b) {
    b.setTransferId(2);
    b.setSource(d->get().getSource());
    b.setSizeBytes(size);
    b.setLayout("kv:llama:f16");
  });
  self->request(*dst, std::chrono::seconds(10), actors::transfer_atom::value, wrong)
      .receive([&](schema::envelope e) { reply = std::move(e); }, [&](caf::error&) {});
  auto w = reply.read<schema::wire::TransferReply>();
  ASSERT_TRUE(w.ok());
  EXPECT_FALSE(w->get().getOk());
  EXPECT_EQ(w->get().getError().getCode(), schema::wire::ErrorCode::VERSION_MISMATCH);
}

TEST(cluster, ucx_transfer_of_64mib_between_nodes_over_tcp) {
  pull_64mib("tcp");
}
TEST(cluster, ucx_transfer_of_64mib_between_nodes_over_shm) {
  pull_64mib("shm");
}

}  // namespace
}  // namespace weft::testing

namespace weft::testing {
namespace {

/// A CA and one node certificate (for 127.0.0.1), made with the openssl command.
actors::tls_options make_certificates(const std::string& dir) {
  std::string cmd = "set -e; cd " + dir +
                    "; openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=weft-test-ca "
                    "-keyout ca.key -out ca.pem 2>/dev/null"
                    "; openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout node.key "
                    "-out node.csr 2>/dev/null"
                    "; openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
                    "-days 2 -out node.pem 2>/dev/null";
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("openssl failed");
  return actors::tls_options{true, dir + "/node.pem", dir + "/node.key", dir + "/ca.pem"};
}

TEST(cluster, tls_between_nodes) {
  char tmpl[] = "/tmp/weft-tls-XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  auto tls = make_certificates(dir);
  local_cluster cluster({.nodes = 2, .tls = tls});
  ASSERT_TRUE(eventually([&] { return cluster.node_state("node-1") == "alive"; }, 5000));
  auto a = actors::spawn_on_cluster(cluster.system(), cluster.head(), cluster.secret(), "echo",
                                    "tls-echo");
  ASSERT_TRUE(a.ok()) << a.error().to_string();
  EXPECT_TRUE(cluster.ping(*a, 5));
  // A client with the secret but without a certificate of this CA is refused at the handshake
  // (the security tier covers plain-TCP peers and other secrets).
  auto rt = actors::secure_runtime({}, cluster.secret());
  ASSERT_TRUE(rt.ok());
  actors::runtime_config other_cfg{*rt};
  caf::actor_system other{other_cfg};
  auto h = actors::connect_head(other, "127.0.0.1", cluster.port());
  EXPECT_FALSE(h.ok());
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace weft::testing
