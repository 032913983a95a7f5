#pragma once
/// Mutual TLS for every connection between weft processes, keyed by the cluster secret.
///
/// Every process that holds the cluster secret derives the same Ed25519 key from it
/// (HMAC-SHA256(secret, label)) and the same self-signed certificate (fixed subject, serial and
/// validity; Ed25519 signatures are deterministic), and trusts exactly that certificate. CAF's
/// OpenSSL module then requires a certificate from both sides of every connection, so a peer
/// without the secret fails the TLS handshake before a single actor message is read. Users with
/// their own CA pass PEM files instead (`--tls-cert --tls-key --tls-ca`). See docs/security.md.
///
/// The derived key and certificate never touch the disk: they live in anonymous memory files
/// (memfd) of this process, named by /proc/self/fd/N paths that CAF opens on every handshake.
/// Thread-safe; no CAF in this header.

#include <string>

#include "actors/auth.hpp"
#include "schema/status.hpp"

namespace weft::actors {

/// PEM files of one node's TLS identity and of the authority it trusts.
struct tls_options {
  bool enabled = false;
  std::string certificate;  ///< PEM file of this node's certificate
  std::string key;          ///< PEM file of its private key
  std::string
      ca_file;  ///< PEM file of the CA (or the cluster certificate) every peer must chain to
};

/// The TLS identity derived from `secret` (cached per secret; the same files on every call).
result<tls_options> derive_cluster_tls(const cluster_secret& secret);

/// The user's PEM files when all three are given, the identity derived from `secret` when none is,
/// an error naming what is missing otherwise (or when a file cannot be read).
result<tls_options> cluster_tls(const cluster_secret& secret, const std::string& cert,
                                const std::string& key, const std::string& ca_file);

/// PEM text of the certificate derived from `secret` (tests compare it across processes).
result<std::string> derived_certificate_pem(const cluster_secret& secret);

}  // namespace weft::actors
