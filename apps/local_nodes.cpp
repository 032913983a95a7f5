#include "apps/local_nodes.hpp"

#include <caf/after.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>
#include <caf/system_messages.hpp>

#include "actors/node.hpp"
#include "apps/version.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <csignal>

namespace weft::apps {

private_head::private_head() = default;
private_head::private_head(private_head&&) noexcept = default;
private_head::~private_head() = default;

result<private_head> start_private_head(const std::string& node_id, uint32_t heartbeat_ms,
                                        uint32_t connection_timeout_ms,
                                        const std::string& bind_host, uint16_t head_port,
                                        std::optional<actors::cluster_secret> given,
                                        uint32_t dead_after_ms) {
  private_head h;
  if (given) {
    h.secret = *given;
    h.secret_hex = given->bytes;  // what the local nodes get in WEFT_CLUSTER_SECRET
  } else {
    h.secret_hex = actors::generate_secret_hex();
    auto secret = actors::load_secret(h.secret_hex, "");
    if (!secret) return secret.error();
    h.secret = *secret;
  }
  actors::node_options no;
  no.node_id = node_id;
  no.is_head = true;
  no.head_port = head_port;
  no.bind_host = bind_host;
  no.roles = {"echo"};
  no.secret = h.secret;
  no.runtime.heartbeat_interval_ms = heartbeat_ms;
  no.runtime.connection_timeout_ms = connection_timeout_ms;
  no.head.dead_after_ms = dead_after_ms;
  no.head.suspect_after_ms = std::min(no.head.suspect_after_ms, dead_after_ms);
  no.build_version = version_string();
  no.transport = "none";
  auto roles = std::make_shared<actors::role_registry>();
  actors::add_builtin_roles(*roles);
  auto node = actors::node::start(no, roles);
  if (!node) return node.error();
  h.node = std::move(*node);
  return h;
}

void stop_in_order(caf::actor_system& sys, const std::vector<caf::actor>& actors) {
  caf::scoped_actor s{sys};
  for (const auto& a : actors) {
    s->monitor(a);
    caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    s->receive([](const caf::down_msg&) {},
               caf::after(std::chrono::seconds(5)) >>
                   [] { spdlog::warn("stopping: an actor did not stop within 5 s"); });
  }
}

bool wait_for_line(child_process& c, const std::string& prefix, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    auto line = c.read_line(timeout_ms);
    if (!line) return false;
    if (line->rfind(prefix, 0) == 0) return true;
  }
  return false;
}

local_nodes::local_nodes(std::string secret_hex, uint16_t head_port,
                         std::function<local_node_spec(int)> spec_of,
                         std::vector<std::string> extra_args, bool relaunch, int max_relaunches)
    : secret_hex_(std::move(secret_hex)),
      head_port_(head_port),
      spec_of_(std::move(spec_of)),
      extra_args_(std::move(extra_args)),
      relaunch_(relaunch),
      max_relaunches_(max_relaunches) {}

void local_nodes::set_network(local_node_network net) {
  std::lock_guard<std::mutex> lock(mu_);
  net_ = std::move(net);
}

status local_nodes::launch(int i) {
  const local_node_spec spec = spec_of_(i);
  std::string roles;
  for (const auto& r : spec.roles) roles += (roles.empty() ? "" : ",") + r;
  local_node_network net;
  {
    std::lock_guard<std::mutex> lock(mu_);
    net = net_;
  }
  std::vector<std::string> argv;
  if (net.prefix) argv = net.prefix(i);
  for (std::string a : {self_exe(), std::string("node"), std::string("--join"),
                        net.join_host + ":" + std::to_string(head_port_), std::string("--node-id"),
                        spec.node_id, std::string("--roles"), roles}) {
    argv.push_back(std::move(a));
  }
  argv.insert(argv.end(), extra_args_.begin(), extra_args_.end());
  if (net.args) {
    auto more = net.args(i);
    argv.insert(argv.end(), more.begin(), more.end());
  }
  auto c = child_process::start(argv, {"WEFT_CLUSTER_SECRET=" + secret_hex_});
  if (!c) return c.error();
  if (!wait_for_line(*c, "weft-node-ready", 20'000)) {
    return make_error(errc::unavailable, spec.node_id + " did not start");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (static_cast<size_t>(i) >= nodes_.size()) nodes_.resize(static_cast<size_t>(i) + 1);
  nodes_[static_cast<size_t>(i)] = std::move(*c);
  return {};
}

void local_nodes::watch() {
  std::lock_guard<std::mutex> watching(watch_mu_);
  using clock = std::chrono::steady_clock;
  for (size_t i = 0; i < size(); ++i) {
    int st = 0;
    bool dead = false;
    std::optional<pending_relaunch> due;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (pending_.size() < nodes_.size()) pending_.resize(nodes_.size());
      dead = nodes_[i] && nodes_[i]->exited(&st);
      if (dead) {
        nodes_[i].reset();
        if (relaunch_) pending_[i] = pending_relaunch{clock::now(), 0};
      }
      if (pending_[i] && clock::now() >= pending_[i]->at) due = pending_[i];
    }
    const std::string id = spec_of_(static_cast<int>(i)).node_id;
    if (dead) spdlog::warn("{} exited (status {})", id, st);
    if (!due) continue;
    if (relaunches_ >= max_relaunches_) {
      spdlog::error("{} is not relaunched: {} relaunches done", id, relaunches_);
      std::lock_guard<std::mutex> lock(mu_);
      pending_[i].reset();
      continue;
    }
    ++relaunches_;
    if (auto s = launch(static_cast<int>(i)); !s.ok()) {
      const int failures = due->failures + 1;
      const auto wait =
          std::chrono::milliseconds(std::min(8000, 1000 << std::min(failures - 1, 3)));
      spdlog::error("relaunching {}: {} (trying again in {} ms)", id, s.to_string(), wait.count());
      std::lock_guard<std::mutex> lock(mu_);
      pending_[i] = pending_relaunch{clock::now() + wait, failures};
    } else {
      spdlog::info("{} relaunched (pid {})", id, pid(static_cast<int>(i)));
      std::lock_guard<std::mutex> lock(mu_);
      pending_[i].reset();
    }
  }
}

size_t local_nodes::size() {
  std::lock_guard<std::mutex> lock(mu_);
  return nodes_.size();
}

bool local_nodes::kill(uint32_t pid) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& n : nodes_) {
    if (n && static_cast<uint32_t>(n->pid()) == pid) {
      n->signal(SIGKILL);
      return true;
    }
  }
  return false;
}

uint32_t local_nodes::pid(int i) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto k = static_cast<size_t>(i);
  return k < nodes_.size() && nodes_[k] ? static_cast<uint32_t>(nodes_[k]->pid()) : 0;
}

void local_nodes::stop_all() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& n : nodes_) {
    if (n) n->stop();
  }
  nodes_.clear();
}

}  // namespace weft::apps
