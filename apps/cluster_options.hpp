#pragma once
/// Options every cluster-facing subcommand shares (secret, timings, TLS) and small parsing helpers.

#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>
#include <caf/actor_system.hpp>

#include <string>
#include <utility>

#include "actors/auth.hpp"
#include "actors/cluster_client.hpp"
#include "actors/host_port.hpp"
#include "actors/node.hpp"
#include "actors/roles.hpp"
#include "actors/runtime.hpp"

namespace weft::apps {

struct cluster_cli {
  std::string secret;
  std::string secret_file;
  uint32_t heartbeat_ms = 200;
  uint32_t connection_timeout_ms = 2000;
  uint32_t threads = 0;
  uint32_t decode_threads = 0;
  std::string helper_sched = "batch";
  std::string tls_cert, tls_key, tls_ca;

  /// Every option: the credentials and the node's timings and threads (`weft node`, `cluster up`).
  void add_to(CLI::App* cmd);
  /// Only what a client needs to reach a cluster: the secret and the TLS files.
  void add_credentials_to(CLI::App* cmd);
  result<actors::cluster_secret> load_secret() const;
  /// Timings and threads, without a TLS identity (see secure_runtime).
  actors::runtime_options runtime() const;
  /// The user's TLS files (enabled when any is given; node::start checks that all three are).
  actors::tls_options tls_settings() const;
  /// runtime() with the TLS identity: the user's files, or derived from `secret`.
  result<actors::runtime_options> secure_runtime(const actors::cluster_secret& secret) const;
};

using actors::parse_host_port;

/// The `--helper-sched` option (`weft node`, `cluster up`, `serve`): the scheduling class of a
/// process's threads other than its compute threads (gpu/cpu/thread_class.hpp).
CLI::Option* add_helper_sched_option(CLI::App* cmd, std::string& value);
/// Applies `--helper-sched` to the calling (main) thread before any other thread starts; a failure
/// is logged and the process runs as before.
void enter_helper_class(const std::string& value);

/// Runs `fn(system, head)` against the head at `head_address` ("HOST:PORT") of the cluster that
/// `cluster`'s credentials name (`weft cluster status/spawn`, `weft chaos --head`). Returns fn's
/// result, 2 for bad credentials or address, 1 when the head cannot be reached.
template <class F>
int with_head(const std::string& head_address, const cluster_cli& cluster, F fn) {
  auto hp = parse_host_port(head_address);
  if (!hp) {
    spdlog::error("--head: {}", hp.error().message);
    return 2;
  }
  // The secret is the credential: the TLS identity derived from it (or the user's certificates)
  // is what lets this client through the head's door.
  auto secret = cluster.load_secret();
  if (!secret) {
    spdlog::error("{}", secret.error().message);
    return 2;
  }
  auto rt = cluster.secure_runtime(*secret);
  if (!rt) {
    spdlog::error("{}", rt.error().message);
    return 2;
  }
  actors::runtime_config cfg(*rt);
  caf::actor_system sys{cfg};
  auto head = actors::connect_head(sys, hp->first, hp->second);
  if (!head) {
    spdlog::error("no weft head at {}:{} for this cluster secret: {}", hp->first, hp->second,
                  head.error().message);
    return 1;
  }
  return fn(sys, *head);
}

/// The default secret file of local clusters: $WEFT_CACHE_DIR or ~/.cache/weft, /cluster.secret.
std::string default_secret_file();

}  // namespace weft::apps
