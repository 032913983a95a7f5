#pragma once
/// Cluster authentication: a shared secret that never crosses the wire.
///
/// A node proves it holds the secret by answering the head's random nonce with
/// HMAC-SHA256(secret, nonce || node id). Every request that changes the cluster (spawn, stop)
/// carries HMAC-SHA256(secret, purpose || fields || deadline), checked by the receiver, so a peer
/// that can reach a published port but lacks the secret can neither join nor spawn actors.
/// Thread-safe: all functions are pure.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "schema/status.hpp"

namespace weft::actors {

/// The cluster secret (raw bytes). Empty means "no secret configured".
struct cluster_secret {
  std::string bytes;
  bool empty() const { return bytes.empty(); }
};

/// Loads the secret: `explicit_value` if not empty, else $WEFT_CLUSTER_SECRET, else the file named
/// by `file_path` if given. A secret shorter than 16 bytes is refused.
result<cluster_secret> load_secret(const std::string& explicit_value, const std::string& file_path);

/// A fresh random secret (32 bytes, hex encoded) for a local cluster.
std::string generate_secret_hex();

/// `n` cryptographically random bytes.
std::vector<uint8_t> random_bytes(size_t n);

/// HMAC-SHA256(secret, message).
std::vector<uint8_t> hmac_sha256(const cluster_secret& secret, std::string_view message);

/// Constant-time comparison of two MACs.
bool macs_equal(const std::vector<uint8_t>& a, const uint8_t* b, size_t b_size);

/// The token that authorises a request: HMAC over purpose, the request's identifying fields and its
/// deadline (ms since the epoch). Receivers recompute it and refuse expired deadlines.
std::vector<uint8_t> request_token(const cluster_secret& secret, std::string_view purpose,
                                   std::string_view fields, uint64_t deadline_ms);

/// Checks a request token: right MAC and deadline not passed.
status verify_request_token(const cluster_secret& secret, std::string_view purpose,
                            std::string_view fields, uint64_t deadline_ms, const uint8_t* token,
                            size_t token_size);

/// Milliseconds since the Unix epoch (wall clock; used for deadlines that cross processes).
uint64_t now_ms();

}  // namespace weft::actors
