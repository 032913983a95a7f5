#include <gtest/gtest.h>

#include "actors/auth.hpp"

namespace weft::actors {
namespace {

cluster_secret secret(const char* s) {
  return cluster_secret{s};
}

TEST(auth, token_verifies_with_the_same_secret_only) {
  auto s = secret("0123456789abcdef-secret");
  uint64_t deadline = now_ms() + 10'000;
  auto token = request_token(s, "spawn", "1|echo|a", deadline);
  EXPECT_TRUE(
      verify_request_token(s, "spawn", "1|echo|a", deadline, token.data(), token.size()).ok());
  auto other = secret("another-secret-of-16+");
  auto st = verify_request_token(other, "spawn", "1|echo|a", deadline, token.data(), token.size());
  EXPECT_EQ(st.code, errc::unauthorized);
}

TEST(auth, token_binds_purpose_fields_and_deadline) {
  auto s = secret("0123456789abcdef-secret");
  uint64_t deadline = now_ms() + 10'000;
  auto token = request_token(s, "spawn", "1|echo|a", deadline);
  EXPECT_FALSE(
      verify_request_token(s, "stop", "1|echo|a", deadline, token.data(), token.size()).ok());
  EXPECT_FALSE(
      verify_request_token(s, "spawn", "1|echo|b", deadline, token.data(), token.size()).ok());
  EXPECT_FALSE(
      verify_request_token(s, "spawn", "1|echo|a", deadline + 1, token.data(), token.size()).ok());
  EXPECT_FALSE(verify_request_token(s, "spawn", "1|echo|a", deadline, token.data(), 0).ok());
}

TEST(auth, expired_deadline_is_refused) {
  auto s = secret("0123456789abcdef-secret");
  uint64_t deadline = now_ms() - 1;
  auto token = request_token(s, "spawn", "x", deadline);
  EXPECT_EQ(verify_request_token(s, "spawn", "x", deadline, token.data(), token.size()).code,
            errc::timeout);
}

TEST(auth, secrets_must_be_long_enough) {
  EXPECT_FALSE(load_secret("short", "").ok());
  EXPECT_TRUE(load_secret("0123456789abcdef", "").ok());
  EXPECT_FALSE(load_secret("", "/nonexistent/secret").ok());
  EXPECT_EQ(generate_secret_hex().size(), 64u);
  EXPECT_NE(generate_secret_hex(), generate_secret_hex());
}

}  // namespace
}  // namespace weft::actors
