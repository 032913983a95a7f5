#pragma once
/// Options every cluster-facing subcommand shares (secret, timings, TLS) and small parsing helpers.

#include <CLI/CLI.hpp>

#include <string>
#include <utility>

#include "actors/auth.hpp"
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

/// The default secret file of local clusters: $WEFT_CACHE_DIR or ~/.cache/weft, /cluster.secret.
std::string default_secret_file();

}  // namespace weft::apps
