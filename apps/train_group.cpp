// `weft train --trainers K`: a data-parallel trainer group on a local cluster. This process runs
// the head, the run's coordinator and the progress output; each rank runs in its own `weft node`
// process, placed and restarted (all together, one-for-all) by a supervisor (docs/training.md).

#include <spdlog/spdlog.h>
#include <caf/actor_system.hpp>
#include <caf/after.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <caf/system_messages.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <mutex>
#include <optional>
#include <thread>

#include "actors/cluster_client.hpp"
#include "actors/node.hpp"
#include "actors/train/coordinator.hpp"
#include "actors/train/train_atoms.hpp"
#include "actors/train/trainer.hpp"
#include "apps/local_nodes.hpp"
#include "apps/train_options.hpp"
#include "apps/train_report.hpp"

namespace weft::apps {

namespace {

namespace fs = std::filesystem;
using gpu::train::step_record;

/// What the coordinator's events tell the main thread.
struct group_progress {
  std::mutex mu;
  std::optional<train::rank_done> finished;  ///< rank 0 done (finished or stopped)
  std::optional<train::rank_done> failed;    ///< a fatal error
  int groups = 0;
};

/// The run's progress output, fed by the coordinator (on its thread).
class group_reporter {
 public:
  group_reporter(const train_options& o, std::vector<step_record> earlier)
      : report_(metrics_path_of(o.metrics_path, o.run.checkpoint_dir), o.run.steps),
        known_(std::move(earlier)) {}

  void started(int64_t first) {
    std::vector<step_record> before;
    for (const auto& r : known_) {
      if (r.step <= first) before.push_back(r);
    }
    known_ = before;
    report_.start_at(first, before);
    if (first > 0) spdlog::info("the group continues after step {}", first);
  }
  void step(const step_record& r, double seconds, double reduce_seconds, bool checkpointed) {
    known_.push_back(r);
    report_.report(r, seconds, reduce_seconds);
    if (checkpointed) report_.prom().add_checkpoint();
  }
  step_reporter& report() { return report_; }

 private:
  step_reporter report_;
  std::vector<step_record> known_;
};

/// The supervisor's children: rank i as "trainer-i".
std::vector<actors::child_spec> rank_specs(const train_options& o, uint16_t coordinator_port) {
  train::trainer_config tc;
  tc.run = o.run;  // --threads is resolved per trainer by the command line
  tc.world = o.trainers;
  tc.coordinator_host = o.bind;  // where every rank, here or on another host, reaches it
  tc.coordinator_port = coordinator_port;
  tc.allreduce_timeout_ms = o.allreduce_timeout_ms;
  std::vector<actors::child_spec> children;
  for (int r = 0; r < o.trainers; ++r) {
    tc.rank = r;
    // transient: a rank that finished is not restarted; one that failed restarts the group.
    children.push_back({"trainer-" + std::to_string(r), r == 0 ? "trainer-lead" : "trainer",
                        tc.to_json(), actors::restart_type::transient});
  }
  return children;
}

/// Waits for the end: rank 0 done, a fatal error, the supervisor gone, or (after a stop signal
/// was relayed) a stopped group. Relaunches dead node processes meanwhile.
int wait_for_end(caf::actor_system& sys, group_progress& progress, local_nodes& nodes,
                 const caf::actor& sup, const caf::actor& coordinator, uint32_t stop_grace_ms) {
  caf::scoped_actor self{sys};
  self->monitor(sup);
  bool supervisor_down = false;
  int signal_seen = 0;
  std::chrono::steady_clock::time_point stop_deadline;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(progress.mu);
      if (progress.failed) {
        spdlog::error("rank {} failed: {}", progress.failed->rank, progress.failed->error);
        return 1;
      }
      if (progress.finished) {
        if (progress.finished->stopped) {
          spdlog::warn("stopped after step {} with a checkpoint (continue with --resume)",
                       progress.finished->step);
          return signal_seen != 0 ? 128 + signal_seen : 1;
        }
        return 0;
      }
    }
    if (supervisor_down) {
      spdlog::error("the trainer group failed too often (--max-restarts); stopping");
      return 1;
    }
    if (signal_seen != 0 && std::chrono::steady_clock::now() > stop_deadline) {
      spdlog::error(
          "the group did not stop within {} s of the signal; stopping without a new "
          "checkpoint",
          stop_grace_ms / 1000);
      return 128 + signal_seen;
    }
    if (const int sig = stop_signal(); sig != 0 && signal_seen == 0) {
      signal_seen = sig;
      stop_deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(stop_grace_ms);
      spdlog::warn("{}: the group checkpoints after its current step and stops",
                   sig == SIGTERM ? "SIGTERM" : "SIGINT");
      caf::anon_send(coordinator, train::t_stop_atom::value);
    }
    nodes.watch();
    self->receive([&](const caf::down_msg&) { supervisor_down = true; },
                  caf::after(std::chrono::milliseconds(100)) >> [] {});
  }
}

