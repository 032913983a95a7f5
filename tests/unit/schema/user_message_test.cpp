// Messages of an embedder's own Cap'n Proto schema (kind::user): built and read like weft's own,
// validated against the reader's type, and every malformed or mismatched body is an error value.

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "schema/envelope.hpp"
#include "tests/unit/schema/user_message_test.capnp.h"

namespace weft::schema {
namespace {

envelope sample_request() {
  return envelope::build_user<weft_test_user::JudgeRequest>([](auto b) {
    b.setId(7);
    b.setPrompt("is 2+2 four?");
    auto scores = b.initScores(3);
    for (uint32_t i = 0; i < 3; ++i) scores.set(i, 0.5f * static_cast<float>(i));
  });
}

TEST(user_message, builds_and_reads_in_process_and_through_bytes) {
  auto env = sample_request();
  EXPECT_EQ(env.what(), kind::user);
  EXPECT_EQ(env.user_type_id(), capnp::typeId<weft_test_user::JudgeRequest>());
  for (const auto& e : {env, envelope::from_bytes(kind::user, env.to_bytes())}) {
    auto v = e.read_user<weft_test_user::JudgeRequest>();
    ASSERT_TRUE(v.ok()) << v.error().to_string();
    EXPECT_EQ(v->get().getId(), 7u);
    EXPECT_STREQ(v->get().getPrompt().cStr(), "is 2+2 four?");
    ASSERT_EQ(v->get().getScores().size(), 3u);
    EXPECT_FLOAT_EQ(v->get().getScores()[2], 1.0f);
  }
}

TEST(user_message, a_body_of_another_type_is_refused_by_name) {
  auto env = envelope::from_bytes(kind::user, sample_request().to_bytes());
  auto v = env.read_user<weft_test_user::JudgeReply>();
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.error().code, errc::malformed);
  EXPECT_NE(v.error().message.find("JudgeReply"), std::string::npos) << v.error().message;
  // Neither is it a weft message, nor a weft message a user one.
  EXPECT_FALSE(env.read<wire::Ping>().ok());
  auto ping = envelope::build<wire::Ping>([](wire::Ping::Builder b) { b.setSeq(1); });
  EXPECT_FALSE(ping.read_user<weft_test_user::JudgeRequest>().ok());
  EXPECT_EQ(ping.user_type_id(), 0u);
}

TEST(user_message, a_body_is_validated_against_the_readers_schema) {
  auto bad_enum = envelope::build_user<weft_test_user::JudgeReply>([](auto b) {
    b.setId(1);
    b.setVerdict(static_cast<weft_test_user::Verdict>(9));
  });
  auto v =
      envelope::from_bytes(kind::user, bad_enum.to_bytes()).read_user<weft_test_user::JudgeReply>();
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.error().message.find("enum"), std::string::npos) << v.error().message;

  auto bad_text = envelope::build_user<weft_test_user::JudgeReply>([](auto b) {
    const char invalid[] = {'o', 'k', static_cast<char>(0xC3), 0};
    b.setReason(invalid);
  });
  auto t =
      envelope::from_bytes(kind::user, bad_text.to_bytes()).read_user<weft_test_user::JudgeReply>();
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.error().message.find("UTF-8"), std::string::npos) << t.error().message;

  decode_limits small;
  small.max_text_bytes = 4;
  auto long_text = sample_request().read_user<weft_test_user::JudgeRequest>(small);
  ASSERT_FALSE(long_text.ok());
  EXPECT_NE(long_text.error().message.find("JudgeRequest.prompt"), std::string::npos)
      << long_text.error().message;
}

TEST(user_message, hostile_bytes_never_crash) {
  auto bytes = sample_request().to_bytes();
  // Truncations.
  for (size_t n = 0; n < bytes.size(); n += 8) {
    auto e = envelope::from_bytes(kind::user, std::span(bytes.data(), n));
    (void)e.read_user<weft_test_user::JudgeRequest>();
    (void)e.user_type_id();
  }
  // Random byte flips: some decode (a flipped score), none crashes.
  std::mt19937 rng(3);
  int decoded = 0;
  for (int round = 0; round < 5000; ++round) {
    auto copy = bytes;
    for (int k = 0; k < 3; ++k) copy[rng() % copy.size()] = static_cast<std::byte>(rng() & 0xFF);
    auto v = envelope::from_bytes(kind::user, copy).read_user<weft_test_user::JudgeRequest>();
    if (v.ok()) {
      ++decoded;
      (void)v->get().getPrompt().size();
    }
  }
  EXPECT_GT(decoded, 0);
}

}  // namespace
}  // namespace weft::schema
