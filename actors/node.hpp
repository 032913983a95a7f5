#pragma once
/// A weft node in one object: the actor system, the node agent, optionally the head, publishing
/// and joining. What `weft node` runs, and what an embedder creates to put weft's actors next to
/// their own.
///
///   auto roles = std::make_shared<weft::actors::role_registry>();
///   weft::actors::add_builtin_roles(*roles);
///   auto n = weft::actors::node::start(opts, roles);   // joins the head at opts.join_*
///   caf::actor_system& sys = (*n)->system();           // spawn your own actors here

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "actors/auth.hpp"
#include "actors/head.hpp"
#include "actors/interfaces.hpp"
#include "actors/roles.hpp"
#include "actors/runtime.hpp"

namespace weft::actors {

struct node_options {
  std::string node_id;   ///< default: "<host>-<pid>"
  bool is_head = false;  ///< also run the head (membership, placement, supervisors)
  std::string bind_host = "127.0.0.1";
  uint16_t head_port = 7070;  ///< where the head is published (is_head only; 0 = any)
  uint16_t agent_port = 0;    ///< where the node agent is published (0 = any free port)
  std::string join_host = "127.0.0.1";
  uint16_t join_port = 0;          ///< head to join (not is_head); is_head joins itself
  std::vector<std::string> roles;  ///< roles accepted here (empty = all in the table)
  cluster_secret secret;
  runtime_options runtime;
  head_config head;  ///< head timings (is_head only)
  /// The node's TLS identity: the user's PEM files when `tls.enabled`, else derived from `secret`
  /// (every connection is mutual TLS either way; docs/security.md).
  tls_options tls;
  std::string build_version;
  /// Data-plane engine of the node ("ucx", "inproc", "fault:ucx", ... or "none") and its params
  /// (e.g. {"ucx.tls", "tcp"}); see transport/registry.hpp.
  std::string transport = "ucx";
  std::map<std::string, std::string> transport_params;
};

class node {
 public:
  /// Starts the node: actor system, agent, head (if is_head), publish, join. Errors name the step.
  static result<std::unique_ptr<node>> start(node_options opts,
                                             std::shared_ptr<const role_registry> roles);
  ~node();
  node(const node&) = delete;
  node& operator=(const node&) = delete;

  caf::actor_system& system();
  const node_options& options() const { return opts_; }
  node_agent_actor agent() const;
  /// The head this node joined (a proxy, or the local head when is_head).
  head_actor head() const;
  uint16_t head_port() const { return head_port_; }
  uint16_t agent_port() const { return agent_port_; }

  /// Calls `fn` (from a CAF thread) if the connection to the head is lost.
  void on_head_lost(std::function<void(const std::string& why)> fn);

 private:
  node() = default;
  struct impl;
  std::unique_ptr<impl> impl_;
  node_options opts_;
  uint16_t head_port_ = 0;
  uint16_t agent_port_ = 0;
};

}  // namespace weft::actors
