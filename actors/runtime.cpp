#include "actors/runtime.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <caf/openssl/all.hpp>

#include <dlfcn.h>
#include <netdb.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <thread>

#include "schema/caf_bridge.hpp"

// -- CAF 0.17's OpenSSL sessions and OpenSSL 3's error queue ------------------------------------
//
// OpenSSL requires the calling thread's error queue to be empty before SSL_read/SSL_write/
// SSL_accept/SSL_connect, or SSL_get_error() misreports the result. CAF 0.17 never clears it, and
// OpenSSL 3 queues an error whenever a peer closes without close_notify — so the first peer that
// simply exits leaves an error behind, and the next "would block" on any other TLS connection of
// that network thread reads as a fatal error: CAF drops a healthy link (measured: one short-lived
// client killed a node's link to the head; see docs/security.md). These definitions take the
// place of OpenSSL's for CAF (the executable's symbols come first in the dynamic lookup), clear
// the queue, and call OpenSSL's own.
namespace {

template <class Fn>
Fn next_openssl_symbol(const char* name) {
  void* p = ::dlsym(RTLD_NEXT, name);
  if (p == nullptr) {
    std::fprintf(stderr, "weft: cannot find OpenSSL's %s: %s\n", name, ::dlerror());
    std::abort();
  }
  return reinterpret_cast<Fn>(p);
}

}  // namespace

extern "C" {

int SSL_read(SSL* ssl, void* buf, int num) {
  static auto real = next_openssl_symbol<int (*)(SSL*, void*, int)>("SSL_read");
  ERR_clear_error();
  return real(ssl, buf, num);
}

int SSL_write(SSL* ssl, const void* buf, int num) {
  static auto real = next_openssl_symbol<int (*)(SSL*, const void*, int)>("SSL_write");
  ERR_clear_error();
  return real(ssl, buf, num);
}

int SSL_accept(SSL* ssl) {
  static auto real = next_openssl_symbol<int (*)(SSL*)>("SSL_accept");
  ERR_clear_error();
  return real(ssl);
}

int SSL_connect(SSL* ssl) {
  static auto real = next_openssl_symbol<int (*)(SSL*)>("SSL_connect");
  ERR_clear_error();
  return real(ssl);
}

// -- Read-ahead on CAF's sessions -----------------------------------------------------------------
//
// Without read-ahead OpenSSL reads every TLS record with two read() calls (its 5-byte header, then
// the body). With it, one read() takes whatever the socket holds. CAF 0.17's stream loop stops
// after 50 reads unless `session::must_read_more`, i.e. SSL_pending() >= the bytes it still wants,
// and SSL_pending() counts only the current decrypted record: records that OpenSSL read ahead but
// has not decrypted yet would sit in its buffer with the socket empty, and no event would ever wake
// the loop for them. So on CAF's sessions (the only callers of SSL_set_fd in weft; cpp-httplib uses
// SSL_set_bio) read-ahead is on, and SSL_pending() also says "more" while such bytes are buffered —
// CAF then reads on until SSL_read() needs the socket and reports "would block" (a partial record
// is completed by the next read event, as before).
int SSL_set_fd(SSL* ssl, int fd) {
  static auto real = next_openssl_symbol<int (*)(SSL*, int)>("SSL_set_fd");
  const int ok = real(ssl, fd);
  if (ok == 1) SSL_set_read_ahead(ssl, 1);
  return ok;
}

int SSL_pending(const SSL* ssl) {
  static auto real = next_openssl_symbol<int (*)(const SSL*)>("SSL_pending");
  const int n = real(ssl);
  if (n == 0 && SSL_get_read_ahead(ssl) != 0 && SSL_has_pending(ssl) != 0)
    return std::numeric_limits<int>::max();
  return n;
}

}  // extern "C"

