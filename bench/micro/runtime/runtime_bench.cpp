// Runtime benchmarks, each beside its baseline in the same run (../shared/BENCHMARKS.md):
//   actor round trip in process and across processes vs raw TCP ping-pong vs Ray actors (Python
//   and C++ API);
//   Cap'n Proto encode/decode of a typical control message;
//   failure detection after SIGKILL and after SIGSTOP of a node process.
// Writes bench/results/runtime-<date>.json and prints one summary line per figure.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <thread>

#include "actors/child_process.hpp"
#include "actors/cluster_client.hpp"
#include "actors/roles.hpp"
#include "actors/runtime.hpp"

using namespace weft;
using nlohmann::json;
using steady = std::chrono::steady_clock;

namespace {

double us_since(steady::time_point t) {
  return std::chrono::duration<double, std::micro>(steady::now() - t).count();
}

json summarize(std::vector<double> lat, double msgs_per_s) {
  std::sort(lat.begin(), lat.end());
  return {{"p50_us", lat[lat.size() / 2]},
          {"p99_us", lat[static_cast<size_t>(lat.size() * 0.99)]},
          {"msgs_per_s", msgs_per_s},
          {"n", lat.size()}};
}

schema::envelope ping_env(uint64_t seq) {
  return schema::envelope::build<schema::wire::Ping>([&](auto b) {
    b.setSeq(seq);
    b.setPayload(kj::heapArray<kj::byte>(64).asPtr());
  });
}

/// Round trips to `target` from a scoped actor, then a pipelined burst.
json actor_round_trip(caf::actor_system& sys, const caf::actor& target, int n) {
  caf::scoped_actor self{sys};
  auto env = ping_env(1);
  for (int i = 0; i < 200; ++i) {
    self->request(target, std::chrono::seconds(5), actors::ping_atom::value, env)
        .receive([](const schema::envelope&) {}, [](caf::error&) {});
  }
  std::vector<double> lat;
  for (int i = 0; i < n; ++i) {
    auto t = steady::now();
    self->request(target, std::chrono::seconds(5), actors::ping_atom::value, env)
        .receive([](const schema::envelope&) {}, [](caf::error&) {});
    lat.push_back(us_since(t));
  }
  auto t = steady::now();
  for (int i = 0; i < n; ++i) self->send(target, actors::ping_atom::value, env);
  int got = 0;
  self->receive_for(got, n)([](const schema::envelope&) {});
  double rate = n / (us_since(t) / 1e6);
  return summarize(lat, rate);
}

/// Serves an echo actor on `port` (child process of the bench).
uint32_t g_worker_threads = 0;  // CAF scheduler threads of both processes (0 = weft's default)

const actors::cluster_secret bench_secret{"bench-secret-0123456789"};

/// weft's runtime options for the echo pair: mutual TLS as every weft process (tls), or CAF's
/// plain TCP (the baseline that shows what TLS costs; weft itself never runs it).
actors::runtime_options echo_options(uint32_t decode_threads, bool tls) {
  actors::runtime_options opts;
  opts.decode_threads = decode_threads;
  opts.worker_threads = g_worker_threads;
  if (tls) opts = *actors::secure_runtime(opts, bench_secret);
  return opts;
}

int serve_echo(uint16_t port, uint32_t decode_threads, bool tls) {
  actors::runtime_config cfg{echo_options(decode_threads, tls)};
  caf::actor_system sys{cfg};
  actors::role_registry roles;
  actors::add_builtin_roles(roles);
  auto echo = (*roles.find("echo"))(sys, actors::role_context{"echo", "", "bench", nullptr, {}});
  bool ok = tls ? actors::publish_actor(sys, *echo, port, "127.0.0.1").ok()
                : static_cast<bool>(sys.middleman().publish(*echo, port, "127.0.0.1", true));
  if (!ok) return 1;
  std::printf("ready\n");
  std::fflush(stdout);
  pause();
  return 0;
}

/// Cross-process round trips to an echo actor in a child process, both processes configured with
/// `decode_threads` (0 = weft's default, 1 = CAF 0.17's default of one BASP decoding thread).
json cross_process(uint32_t decode_threads, int n, bool tls = true) {
  actors::runtime_config cfg{echo_options(decode_threads, tls)};
  caf::actor_system sys{cfg};
  uint16_t port =
      static_cast<uint16_t>(30000 + (::getpid() + decode_threads * 13 + (tls ? 0 : 7)) % 20000);
  std::vector<std::string> argv = {actors::self_exe(),
                                   "--serve",
                                   std::to_string(port),
                                   "--decode-threads",
                                   std::to_string(decode_threads),
                                   "--worker-threads",
                                   std::to_string(g_worker_threads)};
  if (!tls) argv.push_back("--plain-tcp");
  auto server = actors::child_process::start(argv);
  if (!server || !server->read_line(10000)) return {{"error", "echo server did not start"}};
  caf::actor remote;
  if (tls) {
    auto r = actors::connect_actor(sys, "127.0.0.1", port);
    if (!r) return {{"error", r.error().to_string()}};
    remote = *r;
  } else {
    auto r = sys.middleman().remote_actor("127.0.0.1", port);
    if (!r) return {{"error", caf::to_string(r.error())}};
    remote = *r;
  }
  auto out = actor_round_trip(sys, remote, n);
  out["decode_threads"] = decode_threads;
  out["transport"] = tls ? "mutual TLS (weft)" : "plain TCP (CAF without TLS, baseline)";
  return out;
}

/// Raw TCP 64-byte ping-pong between this process and a forked child: the VM's floor.
json tcp_floor(int n) {
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::listen(lfd, 1);
  pid_t pid = ::fork();
  if (pid == 0) {
    int fd = ::accept(lfd, nullptr, nullptr);
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    char buf[64];
    for (;;) {
      size_t got = 0;
      while (got < 64) {
        ssize_t r = ::read(fd, buf + got, 64 - got);
        if (r <= 0) _exit(0);
        got += static_cast<size_t>(r);
      }
      if (::write(fd, buf, 64) != 64) _exit(0);
    }
  }
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  char buf[64] = {};
  auto rt = [&] {
    if (::write(fd, buf, 64) != 64) return;
    size_t got = 0;
    while (got < 64) {
      ssize_t r = ::read(fd, buf + got, 64 - got);
      if (r <= 0) return;
      got += static_cast<size_t>(r);
    }
  };
  for (int i = 0; i < 200; ++i) rt();
  std::vector<double> lat;
  for (int i = 0; i < n; ++i) {
    auto t = steady::now();
    rt();
    lat.push_back(us_since(t));
  }
  ::close(fd);
  ::close(lfd);
  ::waitpid(pid, nullptr, 0);
  std::sort(lat.begin(), lat.end());
  double total = 0;
  for (double x : lat) total += x;
  return summarize(lat, n / (total / 1e6));
}

json capnp_cost(int n) {
  auto t = steady::now();
  size_t bytes = 0;
  for (int i = 0; i < n; ++i) {
    auto env = schema::envelope::build<schema::wire::SpawnRequest>([&](auto b) {
      b.setRequestId(static_cast<uint64_t>(i));
      b.setRole("worker");
      b.setName("worker-17");
      b.setConfigJson(R"({"model":"smollm2","kv_blocks":4096})");
      b.setDeadlineMs(1234567);
      uint8_t token[32] = {};
      b.setSessionToken(kj::arrayPtr(token, 32));
    });
    bytes += env.to_bytes().size();
  }
  double encode_us = us_since(t) / n;
  auto sample = schema::envelope::build<schema::wire::SpawnRequest>([&](auto b) {
    b.setRole("worker");
    b.setName("worker-17");
    b.setConfigJson(R"({"model":"smollm2","kv_blocks":4096})");
  });
  auto wire_bytes = sample.to_bytes();
  t = steady::now();
  size_t sink = 0;
  for (int i = 0; i < n; ++i) {
    auto env = schema::envelope::from_bytes(schema::kind::spawn_request, wire_bytes);
    auto v = env.read<schema::wire::SpawnRequest>();
    sink += v->get().getName().size();
  }
  double decode_us = us_since(t) / n;
  return {{"build_encode_us", encode_us},
          {"decode_validate_read_us", decode_us},
          {"message_bytes", wire_bytes.size()},
          {"checksum", sink + bytes}};
}

/// Starts a 3-node local cluster, kills or stops node-2 and measures the time until the head
/// reports it dead.
json detection(int sig, int repeats) {
  std::vector<double> ms;
  for (int r = 0; r < repeats; ++r) {
    uint16_t port = static_cast<uint16_t>(20000 + (::getpid() + r * 7) % 20000);
    std::string secret = "bench-secret-0123456789";
    std::vector<actors::child_process> nodes;
    for (int i = 0; i < 3; ++i) {
      std::vector<std::string> argv = {
          WEFT_BIN,   "node", "--node-id",   "node-" + std::to_string(i),
          "--secret", secret, "--log-level", "error"};
      if (i == 0) {
        argv.insert(argv.end(), {"--head", "--port", std::to_string(port)});
      } else {
        argv.insert(argv.end(), {"--join", "127.0.0.1:" + std::to_string(port)});
      }
      auto c = actors::child_process::start(argv);
      if (!c || !c->read_line(15000)) return {{"error", "cluster did not start"}};
      nodes.push_back(std::move(*c));
    }
    actors::runtime_config cfg{*actors::secure_runtime({}, actors::cluster_secret{secret})};
    caf::actor_system sys{cfg};
    auto head = actors::connect_head(sys, "127.0.0.1", port);
    if (!head) return {{"error", head.error().to_string()}};
    auto dead = [&] {
      auto st = actors::cluster_status(sys, *head);
      if (!st) return false;
      auto v = st->read<schema::wire::ClusterStatus>();
      for (auto n : v->get().getNodes()) {
        if (std::string("node-2") == n.getNode().getNodeId().cStr()) {
          return n.getState() == schema::wire::NodeState::DEAD;
        }
      }
      return false;
    };
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    auto t = steady::now();
    nodes[2].signal(sig);
    while (!dead() && us_since(t) < 10e6) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ms.push_back(us_since(t) / 1000.0);
    if (sig == SIGSTOP) nodes[2].signal(SIGCONT);
  }
  std::sort(ms.begin(), ms.end());
  return {
      {"median_ms", ms[ms.size() / 2]},
      {"max_ms", ms.back()},
      {"runs", ms.size()},
      {"settings", "heartbeat 200 ms, suspect 600 ms, dead 1500 ms, CAF connection-timeout 2 s"}};
}

std::string today() {
  std::time_t t = std::time(nullptr);
  char buf[16];
  std::strftime(buf, sizeof(buf), "%Y%m%d", std::localtime(&t));
  return buf;
}

/// Runs a baseline program in its own process (ray_pingpong.py, ray_cpp_pingpong): its last line on
/// stdout is its JSON result, or {"error": ...} when it cannot measure; `what` names it in errors.
json run_baseline(const std::vector<std::string>& argv, const std::string& what) {
  auto child = actors::child_process::start(argv);
  if (!child) return {{"error", what + " did not start: " + child.error().to_string()}};
  std::string last;
  while (auto line = child->read_line(180000)) last = *line;
  auto parsed = json::parse(last, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object()) return {{"error", what + " failed"}};
  return parsed;
}

/// Where scripts/build_ray_cpp_bench.sh puts the Ray C++ baseline: build/ray-cpp/ of the source
/// tree (found from ray_pingpong.py's path, bench/micro/runtime/).
std::string default_ray_cpp_bin() {
  auto root = std::filesystem::path(WEFT_RAY_SCRIPT).parent_path() / ".." / ".." / "..";
  return (root / "build" / "ray-cpp" / "ray_cpp_pingpong").lexically_normal().string();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"weft runtime benchmarks (actor round trip, Cap'n Proto, failure detection)"};
  int n = 5000;
  std::string out_dir = "bench/results";
  uint16_t serve_port = 0;
  uint32_t serve_decode_threads = 0;
  bool skip_ray = false;
  int repeat = 1;
  app.add_option("-n", n, "Round trips per figure")->capture_default_str();
  app.add_option("--repeat", repeat,
                 "Alternate the raw TCP floor and the cross-process round trip this many times; "
                 "the ratio is then the median of the per-round ratios")
      ->capture_default_str()
      ->check(CLI::Range(1, 50));
  app.add_option("--out", out_dir, "Directory for the JSON result")->capture_default_str();
  app.add_option("--serve", serve_port, "Internal: serve an echo actor on this port");
  app.add_option("--decode-threads", serve_decode_threads, "Internal: with --serve");
  bool serve_plain = false;
  app.add_flag("--plain-tcp", serve_plain, "Internal: with --serve, CAF without TLS");
  app.add_flag("--skip-ray", skip_ray, "Do not run the Ray (Python actors) baseline");
  bool skip_ray_cpp = false;
  std::string ray_cpp_bin = default_ray_cpp_bin();
  app.add_flag("--skip-ray-cpp", skip_ray_cpp, "Do not run the Ray C++ API baseline");
  app.add_option("--ray-cpp-bin", ray_cpp_bin,
                 "The Ray C++ baseline program (scripts/build_ray_cpp_bench.sh builds it)")
      ->capture_default_str();
  app.add_option("--worker-threads", g_worker_threads,
                 "CAF scheduler threads in both processes (0 = weft's default)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (serve_port != 0) return serve_echo(serve_port, serve_decode_threads, !serve_plain);
  spdlog::set_level(spdlog::level::warn);

  json result;
  char host[256] = {};
  ::gethostname(host, sizeof(host));
  result["machine"] = {{"nproc", std::thread::hardware_concurrency()}, {"host", host}};
  result["date"] = today();

  actors::runtime_config cfg;
  caf::actor_system sys{cfg};
  actors::role_registry roles;
  actors::add_builtin_roles(roles);
  auto echo = *(*roles.find("echo"))(sys, actors::role_context{"echo", "", "bench", nullptr, {}});
  result["in_process"] = actor_round_trip(sys, echo, n);

  // The floor moves by 20-30 % between runs (where the kernel places the two processes): measure
  // it and weft's round trip alternately and compare within each round.
  std::vector<double> ratios, weft_p50, floor_p50;
  for (int round = 0; round < repeat; ++round) {
    json floor = tcp_floor(n);
    json cross = cross_process(0, n);
    if (!cross.contains("p50_us")) {
      result["cross_process"] = cross;
      break;
    }
    floor_p50.push_back(floor["p50_us"]);
    weft_p50.push_back(cross["p50_us"]);
    ratios.push_back(weft_p50.back() / floor_p50.back());
    if (round + 1 == repeat) {
      result["raw_tcp_floor"] = floor;
      result["cross_process"] = cross;
    }
  }
  if (!ratios.empty()) {
    const auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v.size() % 2 == 1 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
    };
    result["rounds"] = {{"cross_process_p50_us", weft_p50},
                        {"raw_tcp_floor_p50_us", floor_p50},
                        {"ratio", ratios},
                        {"median_ratio", median(ratios)},
                        {"median_cross_process_p50_us", median(weft_p50)},
                        {"median_raw_tcp_floor_p50_us", median(floor_p50)}};
  }
  result["cross_process_caf_default_decoding"] = cross_process(1, n);
  result["cross_process_plain_tcp"] = cross_process(0, n, false);
  if (!skip_ray) {
    result["ray"] = run_baseline(
        {"/usr/bin/env", "python3", WEFT_RAY_SCRIPT, std::to_string(std::min(n, 2000))},
        "ray baseline");
  }
  if (!skip_ray_cpp) {
    // The same ping-pong through Ray's C++ API (no Python on either side); fast enough for all n.
    result["ray_cpp"] =
        std::filesystem::exists(ray_cpp_bin)
            ? run_baseline({ray_cpp_bin, std::to_string(n)}, "ray C++ baseline")
            : json{{"error", "no Ray C++ baseline at " + ray_cpp_bin +
                                 ": run scripts/build_ray_cpp_bench.sh (needs pip install "
                                 "ray-cpp==2.60.0; scripts/setup.sh --bench does both)"}};
  }
  result["capnp_spawn_request"] = capnp_cost(100000);
  result["detect_sigkill"] = detection(SIGKILL, 3);
  result["detect_sigstop"] = detection(SIGSTOP, 2);

