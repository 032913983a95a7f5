#include "actors/cluster_tls.hpp"

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>

namespace weft::actors {

namespace {

constexpr std::string_view key_label = "weft cluster tls key v1";

struct pem_pair {
  std::string certificate, key;
};

template <class T, void (*Free)(T*)>
struct deleter {
  void operator()(T* p) const { Free(p); }
};
using pkey_ptr = std::unique_ptr<EVP_PKEY, deleter<EVP_PKEY, EVP_PKEY_free>>;
using x509_ptr = std::unique_ptr<X509, deleter<X509, X509_free>>;
using bio_ptr = std::unique_ptr<BIO, deleter<BIO, BIO_free_all>>;

std::string bio_text(BIO* bio) {
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  return n > 0 ? std::string(data, static_cast<size_t>(n)) : std::string{};
}

/// The deterministic key and self-signed certificate of `secret`, as PEM.
result<pem_pair> derive_pem(const cluster_secret& secret) {
  auto seed = hmac_sha256(secret, key_label);
  pkey_ptr pkey(EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nullptr, seed.data(), 32));
  std::fill(seed.begin(), seed.end(), 0);
  if (!pkey) return make_error(errc::internal, "tls: cannot create the Ed25519 key");
  x509_ptr cert(X509_new());
  bool ok = cert && X509_set_version(cert.get(), 2) == 1 &&
            ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), 1) == 1 &&
            ASN1_TIME_set_string(X509_getm_notBefore(cert.get()), "20200101000000Z") == 1 &&
            ASN1_TIME_set_string(X509_getm_notAfter(cert.get()), "21000101000000Z") == 1 &&
            X509_set_pubkey(cert.get(), pkey.get()) == 1;
  X509_NAME* name = ok ? X509_get_subject_name(cert.get()) : nullptr;
  ok = ok && name != nullptr &&
       X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                                  reinterpret_cast<const unsigned char*>("weft-cluster"), -1, -1,
                                  0) == 1 &&
       X509_set_issuer_name(cert.get(), name) == 1;
  if (ok) {
    // The certificate is its own authority: every node presents it and trusts only it.
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, cert.get(), cert.get(), nullptr, nullptr, 0);
    X509_EXTENSION* ext =
        X509V3_EXT_conf_nid(nullptr, &ctx, NID_basic_constraints, "critical,CA:TRUE");
    ok = ext != nullptr && X509_add_ext(cert.get(), ext, -1) == 1;
    if (ext != nullptr) X509_EXTENSION_free(ext);
  }
  // Ed25519 signs deterministically (no digest argument): every node makes the same bytes.
  ok = ok && X509_sign(cert.get(), pkey.get(), nullptr) > 0;
  if (!ok) return make_error(errc::internal, "tls: cannot build the cluster certificate");
  bio_ptr cert_bio(BIO_new(BIO_s_mem()));
  bio_ptr key_bio(BIO_new(BIO_s_mem()));
  if (!cert_bio || !key_bio || PEM_write_bio_X509(cert_bio.get(), cert.get()) != 1 ||
      PEM_write_bio_PrivateKey(key_bio.get(), pkey.get(), nullptr, nullptr, 0, nullptr, nullptr) !=
          1) {
    return make_error(errc::internal, "tls: cannot encode the cluster certificate");
  }
  return pem_pair{bio_text(cert_bio.get()), bio_text(key_bio.get())};
}

/// An anonymous in-memory file holding `text`, named by a path this process can open.
result<std::string> memory_file(const char* name, const std::string& text) {
  int fd = ::memfd_create(name, MFD_CLOEXEC);
  if (fd < 0)
    return make_error(errc::internal, std::string{"tls: memfd_create: "} + std::strerror(errno));
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      return make_error(errc::internal, std::string{"tls: write: "} + std::strerror(errno));
    }
    done += static_cast<size_t>(n);
  }
  // The descriptor stays open for the life of the process: CAF reopens the path per handshake.
  return "/proc/self/fd/" + std::to_string(fd);
}

}  // namespace

result<std::string> derived_certificate_pem(const cluster_secret& secret) {
  auto pem = derive_pem(secret);
  if (!pem) return pem.error();
  return pem->certificate;
}

result<tls_options> derive_cluster_tls(const cluster_secret& secret) {
  if (secret.empty()) return make_error(errc::invalid_argument, "tls: no cluster secret");
  static std::mutex mu;
  static std::map<std::vector<uint8_t>, tls_options> cache;  // keyed by a MAC, not the secret
  auto id = hmac_sha256(secret, "weft cluster tls cache id");
  std::lock_guard lock(mu);
  if (auto it = cache.find(id); it != cache.end()) return it->second;
  auto pem = derive_pem(secret);
  if (!pem) return pem.error();
  auto cert = memory_file("weft-cluster-cert", pem->certificate);
  if (!cert) return cert.error();
  auto key = memory_file("weft-cluster-key", pem->key);
  std::fill(pem->key.begin(), pem->key.end(), '\0');
  if (!key) return key.error();
  tls_options out{true, *cert, *key, *cert};
  cache.emplace(std::move(id), out);
  return out;
}

result<tls_options> cluster_tls(const cluster_secret& secret, const std::string& cert,
                                const std::string& key, const std::string& ca_file) {
  int given = !cert.empty() + !key.empty() + !ca_file.empty();
  if (given == 0) return derive_cluster_tls(secret);
  if (given != 3) {
    return make_error(
        errc::invalid_argument,
        "--tls-cert, --tls-key and --tls-ca go together (got " + std::to_string(given) + " of 3)");
  }
  for (const auto& f : {cert, key, ca_file}) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(f, ec)) {
      return make_error(errc::not_found, "TLS file '" + f + "' does not exist");
    }
  }
  return tls_options{true, cert, key, ca_file};
}

}  // namespace weft::actors
