#include "apps/rl_agents.hpp"

#include <spdlog/spdlog.h>
#include <caf/actor_system.hpp>

#include <optional>

#include "actors/cluster_client.hpp"
#include "actors/node.hpp"
#include "actors/rl/rollout_agent.hpp"
#include "actors/runtime.hpp"
#include "actors/train/device_sum.hpp"
#include "apps/local_nodes.hpp"
#include "apps/netns.hpp"

namespace weft::apps {

namespace {

/// A one-for-one supervisor on the run's head for `children` (at most `max_restarts` a minute).
/// A killed node process is relaunched first (local_nodes), so the first restart waits 1.5 s:
/// the child then restarts where its kind is spread, not all on the surviving node.
result<caf::actor> supervise_one_for_one(private_head& h, const std::string& name,
                                         const std::vector<actors::child_spec>& children,
                                         int max_restarts) {
  actors::restart_intensity intensity{static_cast<uint32_t>(max_restarts), 60'000};
  actors::backoff_policy backoff{500, 5000, 2.0, 30000};
  backoff.first_delay_ms = 1500;
  return actors::supervise_on_cluster(h.node->system(), h.node->head(), h.secret, name,
                                      actors::restart_strategy::one_for_one, intensity, backoff,
                                      children, 60'000);
}

}  // namespace

struct rl_agent_cluster::impl {
  std::optional<netns_topology> netns;  // outlives the nodes in it (destroyed last)
  std::optional<private_head> head;
  std::unique_ptr<local_nodes> nodes;
  std::optional<caf::actor> supervisor;
  std::optional<caf::actor> reward_supervisor;
  std::optional<caf::actor> trainer_supervisor;
  std::optional<caf::actor> reference_supervisor;
  std::optional<caf::actor> tool_supervisor;
};

rl_agent_cluster::rl_agent_cluster() : d_(std::make_unique<impl>()) {}

rl_agent_cluster::~rl_agent_cluster() {
  if (!d_->head) return;
  auto& sys = d_->head->node->system();
  std::vector<caf::actor> sups;
  if (d_->tool_supervisor) sups.push_back(*d_->tool_supervisor);
  if (d_->reference_supervisor) sups.push_back(*d_->reference_supervisor);
  if (d_->trainer_supervisor) sups.push_back(*d_->trainer_supervisor);
  if (d_->reward_supervisor) sups.push_back(*d_->reward_supervisor);
  if (d_->supervisor) sups.push_back(*d_->supervisor);
  stop_in_order(sys, sups);
  if (d_->nodes) d_->nodes->stop_all();
  if (backend_) backend_->shutdown();
  if (rewards_) rewards_->shutdown();
  if (trainers_) trainers_->shutdown();
  if (reference_) reference_->shutdown();
  if (tools_) tools_->shutdown();
}

result<std::unique_ptr<rl_agent_cluster>> rl_agent_cluster::start(const rl_agents_options& o) {
  std::unique_ptr<rl_agent_cluster> c(new rl_agent_cluster());
  // With --netns the head and the controller listen on the bridge, each agent's node lives in a
  // namespace of its own and moves bulk data over TCP (UCX's shared-memory paths do not cross
  // namespaces).
  std::string host = "127.0.0.1";
  if (o.netns) {
    auto t = netns_topology::create(o.agents + o.reward_workers + std::max(0, o.trainers - 1) +
                                    o.reference_workers + o.tool_workers);
    if (!t) return make_error(errc::unavailable, "--netns: " + t.error().message);
    c->d_->netns.emplace(std::move(*t));
    host = c->d_->netns->gateway();
  }
  auto head = start_private_head("rl-head", 500, 5000, host);
  if (!head)
    return make_error(errc::unavailable, "cannot start the head: " + head.error().to_string());
  c->d_->head.emplace(std::move(*head));
  private_head& h = *c->d_->head;
  auto& sys = h.node->system();
  rl::remote_rollouts_config rc;
  rc.agents = o.agents;
  rc.weight_timeout_ms = o.weight_timeout_ms;
  rc.length_aware = o.length_aware;
  rc.consolidate_tail = o.consolidate_tail;
  rc.weight_fanout = o.weight_fanout;
  rc.routes = o.routes;
  if (c->d_->netns) {
    // Agents pull weights from this process over the bridge, the only device they can reach.
    rc.transport_params["ucx.tls"] = "tcp";
    rc.transport_params["ucx.net_devices"] = c->d_->netns->bridge();
  }
  impl* d = c->d_.get();
  rc.on_idle = [d] {
    if (d->nodes) d->nodes->watch();
  };
  auto backend = rl::remote_rollouts::create(sys, rc);
  if (!backend) return backend.error();
  c->backend_ = std::shared_ptr<rl::remote_rollouts>(std::move(*backend));
  auto port = actors::publish_actor(sys, c->backend_->controller(), 0, host);
  if (!port)
    return make_error(errc::unavailable,
                      "cannot publish the rl controller: " + port.error().to_string());
  spdlog::info("rl controller published on {}:{} (mutual TLS, keyed by this run's secret)", host,
               *port);
  d->nodes = std::make_unique<local_nodes>(
      h.secret_hex, h.node->head_port(),
      [agents = o.agents, rewards = o.reward_workers, trainers = std::max(0, o.trainers - 1),
       references = o.reference_workers](int i) -> local_node_spec {
        if (i >= agents + rewards + trainers + references) {
          return {"tool-node-" + std::to_string(i - agents - rewards - trainers - references),
                  {"tool_worker"}};
        }
        if (i >= agents + rewards + trainers) {
          return {"reference-node-" + std::to_string(i - agents - rewards - trainers),
                  {"rl_reference"}};
        }
        if (i >= agents + rewards) {
          return {"trainer-node-" + std::to_string(i - agents - rewards + 1), {"rl_trainer"}};
        }
        if (i >= agents) return {"reward-node-" + std::to_string(i - agents), {"reward_worker"}};
        return {"rollout-node-" + std::to_string(i), {"rollout_agent"}};
      },
      std::vector<std::string>{"--heartbeat-ms", "500", "--connection-timeout-ms", "5000",
                               "--transport", "ucx"},
      true, o.max_restarts);
  if (const netns_topology* t = d->netns ? &*d->netns : nullptr) {
    local_node_network net;
    net.join_host = host;
    net.prefix = [t](int i) { return t->exec_prefix(i); };
    net.args = [t](int i) -> std::vector<std::string> {
      return {"--bind", t->address(i), "--ucx-tls", "tcp"};
    };
    d->nodes->set_network(std::move(net));
  }
  for (int i = 0; i < o.agents; ++i) {
    if (auto s = d->nodes->launch(i); !s.ok()) return s;
    spdlog::info("rollout-node-{} started (pid {})", i, d->nodes->pid(i));
  }
  if (o.reward_workers > 0) {
    if (auto st = c->start_reward_workers(o, host); !st.ok()) return st;
  }
  if (o.trainers > 1) {
    if (auto st = c->start_trainers(o, host); !st.ok()) return st;
  }
  if (o.reference_workers > 0) {
    if (auto st = c->start_reference_workers(o, host); !st.ok()) return st;
  }
  if (o.tool_workers > 0) {
    if (auto st = c->start_tool_workers(o, host); !st.ok()) return st;
  }
  std::vector<actors::child_spec> children;
  for (int i = 0; i < o.agents; ++i) {
    rl::rollout_agent_config ac;
    ac.model_path = o.model_path;
    ac.agent = i;
    ac.weight_type = o.weight_type;
    ac.device = o.device;
    ac.threads = o.agent_threads;
    ac.max_sequences = o.max_sequences;
    ac.max_new_tokens = o.max_new_tokens;
    ac.max_running = o.max_running;
    ac.priority = o.priority;
    ac.record_routes = o.routes.width() > 0;
    ac.controller_host = host;
    ac.controller_port = *port;
    children.push_back({"rollout-agent-" + std::to_string(i), "rollout_agent", ac.to_json(),
                        actors::restart_type::permanent});
  }
  auto sup = supervise_one_for_one(h, "rollout-agents", children, o.max_restarts);
  if (!sup)
    return make_error(errc::unavailable,
                      "cannot start the rollout agents: " + sup.error().to_string());
  d->supervisor = *sup;
  spdlog::info("{} rollout agents starting ({} thread{} each); weights move over UCX", o.agents,
               o.agent_threads, o.agent_threads == 1 ? "" : "s");
  if (auto st = c->backend_->wait_ready(o.start_timeout_ms); !st.ok()) return st;
  return c;
}

status rl_agent_cluster::start_reward_workers(const rl_agents_options& o, const std::string& host) {
  impl* d = d_.get();
  auto& sys = d->head->node->system();
  rl::remote_rewards_config rc;
  rc.workers = o.reward_workers;
  // One part may take what the program may take, with every restart it is allowed, and a margin.
  rc.part_timeout_s = o.reward_timeout_s * (o.reward_restarts + 1) + 30.0;
  rc.on_idle = [d] {
    if (d->nodes) d->nodes->watch();
  };
  auto r = rl::remote_rewards::create(sys, rc);
  if (!r) return r.error();
  rewards_ = std::shared_ptr<rl::remote_rewards>(std::move(*r));
  auto port = actors::publish_actor(sys, rewards_->controller(), 0, host);
  if (!port) {
    return make_error(errc::unavailable,
                      "cannot publish the reward controller: " + port.error().to_string());
  }
  for (int k = 0; k < o.reward_workers; ++k) {
    if (auto s = d->nodes->launch(o.agents + k); !s.ok()) return s;
    spdlog::info("reward-node-{} started (pid {})", k, d->nodes->pid(o.agents + k));
  }
  std::vector<actors::child_spec> children;
  for (int k = 0; k < o.reward_workers; ++k) {
    rl::reward_worker_config wc;
    wc.worker = k;
    wc.command = o.reward_cmd;
    wc.procs = o.reward_procs;
    wc.timeout_s = o.reward_timeout_s;
    wc.max_restarts = o.reward_restarts;
    wc.controller_host = host;
    wc.controller_port = *port;
    children.push_back({"reward-worker-" + std::to_string(k), "reward_worker", wc.to_json(),
                        actors::restart_type::permanent});
  }
  auto sup = supervise_one_for_one(*d->head, "reward-workers", children, o.max_restarts);
  if (!sup) {
    return make_error(errc::unavailable,
                      "cannot start the reward workers: " + sup.error().to_string());
  }
  d->reward_supervisor = *sup;
  spdlog::info("{} reward workers starting: `{}` runs on their nodes", o.reward_workers,
               o.reward_cmd);
  return rewards_->wait_ready(o.start_timeout_ms);
}

status rl_agent_cluster::start_trainers(const rl_agents_options& o, const std::string& host) {
  impl* d = d_.get();
  auto& sys = d->head->node->system();
  rl::remote_trainers_config tc;
  tc.world = o.trainers;
  tc.allreduce_timeout_ms = o.allreduce_timeout_ms;
  tc.bucket_mb = o.bucket_mb;
  tc.dist_backend = o.trainer.dist_backend;
  tc.cuda_device = train::cuda_ordinal(o.trainer.device);
  tc.collectives_engine = o.trainer.collectives_engine;
  tc.no_group_timeout_ms = o.start_timeout_ms;
  tc.on_idle = [d] {
    if (d->nodes) d->nodes->watch();
  };
  if (d->netns) {
    tc.transport_params["ucx.tls"] = "tcp";
    tc.transport_params["ucx.net_devices"] = d->netns->bridge();
  }
  auto t = rl::remote_trainers::create(sys, tc);
  if (!t) return t.error();
  trainers_ = std::shared_ptr<rl::remote_trainers>(std::move(*t));
  auto port = actors::publish_actor(sys, trainers_->controller(), 0, host);
  if (!port) {
    return make_error(errc::unavailable,
                      "cannot publish the trainer group's controller: " + port.error().to_string());
  }
  const int first = o.agents + o.reward_workers;
  std::vector<actors::child_spec> children;
  for (int r = 1; r < o.trainers; ++r) {
    if (auto s = d->nodes->launch(first + r - 1); !s.ok()) return s;
    spdlog::info("trainer-node-{} started (pid {})", r, d->nodes->pid(first + r - 1));
    rl::rl_trainer_config rc = o.trainer;
    rc.rank = r;
    rc.world = o.trainers;
    rc.allreduce_timeout_ms = o.allreduce_timeout_ms;
    rc.bucket_mb = o.bucket_mb;
    rc.controller_host = host;
    rc.controller_port = *port;
    // permanent: a rank never ends on its own; any failure restarts the whole group.
    children.push_back({"rl-trainer-" + std::to_string(r), "rl_trainer", rc.to_json(),
                        actors::restart_type::permanent});
  }
  actors::restart_intensity intensity{static_cast<uint32_t>(o.max_restarts), 60'000};
  actors::backoff_policy backoff{500, 5000, 2.0, 30000};
  backoff.first_delay_ms = 1500;  // a killed node process is relaunched first
  auto sup = actors::supervise_on_cluster(sys, d->head->node->head(), d->head->secret,
                                          "rl-trainer-group", actors::restart_strategy::one_for_all,
                                          intensity, backoff, children, 60'000);
  if (!sup) {
    return make_error(errc::unavailable,
                      "cannot start the trainer ranks: " + sup.error().to_string());
  }
  d->trainer_supervisor = *sup;
  trainers_->watch_supervisor(*sup);
  spdlog::info("{} trainer ranks starting on trainer nodes; gradients are summed over UCX",
               o.trainers - 1);
  return {};
}

status rl_agent_cluster::start_reference_workers(const rl_agents_options& o,
                                                 const std::string& host) {
  impl* d = d_.get();
  auto& sys = d->head->node->system();
  rl::remote_reference_config rc;
  rc.workers = o.reference_workers;
  rc.no_worker_timeout_ms = o.start_timeout_ms;
  rc.on_idle = [d] {
    if (d->nodes) d->nodes->watch();
  };
  auto r = rl::remote_reference::create(sys, rc);
  if (!r) return r.error();
  reference_ = std::shared_ptr<rl::remote_reference>(std::move(*r));
  auto port = actors::publish_actor(sys, reference_->controller(), 0, host);
  if (!port) {
    return make_error(errc::unavailable,
                      "cannot publish the reference controller: " + port.error().to_string());
  }
  const int first = o.agents + o.reward_workers + std::max(0, o.trainers - 1);
  std::vector<actors::child_spec> children;
  for (int k = 0; k < o.reference_workers; ++k) {
    if (auto s = d->nodes->launch(first + k); !s.ok()) return s;
    spdlog::info("reference-node-{} started (pid {})", k, d->nodes->pid(first + k));
    rl::reference_worker_config wc = o.reference;
    wc.worker = k;
    wc.controller_host = host;
    wc.controller_port = *port;
    children.push_back({"rl-reference-" + std::to_string(k), "rl_reference", wc.to_json(),
                        actors::restart_type::permanent});
  }
  auto sup = supervise_one_for_one(*d->head, "reference-workers", children, o.max_restarts);
  if (!sup) {
    return make_error(errc::unavailable,
                      "cannot start the reference workers: " + sup.error().to_string());
  }
  d->reference_supervisor = *sup;
  spdlog::info("{} KL reference worker(s) starting: the starting model loads on their nodes",
               o.reference_workers);
  return reference_->wait_ready(o.start_timeout_ms);
}

status rl_agent_cluster::start_tool_workers(const rl_agents_options& o, const std::string& host) {
  impl* d = d_.get();
  auto& sys = d->head->node->system();
  rl::remote_tools_config tc;
  tc.workers = o.tool_workers;
  tc.tools = o.tools.tools;
  // A call may take what the worker's tools may take, with every retry they are allowed, the
  // longest latency (10 x the mean), and a margin.
  tc.call_timeout_ms = o.tools.timeout_ms * static_cast<uint32_t>(o.tools.max_attempts + 1) +
                       10 * o.tools.latency_ms + 10'000;
  tc.no_worker_timeout_ms = o.start_timeout_ms;
  tc.on_idle = [d] {
    if (d->nodes) d->nodes->watch();
  };
  auto t = rl::remote_tools::create(sys, tc);
  if (!t) return t.error();
  tools_ = std::shared_ptr<rl::remote_tools>(std::move(*t));
  auto port = actors::publish_actor(sys, tools_->controller(), 0, host);
  if (!port) {
    return make_error(errc::unavailable,
                      "cannot publish the tool controller: " + port.error().to_string());
  }
  const int first = o.agents + o.reward_workers + std::max(0, o.trainers - 1) + o.reference_workers;
  std::vector<actors::child_spec> children;
  for (int k = 0; k < o.tool_workers; ++k) {
    if (auto s = d->nodes->launch(first + k); !s.ok()) return s;
    spdlog::info("tool-node-{} started (pid {})", k, d->nodes->pid(first + k));
    rl::tool_worker_config wc;
    wc.worker = k;
    wc.tools = o.tools;
    wc.controller_host = host;
    wc.controller_port = *port;
    children.push_back({"tool-worker-" + std::to_string(k), "tool_worker", wc.to_json(),
                        actors::restart_type::permanent});
  }
  auto sup = supervise_one_for_one(*d->head, "tool-workers", children, o.max_restarts);
  if (!sup) {
    return make_error(errc::unavailable,
                      "cannot start the tool workers: " + sup.error().to_string());
  }
  d->tool_supervisor = *sup;
  spdlog::info("{} tool worker(s) starting: the tools run on their nodes", o.tool_workers);
  return tools_->wait_ready(o.start_timeout_ms);
}

std::string rl_agent_cluster::cluster_json() const {
  auto& node = *d_->head->node;
  auto st = actors::cluster_status(node.system(), node.head(), 2000);
  return st ? actors::cluster_status_json(*st) : std::string{"null"};
}

uint32_t rl_agent_cluster::node_pid(int i) const {
  return d_->nodes ? d_->nodes->pid(i) : 0;
}

}  // namespace weft::apps