/// --remote-trainers: says how the other hosts join and waits until the cluster has a trainer node
/// for every rank (the local ones included). False (said why) on a timeout or a stop signal.
bool wait_for_trainer_nodes(caf::actor_system& sys, const private_head& head,
                            const train_options& opts, local_nodes& nodes) {
  const std::string where = opts.bind + ":" + std::to_string(head.node->head_port());
  spdlog::info(
      "waiting up to {:.0f} s for {} trainer node(s) from other hosts; on each (the model and "
      "the data are sent to a host that lacks them): weft node --join {} --roles trainer "
      "--secret-file {} --transport ucx{}",
      opts.join_timeout_s, opts.remote_trainers, where, opts.secret_file,
      opts.ucx_tls.empty() ? "" : " --ucx-tls " + opts.ucx_tls);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(opts.join_timeout_s * 1e3));
  int seen = -1;
  while (std::chrono::steady_clock::now() < deadline) {
    if (stop_signal() != 0) {
      spdlog::warn("stopped while waiting for the trainer nodes");
      return false;
    }
    int trainers = 0;
    if (auto st = actors::cluster_status(sys, head.node->head(), 2000)) {
      const auto j = nlohmann::json::parse(actors::cluster_status_json(*st), nullptr, false);
      if (j.is_object() && j.contains("nodes")) {
        for (const auto& n : j["nodes"]) {
          const auto roles = n.value("roles", nlohmann::json::array());
          const bool trainer = std::find(roles.begin(), roles.end(), "trainer") != roles.end();
          if (n.value("state", std::string{}) == "alive" && trainer) ++trainers;
        }
      }
    }
    if (trainers != seen) {
      spdlog::info("{} of {} trainer nodes have joined", trainers, opts.trainers);
      seen = trainers;
    }
    if (trainers >= opts.trainers) return true;
    nodes.watch();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  spdlog::error("only {} of {} trainer nodes joined within {:.0f} s (--join-timeout-s)",
                std::max(seen, 0), opts.trainers, opts.join_timeout_s);
  return false;
}

/// The arguments of every `weft node` process this run starts (the ranks' transport, and where
/// the nodes listen when other hosts join).
std::vector<std::string> trainer_node_args(const train_options& opts) {
  std::vector<std::string> args = {"--heartbeat-ms",
                                   std::to_string(opts.heartbeat_ms),
                                   "--connection-timeout-ms",
                                   std::to_string(opts.connection_timeout_ms),
                                   "--transport",
                                   "ucx"};
  if (!opts.ucx_tls.empty()) {
    args.push_back("--ucx-tls");
    args.push_back(opts.ucx_tls);
  }
  if (!opts.ucx_net_devices.empty()) {
    args.push_back("--transport-param");
    args.push_back("ucx.net_devices=" + opts.ucx_net_devices);
  }
  if (opts.bind != "127.0.0.1") {
    // The local nodes listen where the other hosts' nodes reach them too.
    args.push_back("--bind");
    args.push_back(opts.bind);
  }
  return args;
}

/// The coordinator's events, fed into the progress output and the main thread's state.
train::coordinator_events group_events(group_progress& progress, group_reporter& reporter) {
  train::coordinator_events events;
  events.on_group = [&](uint16_t /*generation*/) {
    std::lock_guard<std::mutex> lock(progress.mu);
    if (++progress.groups > 1) reporter.report().prom().add_group_restart();
  };
  events.on_started = [&](int64_t first) { reporter.started(first); };
  events.on_step = [&](const step_record& r, double s, double reduce_s, bool ck) {
    reporter.step(r, s, reduce_s, ck);
  };
  events.on_eval = [&](const gpu::train::eval_record& e) { reporter.report().report_eval(e); };
  events.on_done = [&](const train::rank_done& d) {
    std::lock_guard<std::mutex> lock(progress.mu);
    if (d.fatal) {
      progress.failed = d;
    } else if (d.error.empty() && d.rank == 0) {
      progress.finished = d;
    }
  };
  return events;
}

}  // namespace

