#include "apps/cluster_options.hpp"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <filesystem>

#include "gpu/cpu/thread_class.hpp"

namespace weft::apps {

void cluster_cli::add_credentials_to(CLI::App* cmd) {
  cmd->add_option("--secret", secret, "Cluster secret (or WEFT_CLUSTER_SECRET, or --secret-file)");
  cmd->add_option("--secret-file", secret_file, "File holding the cluster secret")
      ->default_str(default_secret_file());
  // Every connection is mutual TLS; without these three the identity is derived from the secret.
  cmd->add_option("--tls-cert", tls_cert,
                  "PEM certificate of this node, signed by --tls-ca (default: derived from the "
                  "cluster secret)");
  cmd->add_option("--tls-key", tls_key, "PEM private key of this node (with --tls-cert)");
  cmd->add_option("--tls-ca", tls_ca, "PEM CA file that signed every node (with --tls-cert)");
}

void cluster_cli::add_to(CLI::App* cmd) {
  add_credentials_to(cmd);
  cmd->add_option("--heartbeat-ms", heartbeat_ms, "Heartbeat interval (node->head and CAF BASP)")
      ->capture_default_str();
  cmd->add_option("--connection-timeout-ms", connection_timeout_ms,
                  "Close a silent connection after this long")
      ->capture_default_str();
  cmd->add_option("--threads", threads, "CAF scheduler threads (0 = cores)")->capture_default_str();
  cmd->add_option(
         "--decode-threads", decode_threads,
         "Threads decoding incoming actor messages (0 = the network thread, lowest latency)")
      ->capture_default_str();
  add_helper_sched_option(cmd, helper_sched);
}

CLI::Option* add_helper_sched_option(CLI::App* cmd, std::string& value) {
  return cmd
      ->add_option("--helper-sched", value,
                   "Scheduling class of the threads that do not run forward passes (network, "
                   "actors, HTTP): batch = SCHED_BATCH, so their wake-ups do not preempt the "
                   "compute threads (same CPU share); normal = the OS default")
      ->check(CLI::IsMember({"batch", "normal"}))
      ->capture_default_str();
}

void enter_helper_class(const std::string& value) {
  gpu::cpu::helper_sched s = gpu::cpu::helper_sched::normal;
  if (!gpu::cpu::parse_helper_sched(value, s)) return;  // CLI's check refused it already
  if (auto why = gpu::cpu::enter_helper_class(s); !why.empty())
    spdlog::warn("--helper-sched {}: {}", value, why);
}

result<actors::cluster_secret> cluster_cli::load_secret() const {
  return actors::load_secret(secret, secret_file.empty() ? default_secret_file() : secret_file);
}

actors::runtime_options cluster_cli::runtime() const {
  actors::runtime_options rt;
  rt.heartbeat_interval_ms = heartbeat_ms;
  rt.connection_timeout_ms = connection_timeout_ms;
  rt.worker_threads = threads;
  rt.decode_threads = decode_threads;
  return rt;
}

actors::tls_options cluster_cli::tls_settings() const {
  bool any = !tls_cert.empty() || !tls_key.empty() || !tls_ca.empty();
  return actors::tls_options{any, tls_cert, tls_key, tls_ca};
}

result<actors::runtime_options> cluster_cli::secure_runtime(
    const actors::cluster_secret& secret) const {
  return actors::secure_runtime(runtime(), secret, tls_cert, tls_key, tls_ca);
}

std::string default_secret_file() {
  const char* cache = std::getenv("WEFT_CACHE_DIR");
  std::filesystem::path dir;
  if (cache != nullptr && *cache) {
    dir = cache;
  } else if (const char* home = std::getenv("HOME"); home != nullptr && *home) {
    dir = std::filesystem::path(home) / ".cache" / "weft";
  } else {
    dir = "/tmp/weft";
  }
  return (dir / "cluster.secret").string();
}

}  // namespace weft::apps
