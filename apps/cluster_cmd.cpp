// `weft cluster`: launch a local cluster of node processes on 127.0.0.1, show its status, spawn
// actors on it.

#include <fcntl.h>
#include <httplib.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>
#include <caf/actor_system.hpp>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "actors/child_process.hpp"
#include "actors/cluster_client.hpp"
#include "apps/cluster_options.hpp"
#include "apps/commands.hpp"
#include "apps/netns.hpp"
#include "apps/process_control.hpp"

namespace weft::apps {

using actors::child_process;
using actors::self_exe;

namespace {

struct up_cli {
  cluster_cli cluster;
  int nodes = 3;
  uint16_t port = 7070;
  std::vector<std::string> roles;
  bool netns = false;
};

struct client_cli {
  cluster_cli cluster;
  std::string head = "127.0.0.1:7070";
  bool json = false;
  std::string serve_url;  ///< status of a `weft serve` instance (its GET /admin/cluster)
  std::string api_key;
  std::string role, name, config_json;
  bool supervised = false;
};

/// Makes sure a secret exists for a local cluster: uses the configured one, or creates a fresh
/// random secret in the secret file the first time. The file is created with mode 0600 from the
/// start (a temporary file linked into place, so a reader never sees it half written) and an
/// existing file is never replaced: a secret that is too short or unreadable is an error.
result<actors::cluster_secret> ensure_local_secret(cluster_cli& cli) {
  std::string path = cli.secret_file.empty() ? default_secret_file() : cli.secret_file;
  const char* env = std::getenv("WEFT_CLUSTER_SECRET");
  std::error_code ec;
  if (!cli.secret.empty() || (env != nullptr && *env) || std::filesystem::exists(path, ec)) {
    return cli.load_secret();
  }
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  if (ec)
    return make_error(errc::internal,
                      "cannot create the directory of " + path + ": " + ec.message());
  std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    return make_error(errc::internal, "cannot create " + tmp + ": " + std::strerror(errno));
  std::string text = actors::generate_secret_hex() + "\n";
  bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) &&
            ::fsync(fd) == 0;
  ok = (::close(fd) == 0) && ok;
  // link() fails if the file appeared meanwhile: another launcher's secret is kept, not replaced.
  int linked = ok ? ::link(tmp.c_str(), path.c_str()) : -1;
  int link_errno = errno;
  ::unlink(tmp.c_str());
  if (!ok) return make_error(errc::internal, "cannot write " + tmp);
  if (linked != 0 && link_errno != EEXIST) {
    return make_error(errc::internal, "cannot create " + path + ": " + std::strerror(link_errno));
  }
  if (linked == 0) spdlog::info("wrote a new cluster secret to {} (mode 0600)", path);
  cli.secret_file = path;
  return cli.load_secret();
}

std::vector<std::string> node_args(const up_cli& cli, const std::string& secret_file) {
  std::vector<std::string> a = {self_exe(), "node"};
  // An explicit secret reaches the nodes through their environment (not their argv, which `ps`
  // shows); otherwise they read the same secret file.
  if (cli.cluster.secret.empty()) a.insert(a.end(), {"--secret-file", secret_file});
  a.insert(a.end(), {"--heartbeat-ms", std::to_string(cli.cluster.heartbeat_ms),
                     "--connection-timeout-ms", std::to_string(cli.cluster.connection_timeout_ms),
                     "--helper-sched", cli.cluster.helper_sched});
  if (!cli.cluster.tls_cert.empty() || !cli.cluster.tls_key.empty() ||
      !cli.cluster.tls_ca.empty()) {
    a.insert(a.end(), {"--tls-cert", cli.cluster.tls_cert, "--tls-key", cli.cluster.tls_key,
                       "--tls-ca", cli.cluster.tls_ca});
  }
  if (!cli.roles.empty()) {
    std::string r;
    for (const auto& x : cli.roles) r += (r.empty() ? "" : ",") + x;
    a.push_back("--roles");
    a.push_back(r);
  }
  return a;
}

/// Waits for a node's "weft-node-ready" line on its stdout.
bool wait_ready(child_process& c, int timeout_ms = 15000) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    auto line = c.read_line(timeout_ms);
    if (!line) return false;
    if (line->rfind("weft-node-ready", 0) == 0) return true;
  }
  return false;
}

