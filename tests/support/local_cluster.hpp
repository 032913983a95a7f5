#pragma once
// Test support: a local cluster of real `weft node` processes on 127.0.0.1, and a client actor
// system connected to its head. Every wait is bounded.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <caf/all.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "actors/cluster_client.hpp"
#include "actors/node.hpp"
#include "actors/runtime.hpp"
#include "apps/child_process.hpp"

namespace weft::testing {

/// A TCP port that was free a moment ago.
inline uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

/// Polls `pred` every 10 ms until it holds or `timeout_ms` passes.
inline bool eventually(const std::function<bool()>& pred, int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

struct local_cluster_options {
  int nodes = 3;  // head included
  std::string secret = "weft-test-cluster-secret-0001";
  std::vector<std::string> extra_args = {};
  /// When set: every node and the client use these PEM files instead of the TLS identity derived
  /// from the secret.
  std::optional<actors::tls_options> tls = std::nullopt;
};

/// Starts node-0 (head) and node-1..N-1 as `weft node` processes.
class local_cluster {
 public:
  explicit local_cluster(local_cluster_options opts = {}) : opts_(std::move(opts)) {
    port_ = free_port();
    start_node(0, true);
    for (int i = 1; i < opts_.nodes; ++i) start_node(i, false);
    actors::runtime_options base;
    base.worker_threads = 2;
    auto rt = opts_.tls ? actors::secure_runtime(base, secret(), opts_.tls->certificate,
                                                 opts_.tls->key, opts_.tls->ca_file)
                        : actors::secure_runtime(base, secret());
    if (!rt) throw std::runtime_error(rt.error().to_string());
    cfg_ = std::make_unique<actors::runtime_config>(*rt);
    sys_ = std::make_unique<caf::actor_system>(*cfg_);
    auto h = actors::connect_head(*sys_, "127.0.0.1", port_);
    if (!h) throw std::runtime_error(h.error().to_string());
    head_ = *h;
  }
  ~local_cluster() {
    for (auto& c : children_) c.stop(2000);
  }

  /// Starts one more node with id node-<index> (or the head) and waits for its ready line.
  void start_node(int index, bool head, const std::vector<std::string>& args = {}) {
    std::vector<std::string> argv = {
        WEFT_BIN,   "node",       "--node-id",   "node-" + std::to_string(index),
        "--secret", opts_.secret, "--log-level", "warn"};
    if (head) {
      argv.insert(argv.end(), {"--head", "--port", std::to_string(port_)});
    } else {
      argv.insert(argv.end(), {"--join", "127.0.0.1:" + std::to_string(port_)});
    }
    argv.insert(argv.end(), opts_.extra_args.begin(), opts_.extra_args.end());
    if (opts_.tls) {
      argv.insert(argv.end(), {"--tls-cert", opts_.tls->certificate, "--tls-key", opts_.tls->key,
                               "--tls-ca", opts_.tls->ca_file});
    }
    argv.insert(argv.end(), args.begin(), args.end());
    auto c = apps::child_process::start(argv);
    if (!c) throw std::runtime_error(c.error().to_string());
    bool ready = false;
    for (int i = 0; i < 50 && !ready; ++i) {
      auto line = c->read_line(15000);
      if (!line) break;
      ready = line->rfind("weft-node-ready", 0) == 0;
    }
    if (!ready) throw std::runtime_error("node-" + std::to_string(index) + " did not start");
    if (static_cast<size_t>(index) < children_.size()) {
      children_[index] = std::move(*c);
    } else {
      children_.push_back(std::move(*c));
    }
  }

  caf::actor_system& system() { return *sys_; }
  const actors::head_actor& head() const { return head_; }
  uint16_t port() const { return port_; }
  actors::cluster_secret secret() const { return actors::cluster_secret{opts_.secret}; }
  apps::child_process& process(int index) { return children_.at(index); }

  /// The cluster status as parsed JSON-ish accessors.
  schema::envelope status() {
    auto st = actors::cluster_status(*sys_, head_);
    if (!st) throw std::runtime_error(st.error().to_string());
    return *st;
  }
  /// State name of node `id` ("alive", "dead", ...), "" if unknown.
  std::string node_state(const std::string& id) {
    auto env = status();
    auto v = env.read<schema::wire::ClusterStatus>();
    for (auto n : v->get().getNodes()) {
      if (id == n.getNode().getNodeId().cStr()) {
        switch (n.getState()) {
          case schema::wire::NodeState::ALIVE:
            return "alive";
          case schema::wire::NodeState::SUSPECT:
            return "suspect";
          case schema::wire::NodeState::DEAD:
            return "dead";
          default:
            return "other";
        }
      }
    }
    return "";
  }
  /// The node that runs actor `name`, "" if none (a supervised child that is restarting, stopped
  /// or failed is listed with that state, but runs nowhere).
  std::string node_of(const std::string& name) {
    auto env = status();
    auto v = env.read<schema::wire::ClusterStatus>();
    for (auto n : v->get().getNodes()) {
      if (n.getState() != schema::wire::NodeState::ALIVE) continue;
      for (auto a : n.getActors()) {
        if (name == a.getName().cStr() && a.getState() == schema::wire::ActorState::RUNNING) {
          return n.getNode().getNodeId().cStr();
        }
      }
    }
    return "";
  }
  /// Sends a Ping through the actor and waits for the echo.
  bool ping(const caf::actor& a, uint64_t seq, int timeout_ms = 3000) {
    caf::scoped_actor self{*sys_};
    bool ok = false;
    auto p = schema::envelope::build<schema::wire::Ping>([&](auto b) { b.setSeq(seq); });
    self->request(a, std::chrono::milliseconds(timeout_ms), actors::ping_atom::value, p)
        .receive(
            [&](const schema::envelope& e) {
              auto v = e.read<schema::wire::Ping>();
              ok = v.ok() && v->get().getSeq() == seq;
            },
            [&](caf::error&) {});
    return ok;
  }

 private:
  local_cluster_options opts_;
  uint16_t port_ = 0;
  std::vector<apps::child_process> children_;
  std::unique_ptr<actors::runtime_config> cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  actors::head_actor head_;
};

}  // namespace weft::testing
