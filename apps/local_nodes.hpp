#pragma once
// The `weft node` processes of a local cluster that one `weft` command runs (`weft serve`,
// `weft train --trainers K`): started, watched, relaunched when they die (bounded), stopped.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "actors/auth.hpp"
#include "actors/child_process.hpp"
#include "schema/status.hpp"

namespace weft::actors {
class node;
}

namespace weft::apps {

using actors::child_process;
using actors::self_exe;

/// The head of a private local cluster run by one command: a fresh secret, the head in this
/// process (roles "echo" only: the work goes to the node processes), no data-plane engine.
struct private_head {
  std::unique_ptr<actors::node> node;
  std::string secret_hex;  ///< the secret as the local nodes get it (WEFT_CLUSTER_SECRET)
  actors::cluster_secret secret;
  private_head();
  private_head(private_head&&) noexcept;
  ~private_head();
};
/// The head listens on `bind_host` (127.0.0.1; a namespace bridge's address when the nodes live in
/// network namespaces; an address other hosts reach when their nodes join) at `head_port` (0: any
/// free port), keyed by `secret` (empty: a fresh random one).
result<private_head> start_private_head(const std::string& node_id, uint32_t heartbeat_ms,
                                        uint32_t connection_timeout_ms,
                                        const std::string& bind_host = "127.0.0.1",
                                        uint16_t head_port = 0,
                                        std::optional<actors::cluster_secret> secret = {},
                                        uint32_t dead_after_ms = 1'500);

/// Stops `actors` one after the other (exit user_shutdown), waiting up to 5 s for each to end: a
/// supervisor first, so that nothing restarts what is stopped after it.
void stop_in_order(caf::actor_system& sys, const std::vector<caf::actor>& actors);

/// Reads lines of a child until one starts with `prefix`.
bool wait_for_line(child_process& c, const std::string& prefix, int timeout_ms);

struct local_node_spec {
  std::string node_id;
  std::vector<std::string> roles;
};

/// Where the node processes run when not on this host's loopback (`--netns`): node i's command
/// line starts with `prefix(i)` (e.g. `ip netns exec NS`) and gets `args(i)` (its `--bind`), and
/// it joins the head at `join_host`.
struct local_node_network {
  std::string join_host = "127.0.0.1";
  std::function<std::vector<std::string>(int)> prefix;
  std::function<std::vector<std::string>(int)> args;
};

class local_nodes {
 public:
  /// Node i is `spec_of(i)`, joined to the head on 127.0.0.1:head_port with the cluster secret;
  /// `extra_args` go to every `weft node` command line.
  local_nodes(std::string secret_hex, uint16_t head_port,
              std::function<local_node_spec(int)> spec_of, std::vector<std::string> extra_args,
              bool relaunch, int max_relaunches);

  /// Node processes launched from now on run in `net`.
  void set_network(local_node_network net);
  /// Starts node i and waits until it is ready.
  status launch(int i);
  /// Called periodically: logs node processes that died and relaunches them (bounded by
  /// `max_relaunches`); a relaunch that fails (e.g. the node cannot reach the head while its link
  /// is cut) is tried again later, 1 s after the first failure and up to 8 s apart. Any thread;
  /// one call at a time (the RL loop's and its reward thread's waits both call it).
  void watch();
  size_t size();
  /// SIGKILLs the node process with `pid` if it is one of ours; false otherwise.
  bool kill(uint32_t pid);
  /// The pid of node i (0 when it is not running).
  uint32_t pid(int i);
  void stop_all();

 private:
  std::string secret_hex_;
  uint16_t head_port_;
  std::function<local_node_spec(int)> spec_of_;
  std::vector<std::string> extra_args_;
  bool relaunch_;
  int max_relaunches_;
  std::mutex mu_;
  std::mutex watch_mu_;  ///< Held through watch(): relaunches_ and launches are its alone.
  std::vector<std::optional<child_process>> nodes_;
  /// Nodes waiting to be relaunched: when to try next, and how many tries failed.
  struct pending_relaunch {
    std::chrono::steady_clock::time_point at;
    int failures = 0;
  };
  std::vector<std::optional<pending_relaunch>> pending_;
  local_node_network net_;
  int relaunches_ = 0;
};

}  // namespace weft::apps