namespace weft::actors {

runtime_config::runtime_config(const runtime_options& options) : options_(options) {
  schema::add_message_types(*this);
  load<caf::io::middleman>();
  if (options.tls.enabled) {
    load<caf::openssl::manager>();
    // CAF 0.17 reads these members when a TLS session starts.
    openssl_certificate = options.tls.certificate;
    openssl_key = options.tls.key;
    openssl_cafile = options.tls.ca_file;
  }
  uint32_t threads = options.worker_threads;
  if (threads == 0) threads = std::max(2u, std::thread::hardware_concurrency());
  set("scheduler.max-threads", static_cast<size_t>(threads));
  set("scheduler.policy", caf::atom_from_string(options.scheduler_policy));
  set("middleman.heartbeat-interval",
      caf::timespan{std::chrono::milliseconds(options.heartbeat_interval_ms)});
  set("middleman.connection-timeout",
      caf::timespan{std::chrono::milliseconds(options.connection_timeout_ms)});
  set("middleman.workers", static_cast<size_t>(options.decode_threads));
  // No automatic connections: CAF 0.17 opens them as plain TCP (they cannot pass a TLS door), so
  // messages to an actor on a third node relay through the node that introduced it.
  set("middleman.enable-automatic-connections", false);
  // Quiet CAF's own console logger; weft logs through spdlog.
  set("logger.console", caf::atom("none"));
}

namespace {

bool has_tls(caf::actor_system& sys) {
  auto* cfg = dynamic_cast<const runtime_config*>(&sys.config());
  return cfg != nullptr && cfg->options().tls.enabled;
}

/// True if a plain TCP connection to host:port succeeds within a second.
bool tcp_port_open(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0) return false;
  bool open = false;
  for (addrinfo* a = res; a != nullptr && !open; a = a->ai_next) {
    int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      open = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof(err);
      open = ::poll(&p, 1, 1000) == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 &&
             err == 0;
    }
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return open;
}

const char* no_tls =
    "this actor system has no TLS identity (weft talks mutual TLS only; see docs/security.md)";

}  // namespace

result<runtime_options> secure_runtime(runtime_options base, const cluster_secret& secret,
                                       const std::string& cert, const std::string& key,
                                       const std::string& ca_file) {
  auto tls = cluster_tls(secret, cert, key, ca_file);
  if (!tls) return tls.error();
  base.tls = *tls;
  return base;
}

result<uint16_t> publish_actor(caf::actor_system& sys, const caf::strong_actor_ptr& whom,
                               std::set<std::string> signatures, uint16_t port,
                               const std::string& host) {
  std::string where = host + ":" + std::to_string(port);
  if (!has_tls(sys))
    return make_error(errc::unauthorized, "cannot publish on " + where + ": " + no_tls);
  if (!whom)
    return make_error(errc::invalid_argument, "cannot publish an invalid actor on " + where);
  auto p = caf::openssl::publish(sys, whom, std::move(signatures), port, host.c_str(), true);
  if (!p)
    return make_error(errc::unavailable,
                      "cannot publish on " + where + ": " + sys.render(p.error()));
  return *p;
}

result<caf::strong_actor_ptr> connect_actor(caf::actor_system& sys,
                                            const std::set<std::string>& signatures,
                                            const std::string& host, uint16_t port) {
  std::string where = host + ":" + std::to_string(port);
  if (!has_tls(sys)) return make_error(errc::unauthorized, "cannot reach " + where + ": " + no_tls);
  // A refused certificate is final; anything else (a handshake that lost a race with a busy or
  // just-flooded acceptor, a timeout) is tried again twice, with a short pause.
  const char* refused =
      "the TLS handshake failed (the peer refused our certificate, or is not a weft node of this "
      "cluster: check the cluster secret)";
  std::string why;
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(100 * attempt));
    auto h = caf::openssl::remote_actor(sys, signatures, host, port);
    if (h) return *h;
    if (h.error() == caf::sec::disconnect_during_handshake) {
      why = refused;
      break;
    }
    if (h.error() == caf::sec::cannot_connect_to_node) {
      // CAF reports a TLS handshake refused early the same way as a closed port: tell them apart.
      if (!tcp_port_open(host, port)) {
        why = "nothing accepts connections there";
        break;
      }
      why = refused;
      continue;
    }
    why = sys.render(h.error()) +
          (tcp_port_open(host, port)
               ? " (something listens there: if it is a weft node, check the cluster secret)"
               : "");
  }
  return make_error(errc::unavailable, "cannot reach " + where + ": " + why);
}

}  // namespace weft::actors