  auto r = [&](const char* k, const char* f) { return result[k].value(f, 0.0); };
  std::printf("actor round trip in process      p50 %.1f us  p99 %.1f us  %.0f msg/s\n",
              r("in_process", "p50_us"), r("in_process", "p99_us"), r("in_process", "msgs_per_s"));
  if (result["cross_process"].contains("p50_us")) {
    double floor = r("raw_tcp_floor", "p50_us");
    std::printf(
        "actor round trip cross process   p50 %.1f us  p99 %.1f us  %.0f msg/s  = %.2fx raw TCP "
        "floor (p50 %.1f us)\n",
        r("cross_process", "p50_us"), r("cross_process", "p99_us"),
        r("cross_process", "msgs_per_s"), r("cross_process", "p50_us") / floor, floor);
    if (repeat > 1 && result.contains("rounds")) {
      std::printf(
          "  over %d alternating rounds: median p50 %.1f us vs raw TCP %.1f us, median ratio "
          "%.2fx (target <= 2x)\n",
          repeat, result["rounds"].value("median_cross_process_p50_us", 0.0),
          result["rounds"].value("median_raw_tcp_floor_p50_us", 0.0),
          result["rounds"].value("median_ratio", 0.0));
    }
    if (result["cross_process_caf_default_decoding"].contains("p50_us")) {
      std::printf(
          "  same with CAF's default decoder thread  p50 %.1f us  p99 %.1f us: weft's setting is "
          "%.2fx lower\n",
          r("cross_process_caf_default_decoding", "p50_us"),
          r("cross_process_caf_default_decoding", "p99_us"),
          r("cross_process_caf_default_decoding", "p50_us") / r("cross_process", "p50_us"));
    }
    if (result["cross_process_plain_tcp"].contains("p50_us")) {
      std::printf(
          "  what mutual TLS costs: plain-TCP CAF p50 %.1f us, %.0f msg/s; weft (TLS) is %.2fx its "
          "p50 and %.2fx its throughput\n",
          r("cross_process_plain_tcp", "p50_us"), r("cross_process_plain_tcp", "msgs_per_s"),
          r("cross_process", "p50_us") / r("cross_process_plain_tcp", "p50_us"),
          r("cross_process", "msgs_per_s") / r("cross_process_plain_tcp", "msgs_per_s"));
    }
    if (result.contains("ray") && result["ray"].contains("p50_us")) {
      std::printf(
          "actor round trip vs Ray          Ray p50 %.1f us: weft is %.2fx faster; Ray %.0f msg/s, "
          "weft %.2fx\n",
          r("ray", "p50_us"), r("ray", "p50_us") / r("cross_process", "p50_us"),
          r("ray", "msgs_per_s"), r("cross_process", "msgs_per_s") / r("ray", "msgs_per_s"));
    }
    if (result.contains("ray_cpp") && result["ray_cpp"].contains("p50_us")) {
      std::printf(
          "actor round trip vs Ray C++      Ray C++ p50 %.1f us: weft is %.2fx faster (target >= "
          "2x); Ray C++ %.0f msg/s, weft %.2fx\n",
          r("ray_cpp", "p50_us"), r("ray_cpp", "p50_us") / r("cross_process", "p50_us"),
          r("ray_cpp", "msgs_per_s"),
          r("cross_process", "msgs_per_s") / r("ray_cpp", "msgs_per_s"));
    } else if (result.contains("ray_cpp")) {
      std::printf("actor round trip vs Ray C++      not measured: %s\n",
                  result["ray_cpp"].value("error", std::string("no result")).c_str());
    }
  }
  std::printf(
      "capnp SpawnRequest               build+encode %.2f us, decode+validate+read %.2f us (%d "
      "B)\n",
      r("capnp_spawn_request", "build_encode_us"),
      r("capnp_spawn_request", "decode_validate_read_us"),
      result["capnp_spawn_request"].value("message_bytes", 0));
  std::printf("failure detection SIGKILL        median %.0f ms (target <= 1000 ms)\n",
              r("detect_sigkill", "median_ms"));
  std::printf("failure detection SIGSTOP        median %.0f ms (target <= 3000 ms)\n",
              r("detect_sigstop", "median_ms"));
  std::filesystem::create_directories(out_dir);
  std::string path = out_dir + "/runtime-" + today() + ".json";
  std::ofstream(path) << result.dump(2) << "\n";
  std::printf("wrote %s\n", path.c_str());
  return 0;
}
