#pragma once
/// Options every cluster-facing subcommand shares (secret, timings, TLS) and small parsing helpers.

#include <CLI/CLI.hpp>

#include <string>
#include <utility>

#include "actors/auth.hpp"
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
  bool tls = false;
  std::string tls_cert, tls_key, tls_ca;

  void add_to(CLI::App* cmd);
  result<actors::cluster_secret> load_secret() const;
  actors::runtime_options runtime() const;
  actors::tls_options tls_settings() const;
};

/// "host:port" -> (host, port).
result<std::pair<std::string, uint16_t>> parse_host_port(const std::string& s);

/// The default secret file of local clusters: $WEFT_CACHE_DIR or ~/.cache/weft, /cluster.secret.
std::string default_secret_file();

}  // namespace weft::apps
