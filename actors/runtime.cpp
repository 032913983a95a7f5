#include "actors/runtime.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>

#include <thread>

#include "schema/caf_bridge.hpp"

namespace weft::actors {

runtime_config::runtime_config(const runtime_options& options) : options_(options) {
  schema::add_message_types(*this);
  load<caf::io::middleman>();
  if (options.tls) load<caf::openssl::manager>();
  uint32_t threads = options.worker_threads;
  if (threads == 0) threads = std::max(2u, std::thread::hardware_concurrency());
  set("scheduler.max-threads", static_cast<size_t>(threads));
  set("scheduler.policy", caf::atom_from_string(options.scheduler_policy));
  set("middleman.heartbeat-interval",
      caf::timespan{std::chrono::milliseconds(options.heartbeat_interval_ms)});
  set("middleman.connection-timeout",
      caf::timespan{std::chrono::milliseconds(options.connection_timeout_ms)});
  set("middleman.workers", static_cast<size_t>(options.decode_threads));
  // Talk to a remote actor's node directly instead of relaying through the node that introduced
  // it (the head): one hop, and no dependence on the introducer staying up.
  set("middleman.enable-automatic-connections", true);
  // Quiet CAF's own console logger; weft logs through spdlog.
  set("logger.console", caf::atom("none"));
}

}  // namespace weft::actors