int run_train_group(const train_options& opts) {
  catch_stop_signals();
  const auto& o = opts.run;
  // Check the data here, before any process starts: a bad line is reported once, by line.
  if (auto check = gpu::train::load_sft_run(o, /*with_model=*/false); !check) {
    spdlog::error("{}", check.error().message());
    return 2;
  }
  std::optional<actors::cluster_secret> secret;
  if (opts.remote_trainers > 0) {
    auto s = actors::load_secret("", opts.secret_file);
    if (!s) {
      spdlog::error("--secret-file: {}", s.error().message);
      return 2;
    }
    secret = *s;
  }
  auto head = start_private_head("train-head", opts.heartbeat_ms, opts.connection_timeout_ms,
                                 opts.bind, opts.head_port, secret);
  if (!head) {
    spdlog::error("cannot start the head: {}", head.error().to_string());
    return 1;
  }
  auto& sys = head->node->system();
  const fs::path metrics = metrics_path_of(opts.metrics_path, o.checkpoint_dir);
  group_reporter reporter(opts,
                          opts.resume ? read_metrics_file(metrics) : std::vector<step_record>{});
  std::optional<metrics_server> http;
  if (opts.metrics_port > 0) {
    http.emplace(reporter.report().prom());
    // `weft cluster status --train http://127.0.0.1:PORT`: the group's private cluster.
    http->add_json("/admin/cluster", [&sys, h = head->node->head(), model = o.model_path] {
      auto st = actors::cluster_status(sys, h, 2000);
      return "{\"model\":" + nlohmann::json(model).dump() +
             ",\"cluster\":" + (st ? actors::cluster_status_json(*st) : std::string{"null"}) + "}";
    });
    if (!http->start(opts.metrics_port)) {
      spdlog::error("--metrics-port {}: cannot listen on 127.0.0.1", opts.metrics_port);
      return 2;
    }
  }
  group_progress progress;
  train::coordinator_config cc;
  cc.world = opts.trainers;
  cc.resume = opts.resume;
  cc.events = group_events(progress, reporter);
  auto coordinator = train::spawn_train_coordinator(sys, std::move(cc));
  auto port = actors::publish_actor(sys, coordinator, 0, opts.bind);
  if (!port) {
    spdlog::error("cannot publish the coordinator: {}", port.error().to_string());
    return 1;
  }
  spdlog::info("train coordinator published on {}:{} (mutual TLS, keyed by this run's secret)",
               opts.bind, *port);
  local_nodes nodes(
      head->secret_hex, head->node->head_port(),
      [](int i) -> local_node_spec {
        return {"trainer-node-" + std::to_string(i), {"trainer", "trainer-lead"}};
      },
      trainer_node_args(opts), true, opts.max_restarts);
  if (opts.bind != "127.0.0.1") {
    local_node_network net;
    net.join_host = opts.bind;
    nodes.set_network(std::move(net));
  }
  const int local_ranks = opts.trainers - opts.remote_trainers;
  auto stop_everything = [&](const std::optional<caf::actor>& sup) {
    std::vector<caf::actor> actors_to_stop;
    if (sup) actors_to_stop.push_back(*sup);
    actors_to_stop.push_back(coordinator);
    stop_in_order(sys, actors_to_stop);
    nodes.stop_all();
  };
  for (int i = 0; i < local_ranks; ++i) {
    if (auto s = nodes.launch(i); !s.ok()) {
      spdlog::error("{}", s.to_string());
      stop_everything(std::nullopt);
      return 1;
    }
    spdlog::info("trainer-node-{} started (pid {})", i, nodes.pid(i));
  }
  if (opts.remote_trainers > 0) {
    if (!wait_for_trainer_nodes(sys, *head, opts, nodes)) {
      stop_everything(std::nullopt);
      return 1;
    }
  }
  actors::restart_intensity intensity{static_cast<uint32_t>(opts.max_restarts), 60'000};
  actors::backoff_policy backoff{500, 5000, 2.0, 30000};
  // The group restarts once a killed node process had time to be relaunched, so that the ranks
  // are spread over the processes again.
  backoff.first_delay_ms = 1500;
  auto sup = actors::supervise_on_cluster(sys, head->node->head(), head->secret, "trainer-group",
                                          actors::restart_strategy::one_for_all, intensity, backoff,
                                          rank_specs(opts, *port), 60'000);
  if (!sup) {
    spdlog::error("cannot start the trainer ranks: {}", sup.error().to_string());
    stop_everything(std::nullopt);
    return 1;
  }
  const bool gpus = opts.run.device.rfind("cuda", 0) == 0 && !opts.run.offload_optimizer &&
                    opts.run.dist_backend != "ucx";
  spdlog::info("{} trainer ranks started; gradients all-reduced {}", opts.trainers,
               gpus ? "on the GPUs with NCCL where every rank has one (--dist-backend " +
                          opts.run.dist_backend + "; rank 0 logs the choice)"
                    : "over UCX" + (opts.ucx_tls.empty() ? "" : " (" + opts.ucx_tls + ")"));
  // After a stop signal the group finishes its step and checkpoints: give it an all-reduce
  // deadline and a minute for the step and the write.
  const int code =
      wait_for_end(sys, progress, nodes, *sup, coordinator, opts.allreduce_timeout_ms + 60'000);
  stop_everything(*sup);
  http.reset();
  auto& report = reporter.report();
  if (code == 0) {
    const double total_s = report.seconds_since_start();
    spdlog::info("trained to step {} in {} ({:.0f} tok/s); final loss {:.4f}", report.last_step(),
                 format_duration(total_s),
                 static_cast<double>(report.tokens_since_start()) / std::max(total_s, 1e-9),
                 report.last_loss());
    if (!o.save_path.empty()) spdlog::info("saved {} ({})", o.save_path, o.save_type);
    if (!opts.plot_path.empty() && !plot_training(report.path(), opts.plot_path)) return 1;
  }
  return code;
}

}  // namespace weft::apps