int run_up(up_cli cli) {
  stop_latch::instance().catch_signals();
  auto secret = ensure_local_secret(cli.cluster);
  if (!secret) {
    spdlog::error("{}", secret.error().message);
    return 2;
  }
  std::string secret_file =
      cli.cluster.secret_file.empty() ? default_secret_file() : cli.cluster.secret_file;
  std::vector<child_process> children;
  std::optional<netns_topology> topo;
  std::string head_host = "127.0.0.1";
  if (cli.netns) {
    auto t = netns_topology::create(cli.nodes);
    if (!t) {
      spdlog::error("{}", t.error().message);
      return 1;
    }
    topo.emplace(std::move(*t));
    head_host = topo->address(0);
  }
  // Node i's argv: inside its namespace (with --netns) and bound to its own address there.
  auto node_argv = [&](int i, std::vector<std::string> extra) {
    std::vector<std::string> a;
    if (topo) a = topo->exec_prefix(i);
    auto base = node_args(cli, secret_file);
    a.insert(a.end(), base.begin(), base.end());
    if (topo) a.insert(a.end(), {"--bind", topo->address(i), "--ucx-tls", "tcp"});
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  std::vector<std::string> env;
  if (!cli.cluster.secret.empty()) env.push_back("WEFT_CLUSTER_SECRET=" + cli.cluster.secret);
  auto head = child_process::start(
      node_argv(0, {"--head", "--port", std::to_string(cli.port), "--node-id", "node-0"}), env);
  if (!head) {
    spdlog::error("{}", head.error().message);
    return 1;
  }
  if (!wait_ready(*head)) {
    spdlog::error("the head did not start (is port {} free?)", cli.port);
    return 1;
  }
  children.push_back(std::move(*head));
  for (int i = 1; i < cli.nodes; ++i) {
    auto c =
        child_process::start(node_argv(i, {"--join", head_host + ":" + std::to_string(cli.port),
                                           "--node-id", "node-" + std::to_string(i)}),
                             env);
    if (!c) {
      spdlog::error("{}", c.error().message);
      return 1;
    }
    if (!wait_ready(*c)) {
      spdlog::error("node-{} did not start", i);
      return 1;
    }
    children.push_back(std::move(*c));
  }
  std::printf("weft-cluster-ready head=%s:%u nodes=%d\n", head_host.c_str(), cli.port, cli.nodes);
  std::fflush(stdout);
  spdlog::info(
      "local cluster up: {} node(s), head on {}:{} — `weft cluster status --head {}:{}` shows it; "
      "Ctrl-C stops it",
      cli.nodes, head_host, cli.port, head_host, cli.port);
  // Watch the children: report deaths (the head notices them too and restarts their actors).
  std::thread watcher([&children] {
    std::vector<bool> reported(children.size(), false);
    while (!stop_latch::instance().requested()) {
      for (size_t i = 0; i < children.size(); ++i) {
        int st = 0;
        if (!reported[i] && children[i].exited(&st)) {
          reported[i] = true;
          spdlog::warn("node-{} (pid {}) exited with status {}", i, children[i].pid(), st);
          if (i == 0) stop_latch::instance().request(3);
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  int code = stop_latch::instance().wait();
  watcher.join();
  for (auto it = children.rbegin(); it != children.rend(); ++it) it->stop();
  return code;
}

/// `weft cluster status --serve URL` / `--rl URL` / `--train URL`: the nodes and engine workers of
/// a running `weft serve`, the nodes and rollout agents of a `weft rl --agents N`, or the nodes of
/// a `weft train --trainers K`, from its GET /admin/cluster (the same JSON; --json prints it as
/// is).
int run_serve_status(const client_cli& cli) {
  httplib::Client http(cli.serve_url);
  http.set_connection_timeout(5);
  http.set_read_timeout(10);
  httplib::Headers headers;
  if (!cli.api_key.empty()) headers.emplace("Authorization", "Bearer " + cli.api_key);
  auto res = http.Get("/admin/cluster", headers);
  if (!res) {
    spdlog::error("cannot reach {}: {}", cli.serve_url, httplib::to_string(res.error()));
    return 1;
  }
  if (res->status != 200) {
    spdlog::error("{}/admin/cluster answered {}: {}", cli.serve_url, res->status, res->body);
    return 1;
  }
  if (cli.json) {
    std::printf("%s\n", res->body.c_str());
    return 0;
  }
  auto j = nlohmann::json::parse(res->body, nullptr, false);
  if (j.is_discarded()) {
    spdlog::error("{}/admin/cluster: not JSON", cli.serve_url);
    return 1;
  }
  std::string out = fmt::format("model {}\n", j.value("model", std::string{"?"}));
  if (j.contains("cluster") && j["cluster"].is_object()) {
    out +=
        fmt::format("{:<16} {:>8} {:<22} {:<8} {}\n", "NODE", "PID", "ADDRESS", "STATE", "ACTORS");
    for (const auto& n : j["cluster"].value("nodes", nlohmann::json::array())) {
      std::string actors;
      for (const auto& a : n.value("actors", nlohmann::json::array())) {
        actors += (actors.empty() ? "" : ",") + a.value("name", std::string{});
      }
      out += fmt::format("{:<16} {:>8} {:<22} {:<8} {}\n", n.value("id", std::string{}),
                         n.value("pid", 0), n.value("address", std::string{}),
                         n.value("state", std::string{}), actors);
    }
  }
  const auto& r = j["router"];
  if (r.is_object()) {
    out += fmt::format("\n{:<12} {:<8} {:<13} {:>8} {:<14} {:>8} {:>7} {:>7} {:>11} {:>9} {:>9}\n",
                       "WORKER", "ROLE", "STATE", "PID", "NODE", "INFLIGHT", "RUNNING", "WAITING",
                       "KV USED", "PREFILL/S", "DECODE/S");
    for (const auto& w : r.value("workers", nlohmann::json::array())) {
      out += fmt::format(
          "{:<12} {:<8} {:<13} {:>8} {:<14} {:>8} {:>7} {:>7} {:>11} {:>9.0f} {:>9.1f}\n",
          w.value("name", std::string{}), w.value("role", std::string{}),
          w.value("state", std::string{}), w.value("pid", 0), w.value("node_id", std::string{}),
          w.value("inflight", 0), w.value("running", 0), w.value("waiting", 0),
          fmt::format("{}/{}", w.value("kv_blocks_used", 0), w.value("kv_blocks_total", 0)),
          w.value("prefill_tokens_per_s", 0.0), w.value("decode_tokens_per_s", 0.0));
    }
    out += fmt::format("healthy {}, {} outstanding, {} pending, {} worker deaths, {} migrations\n",
                       r.value("healthy", false), r.value("outstanding", 0), r.value("pending", 0),
                       r.value("worker_deaths", 0), r.value("migrations", 0));
  }
  const auto& rl = j["rl"];
  if (rl.is_object()) {
    out += fmt::format("\n{:<8} {:<8} {:>8} {:>9} {:>8} {:>15}\n", "AGENT", "STATE", "PID",
                       "ROLLOUTS", "LOAD", "PULLED VERSION");
    for (const auto& a : rl.value("agents", nlohmann::json::array())) {
      out += fmt::format("{:<8} {:<8} {:>8} {:>9} {:>8.0f} {:>15}\n", a.value("agent", 0),
                         a.value("state", std::string{}), a.value("pid", 0), a.value("rollouts", 0),
                         a.value("load", 0.0), a.value("pulled_version", int64_t{-1}));
    }
    out += fmt::format(
        "weight version {}, {} rollouts live ({} waiting), {} agents lost, {} rollouts moved, "
        "{} consolidated, {} weight pulls from the controller and {} from peers\n",
        rl.value("weight_version", int64_t{0}), rl.value("rollouts_live", 0),
        rl.value("rollouts_waiting", 0), rl.value("agents_lost", int64_t{0}),
        rl.value("rollouts_moved", int64_t{0}), rl.value("rollouts_consolidated", int64_t{0}),
        rl.value("controller_weight_pulls", int64_t{0}), rl.value("peer_weight_pulls", int64_t{0}));
  }
  const auto& rw = j["rewards"];
  if (rw.is_object()) {
    out += fmt::format("\n{:<14} {:<8} {:>8} {:>8}\n", "REWARD WORKER", "STATE", "PID", "PARTS");
    for (const auto& w : rw.value("workers", nlohmann::json::array())) {
      out += fmt::format("{:<14} {:<8} {:>8} {:>8}\n", w.value("worker", 0),
                         w.value("state", std::string{}), w.value("pid", 0),
                         w.value("parts", int64_t{0}));
    }
    out +=
        fmt::format("{} reward workers lost, {} parts scored again\n",
                    rw.value("workers_lost", int64_t{0}), rw.value("parts_rescored", int64_t{0}));
  }
  const auto& tr = j["trainers"];
  if (tr.is_object()) {
    out += fmt::format("\n{:<14} {:<8} {:>8}\n", "TRAINER RANK", "STATE", "PID");
    out += fmt::format("{:<14} {:<8} {:>8}\n", "0 (this run)", "ready", "-");
    for (const auto& r : tr.value("ranks", nlohmann::json::array())) {
      out += fmt::format("{:<14} {:<8} {:>8}\n", r.value("rank", 0),
                         r.value("state", std::string{}), r.value("pid", 0));
    }
    out += fmt::format("trainer group generation {}, {} group(s) formed, gradients summed {}\n",
                       tr.value("generation", 0), tr.value("groups_formed", int64_t{0}),
                       tr.value("gradient_sum", std::string{"host"}) == "gpu"
                           ? "on the GPUs (NCCL)"
                           : "in host memory (UCX)");
  }
  const auto& rf = j["reference"];
  if (rf.is_object()) {
    out += fmt::format("\n{:<14} {:<8} {:>8} {:>8}\n", "KL REFERENCE", "STATE", "PID", "BATCHES");
    for (const auto& w : rf.value("workers", nlohmann::json::array())) {
      out += fmt::format("{:<14} {:<8} {:>8} {:>8}\n", w.value("worker", 0),
                         w.value("state", std::string{}), w.value("pid", 0),
                         w.value("batches", int64_t{0}));
    }
    out +=
        fmt::format("{} reference workers lost, {} batches sent again\n",
                    rf.value("workers_lost", int64_t{0}), rf.value("batches_resent", int64_t{0}));
  }
  const auto& tl = j["tools"];
  if (tl.is_object()) {
    out += fmt::format("\n{:<14} {:<9} {:>8} {:>9}\n", "TOOL", "KIND", "CALLS", "RESTARTS");
    for (const auto& t : tl.value("tools", nlohmann::json::array())) {
      out += fmt::format("{:<14} {:<9} {:>8} {:>9}\n", t.value("tool", std::string{}),
                         t.value("kind", std::string{}), t.value("calls", int64_t{0}),
                         t.value("restarts", int64_t{0}));
    }
    out += fmt::format("{} calls pending, {} sent again, {} ms a call\n",
                       tl.value("pending", int64_t{0}), tl.value("resent", int64_t{0}),
                       tl.value("latency_ms", 0));
  }
  const auto& tw = j["tool_workers"];
  if (tw.is_object()) {
    out += fmt::format("\n{:<14} {:<8} {:>8} {:>8}\n", "TOOL WORKER", "STATE", "PID", "CALLS");
    for (const auto& w : tw.value("workers", nlohmann::json::array())) {
      out += fmt::format("{:<14} {:<8} {:>8} {:>8}\n", w.value("worker", 0),
                         w.value("state", std::string{}), w.value("pid", 0),
                         w.value("calls", int64_t{0}));
    }
    out += fmt::format("{} calls pending, {} tool workers lost, {} calls sent again\n",
                       tw.value("pending", int64_t{0}), tw.value("workers_lost", int64_t{0}),
                       tw.value("calls_resent", int64_t{0}));
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

int run_status(client_cli& cli) {
  if (!cli.serve_url.empty()) return run_serve_status(cli);
  return with_head(
      cli.head, cli.cluster, [&](caf::actor_system& sys, const actors::head_actor& head) {
        auto st = actors::cluster_status(sys, head);
        if (!st) {
          spdlog::error("{}", st.error().to_string());
          return 1;
        }
        std::string out =
            cli.json ? actors::cluster_status_json(*st) + "\n" : actors::cluster_status_table(*st);
        std::fwrite(out.data(), 1, out.size(), stdout);
        return 0;
      });
}

int run_spawn(client_cli& cli) {
  auto secret = cli.cluster.load_secret();
  if (!secret) {
    spdlog::error("{}", secret.error().message);
    return 2;
  }
  return with_head(
      cli.head, cli.cluster, [&](caf::actor_system& sys, const actors::head_actor& head) {
        if (cli.supervised) {
          // A one-for-one supervisor of its own on the head ("<name>-sup"): the actor is restarted
          // on a live node whenever it (or its node) dies, at most 5 times a minute.
          auto sup = actors::supervise_on_cluster(
              sys, head, *secret, cli.name + "-sup", actors::restart_strategy::one_for_one,
              {5, 60'000}, {100, 2'000, 2.0, 30'000},
              {{cli.name, cli.role, cli.config_json, actors::restart_type::permanent}});
          if (!sup) {
            spdlog::error("spawn failed: {}", sup.error().to_string());
            return 1;
          }
          std::printf("spawned %s (role %s) under supervisor %s-sup\n", cli.name.c_str(),
                      cli.role.c_str(), cli.name.c_str());
          return 0;
        }
        auto a = actors::spawn_on_cluster(sys, head, *secret, cli.role, cli.name, cli.config_json);
        if (!a) {
          spdlog::error("spawn failed: {}", a.error().to_string());
          return 1;
        }
        std::printf("spawned %s (role %s)\n", cli.name.c_str(), cli.role.c_str());
        return 0;
      });
}

}  // namespace

void add_cluster_command(CLI::App& app, const global_options&) {
  auto* cmd = app.add_subcommand("cluster", "Launch and inspect a local cluster of node processes");
  cmd->require_subcommand(1);

  auto up = std::make_shared<up_cli>();
  auto* up_cmd = cmd->add_subcommand(
      "up",
      "Start a head and N-1 worker node processes on 127.0.0.1 (foreground; Ctrl-C stops them)");
  up_cmd->add_option("-n,--nodes", up->nodes, "Number of node processes, head included")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  up_cmd->add_option("--port", up->port, "Head port")->capture_default_str();
  up_cmd->add_option("--roles", up->roles, "Roles every node accepts (default: all)")
      ->delimiter(',');
  up_cmd->add_flag("--netns", up->netns,
                   "Run each node in its own network namespace (root; 10.213.x.0/24 on a private "
                   "bridge; data plane over UCX tcp)");
  up->cluster.add_to(up_cmd);
  up_cmd->callback([up] { std::exit(run_up(*up)); });

  auto status = std::make_shared<client_cli>();
  auto* st_cmd =
      cmd->add_subcommand("status", "Show every node: id, pid, address, state, roles, actors");
  st_cmd->add_option("--head", status->head, "HOST:PORT of the head")->capture_default_str();
  st_cmd->add_flag("--json", status->json, "Print JSON instead of a table");
  st_cmd->add_option("--serve", status->serve_url,
                     "Show a running `weft serve` instead: its URL (nodes and engine workers with "
                     "their load)");
  st_cmd->add_option("--rl", status->serve_url,
                     "Show a running `weft rl --agents N --metrics-port P` instead: "
                     "http://127.0.0.1:P (its private cluster's nodes and the rollout agents)");
  st_cmd->add_option("--train", status->serve_url,
                     "Show a running `weft train --trainers K --metrics-port P` instead: "
                     "http://127.0.0.1:P (its trainer group's private cluster)");
  st_cmd->add_option("--api-key", status->api_key, "With --serve: the server's API key")
      ->envname("WEFT_API_KEY");
  status->cluster.add_credentials_to(st_cmd);
  st_cmd->callback([status] { std::exit(run_status(*status)); });

  auto spawn = std::make_shared<client_cli>();
  auto* sp_cmd =
      cmd->add_subcommand("spawn", "Spawn an actor of a role on a live node chosen by the head");
  sp_cmd->add_option("--head", spawn->head, "HOST:PORT of the head")->capture_default_str();
  sp_cmd->add_option("--role", spawn->role, "Role to spawn (e.g. echo)")->required();
  sp_cmd->add_option("--name", spawn->name, "Cluster-unique name of the actor")->required();
  sp_cmd->add_option("--config", spawn->config_json, "Role settings as JSON");
  sp_cmd->add_flag("--supervised", spawn->supervised,
                   "Under a supervisor of its own on the head: restarted on a live node when it or "
                   "its node dies");
  spawn->cluster.add_credentials_to(sp_cmd);
  sp_cmd->callback([spawn] { std::exit(run_spawn(*spawn)); });
}

}  // namespace weft::apps
