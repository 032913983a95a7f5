// `weft node`: run one node process — a worker node that joins a head, or the head itself.

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <thread>

#include "actors/cache/cache_shard.hpp"
#include "actors/node.hpp"
#include "actors/rl/rollout_agent.hpp"
#include "actors/serve/engine_worker.hpp"
#include "actors/train/trainer.hpp"
#include "apps/cluster_options.hpp"
#include "apps/commands.hpp"
#include "apps/process_control.hpp"
#include "apps/version.hpp"

namespace weft::apps {

// The product binary's extra roles: none. `weft_test` links a strong definition that adds the
// test-only roles (tests/support/weft_test_roles_hook.cpp).
__attribute__((weak)) void add_extra_roles(actors::role_registry&) {}

namespace {

struct node_cli {
  cluster_cli cluster;
  bool head = false;
  std::string join;
  std::string node_id;
  std::string bind = "127.0.0.1";
  uint16_t port = 7070;
  uint16_t agent_port = 0;
  std::vector<std::string> roles;
  uint32_t suspect_after_ms = 600;
  uint32_t dead_after_ms = 1500;
  std::string transport = "ucx";
  std::string ucx_tls;
  std::vector<std::string> transport_params;
};

int run_node(const node_cli& cli) {
  enter_helper_class(cli.cluster.helper_sched);  // before any thread starts: they inherit it
  stop_latch::instance().catch_signals();
  auto secret = cli.cluster.load_secret();
  if (!secret) {
    spdlog::error("{}", secret.error().message);
    return 2;
  }
  actors::node_options opts;
  opts.node_id = cli.node_id;
  opts.is_head = cli.head;
  opts.bind_host = cli.bind;
  opts.head_port = cli.port;
  opts.agent_port = cli.agent_port;
  opts.roles = cli.roles;
  opts.secret = *secret;
  opts.runtime = cli.cluster.runtime();
  opts.head.suspect_after_ms = cli.suspect_after_ms;
  opts.head.dead_after_ms = cli.dead_after_ms;
  opts.tls = cli.cluster.tls_settings();
  opts.build_version = version_string();
  opts.transport = cli.transport;
  if (!cli.ucx_tls.empty()) opts.transport_params["ucx.tls"] = cli.ucx_tls;
  for (const auto& kv : cli.transport_params) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      spdlog::error("--transport-param expects KEY=VALUE, got '{}'", kv);
      return 2;
    }
    opts.transport_params[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  if (!cli.head) {
    auto hp = parse_host_port(cli.join);
    if (!hp) {
      spdlog::error("--join: {}", hp.error().message);
      return 2;
    }
    opts.join_host = hp->first;
    opts.join_port = hp->second;
  }
  auto roles = std::make_shared<actors::role_registry>();
  actors::add_builtin_roles(*roles);
  serve::add_serve_roles(*roles);
  cache::add_cache_roles(*roles);
  train::add_train_roles(*roles);
  rl::add_rl_roles(*roles);
  add_extra_roles(*roles);
  auto node = actors::node::start(opts, roles);
  if (!node) {
    spdlog::error("node failed to start: {}", node.error().to_string());
    return 1;
  }
  auto& n = *node;
  if (!cli.head) {
    n->on_head_lost([](const std::string& why) {
      spdlog::error("lost the head ({}): stopping", why);
      stop_latch::instance().request(3);
    });
  }
  // One machine-readable line for scripts and tests, then human logs.
  std::printf("weft-node-ready id=%s pid=%d head_port=%u agent_port=%u\n",
              n->options().node_id.c_str(), static_cast<int>(::getpid()), n->head_port(),
              n->agent_port());
  std::fflush(stdout);
  spdlog::info("node {} ready ({}), agent on {}:{}", n->options().node_id,
               cli.head ? "head" : "worker", cli.bind, n->agent_port());
  int code = stop_latch::instance().wait();
  spdlog::info("node {} stopping", n->options().node_id);
  // An orderly stop can hang: when a peer is gone (the head's process killed, a cut link),
  // messages to it queued in CAF's middleman keep their senders alive and CAF 0.17's actor system
  // waits for them forever — the node would outlive its cluster. Bounded: exit anyway after 5 s.
  std::thread([code] {
    std::this_thread::sleep_for(std::chrono::seconds(5));
    spdlog::error("node did not stop within 5 s: exiting");
    spdlog::default_logger()->flush();
    std::_Exit(code);
  }).detach();
  node->reset();
  return code;
}

}  // namespace

void add_node_command(CLI::App& app, const global_options&) {
  auto cli = std::make_shared<node_cli>();
  auto* cmd = app.add_subcommand(
      "node", "Run a node process: the head (--head) or a worker that joins one (--join)");
  cmd->add_flag("--head", cli->head, "Run the head (membership, failure detection, placement)");
  cmd->add_option("--join", cli->join, "HOST:PORT of the head to join");
  cmd->add_option("--node-id", cli->node_id, "Node id (default: <bind>-<pid>)");
  cmd->add_option("--bind", cli->bind, "Address to publish on")->capture_default_str();
  cmd->add_option("--port", cli->port, "Head port (with --head; 0 = any free port)")
      ->capture_default_str();
  cmd->add_option("--agent-port", cli->agent_port, "Node agent port (0 = any free port)")
      ->capture_default_str();
  cmd->add_option("--roles", cli->roles, "Roles this node accepts (default: all)")->delimiter(',');
  cmd->add_option("--suspect-after-ms", cli->suspect_after_ms,
                  "Head: missed heartbeats before a node is suspect")
      ->capture_default_str();
  cmd->add_option("--dead-after-ms", cli->dead_after_ms,
                  "Head: missed heartbeats before a node is dead")
      ->capture_default_str();
  cmd->add_option("--transport", cli->transport,
                  "Data-plane engine: ucx, inproc, none (fault:<name> injects faults)")
      ->capture_default_str();
  cmd->add_option("--transport-param", cli->transport_params,
                  "Engine parameter KEY=VALUE (repeatable), e.g. fault.drop_probability=0.1");
  cmd->add_option("--ucx-tls", cli->ucx_tls,
                  "UCX transports for the data plane (e.g. tcp, shm; default: UCX's choice)");
  cli->cluster.add_to(cmd);
  cmd->callback([cli] {
    if (!cli->head && cli->join.empty()) {
      throw CLI::ValidationError("node", "either --head or --join HOST:PORT is required");
    }
    std::exit(run_node(*cli));
  });
}

}  // namespace weft::apps
