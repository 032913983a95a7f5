#pragma once
/// The CAF configuration every weft process uses: weft's message types announced, the middleman
/// loaded with its heartbeat switched on (it is off by default in CAF 0.17, which would leave a
/// hung peer undetected), and a scheduler sized for small machines.

#include <caf/actor_cast.hpp>
#include <caf/actor_control_block.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include <cstdint>
#include <set>
#include <string>

#include "actors/cluster_tls.hpp"

namespace weft::actors {

/// Failure-detection and scheduling settings (documented in docs/runtime.md).
struct runtime_options {
  /// CAF worker threads; 0 = hardware concurrency.
  uint32_t worker_threads = 0;
  /// "sharing" (lower latency on small VMs, STACK_NOTES) or "stealing".
  std::string scheduler_policy = "sharing";
  /// BASP heartbeat between connected processes.
  uint32_t heartbeat_interval_ms = 200;
  /// A connection with no traffic (heartbeats included) for this long is closed.
  uint32_t connection_timeout_ms = 2'000;
  /// Threads that decode incoming remote messages (CAF `middleman.workers`). 0 = the network
  /// thread decodes and delivers them itself: one thread hop fewer per message (cross-process
  /// round trip 94 -> 70 us on the 2-vCPU VM, docs/runtime.md). Raise it when a process receives
  /// many large actor messages (bulk tensors never travel as actor messages in weft).
  uint32_t decode_threads = 0;
  /// Mutual TLS of every connection (docs/security.md). A process without it can neither
  /// publish an actor nor connect to one: weft has no plain-TCP path.
  tls_options tls;
};

/// An actor_system_config for weft. Construct, adjust, then create the caf::actor_system.
class runtime_config : public caf::actor_system_config {
 public:
  explicit runtime_config(const runtime_options& options = {});
  const runtime_options& options() const { return options_; }

 private:
  runtime_options options_;
};

/// Runtime options for a process of the cluster keyed by `secret`: `base` with the TLS identity
/// derived from the secret, or the user's PEM files when all three are given.
result<runtime_options> secure_runtime(runtime_options base, const cluster_secret& secret,
                                       const std::string& cert = {}, const std::string& key = {},
                                       const std::string& ca_file = {});

/// Publishes an actor on host:port over mutual TLS (port 0 = any); returns the port. Refuses a
/// system whose config has no TLS identity.
result<uint16_t> publish_actor(caf::actor_system& sys, const caf::strong_actor_ptr& whom,
                               std::set<std::string> signatures, uint16_t port,
                               const std::string& host);
template <class Handle>
result<uint16_t> publish_actor(caf::actor_system& sys, const Handle& whom, uint16_t port,
                               const std::string& host) {
  return publish_actor(sys, caf::actor_cast<caf::strong_actor_ptr>(whom), sys.message_types(whom),
                       port, host);
}

/// Connects to an actor published at host:port over mutual TLS. Errors name the address and say
/// when the handshake failed (a peer of another cluster, or without TLS).
result<caf::strong_actor_ptr> connect_actor(caf::actor_system& sys,
                                            const std::set<std::string>& signatures,
                                            const std::string& host, uint16_t port);
template <class Handle = caf::actor>
result<Handle> connect_actor(caf::actor_system& sys, const std::string& host, uint16_t port) {
  caf::detail::type_list<Handle> tk;
  auto h = connect_actor(sys, sys.message_types(tk), host, port);
  if (!h) return h.error();
  return caf::actor_cast<Handle>(std::move(*h));
}

}  // namespace weft::actors
