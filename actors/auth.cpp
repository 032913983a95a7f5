#include "actors/auth.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace weft::actors {

result<cluster_secret> load_secret(const std::string& explicit_value,
                                   const std::string& file_path) {
  cluster_secret s;
  if (!explicit_value.empty()) {
    s.bytes = explicit_value;
  } else if (const char* env = std::getenv("WEFT_CLUSTER_SECRET"); env != nullptr && *env) {
    s.bytes = env;
  } else if (!file_path.empty()) {
    std::ifstream in(file_path);
    if (!in) return make_error(errc::not_found, "cannot read secret file '" + file_path + "'");
    std::stringstream ss;
    ss << in.rdbuf();
    s.bytes = ss.str();
    while (!s.bytes.empty() && (s.bytes.back() == '\n' || s.bytes.back() == '\r'))
      s.bytes.pop_back();
  } else {
    return make_error(errc::invalid_argument,
                      "no cluster secret: pass --secret, --secret-file or set WEFT_CLUSTER_SECRET");
  }
  if (s.bytes.size() < 16) {
    return make_error(errc::invalid_argument, "the cluster secret must be at least 16 bytes");
  }
  return s;
}

std::vector<uint8_t> random_bytes(size_t n) {
  std::vector<uint8_t> out(n);
  if (RAND_bytes(out.data(), static_cast<int>(n)) != 1) {
    // OpenSSL's CSPRNG failing is unrecoverable for authentication: refuse to continue silently.
    std::abort();
  }
  return out;
}

std::string generate_secret_hex() {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (uint8_t b : random_bytes(32)) {
    out.push_back(digits[b >> 4]);
    out.push_back(digits[b & 15]);
  }
  return out;
}

std::vector<uint8_t> hmac_sha256(const cluster_secret& secret, std::string_view message) {
  std::vector<uint8_t> mac(EVP_MAX_MD_SIZE);
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.bytes.data(), static_cast<int>(secret.bytes.size()),
       reinterpret_cast<const unsigned char*>(message.data()), message.size(), mac.data(), &len);
  mac.resize(len);
  return mac;
}

bool macs_equal(const std::vector<uint8_t>& a, const uint8_t* b, size_t b_size) {
  return a.size() == b_size && CRYPTO_memcmp(a.data(), b, b_size) == 0;
}

std::vector<uint8_t> request_token(const cluster_secret& secret, std::string_view purpose,
                                   std::string_view fields, uint64_t deadline_ms) {
  std::string msg;
  msg.reserve(purpose.size() + fields.size() + 24);
  msg.append(purpose).push_back('\0');
  msg.append(fields).push_back('\0');
  msg.append(std::to_string(deadline_ms));
  return hmac_sha256(secret, msg);
}

status verify_request_token(const cluster_secret& secret, std::string_view purpose,
                            std::string_view fields, uint64_t deadline_ms, const uint8_t* token,
                            size_t token_size) {
  if (token_size == 0) return make_error(errc::unauthorized, "request carries no token");
  auto expected = request_token(secret, purpose, fields, deadline_ms);
  if (!macs_equal(expected, token, token_size)) {
    return make_error(errc::unauthorized, "request token does not match the cluster secret");
  }
  if (deadline_ms == 0) return make_error(errc::unauthorized, "request token without a deadline");
  if (deadline_ms < now_ms()) {
    return make_error(errc::timeout, "request deadline has passed");
  }
  return {};
}

uint64_t now_ms() {
  using namespace std::chrono;
  return static_cast<uint64_t>(
      duration_cast<milliseconds>(system_clock::now().time_since_epoch()).count());
}

}  // namespace weft::actors
