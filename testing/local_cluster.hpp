#pragma once
/// weft::testing — for your own tests of programs built on weft (docs/chaos.md, "In your own
/// tests"). A local cluster of real `weft node` processes on 127.0.0.1 and a client actor system
/// connected to its head; nodes can be killed, stopped and restarted. Every wait is bounded.
///
///   weft::testing::local_cluster c({.nodes = 3});
///   auto echo = weft::actors::spawn_on_cluster(c.system(), c.head(), c.secret(), "echo", "e1");
///   c.kill_node(c.index_of(c.node_of("e1")));               // SIGKILL that node's process
///   EXPECT_TRUE(c.wait_node_state(..., "dead", 10'000));

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include <csignal>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/child_process.hpp"
#include "actors/cluster_tls.hpp"
#include "actors/interfaces.hpp"
#include "actors/runtime.hpp"
#include "schema/envelope.hpp"

namespace weft::testing {

/// A TCP port that was free a moment ago.
uint16_t free_port();

/// Polls `pred` every 10 ms until it holds or `timeout_ms` passes; returns its last value.
bool eventually(const std::function<bool()>& pred, int timeout_ms);

/// The `weft` binary tests start: $WEFT_BINARY if set, else "weft" (found on PATH).
std::string default_weft_binary();

struct local_cluster_options {
  int nodes = 3;  ///< node processes, the head (node-0) included
  std::string secret = "weft-test-cluster-secret-0001";
  /// Extra arguments of every `weft node` (e.g. {"--roles", "echo"}, "--transport", ...).
  std::vector<std::string> extra_args = {};
  /// When set: every node and the client use these PEM files instead of the TLS identity derived
  /// from the secret.
  std::optional<actors::tls_options> tls = std::nullopt;
  /// The `weft` executable (empty: default_weft_binary()).
  std::string weft_binary = {};
};

/// Starts node-0 (the head) and node-1..N-1 as `weft node` processes and connects a client actor
/// system to the head. The destructor stops every process. Throws std::runtime_error when a node
/// does not start.
class local_cluster {
 public:
  explicit local_cluster(local_cluster_options opts = {});
  ~local_cluster();
  local_cluster(const local_cluster&) = delete;
  local_cluster& operator=(const local_cluster&) = delete;

  /// Starts (or restarts, after a kill) node-<index> and waits for its ready line; `args` are
  /// extra arguments for this node only.
  void start_node(int index, bool head, const std::vector<std::string>& args = {});
  /// SIGKILLs node-<index>'s process (a crash: no goodbye to the head).
  void kill_node(int index);
  /// SIGSTOPs node-<index>'s process (a hang), or SIGCONTs it (`resume`).
  void stop_node(int index, bool resume = false);

  caf::actor_system& system();
  const actors::head_actor& head() const;
  uint16_t port() const { return port_; }
  actors::cluster_secret secret() const;
  actors::child_process& process(int index);

  /// The head's ClusterStatus.
  schema::envelope status();
  /// State of node `id` ("alive", "suspect", "dead", "other"), "" if the head does not know it.
  std::string node_state(const std::string& id);
  /// Waits up to `timeout_ms` for node `id` to be in `state`.
  bool wait_node_state(const std::string& id, const std::string& state, int timeout_ms);
  /// The node that runs actor `name`, "" if none (a supervised child that is restarting, stopped
  /// or failed is listed with that state, but runs nowhere).
  std::string node_of(const std::string& name);
  /// The index of node id "node-<i>" (-1 for another id).
  static int index_of(const std::string& node_id);
  /// Sends a Ping through the actor (an "echo" role) and waits for the echo.
  bool ping(const caf::actor& a, uint64_t seq, int timeout_ms = 3000);

 private:
  local_cluster_options opts_;
  uint16_t port_ = 0;
  std::vector<actors::child_process> children_;
  std::unique_ptr<actors::runtime_config> cfg_;
  std::unique_ptr<caf::actor_system> sys_;
  actors::head_actor head_;
};

}  // namespace weft::testing
