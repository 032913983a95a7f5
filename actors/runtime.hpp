#pragma once
/// The CAF configuration every weft process uses: weft's message types announced, the middleman
/// loaded with its heartbeat switched on (it is off by default in CAF 0.17, which would leave a
/// hung peer undetected), and a scheduler sized for small machines.

#include <caf/actor_system_config.hpp>

#include <cstdint>
#include <string>

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
  /// Load CAF's OpenSSL module (TLS between hosts).
  bool tls = false;
};

/// An actor_system_config for weft. Construct, adjust, then create the caf::actor_system.
class runtime_config : public caf::actor_system_config {
 public:
  explicit runtime_config(const runtime_options& options = {});
  const runtime_options& options() const { return options_; }

 private:
  runtime_options options_;
};

}  // namespace weft::actors
