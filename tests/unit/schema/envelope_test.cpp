// Envelope round trips and malformed input: every failure is an error value, never a crash.

#include <gtest/gtest.h>

#include <random>

#include "schema/envelope.hpp"

namespace weft::schema {
namespace {

envelope sample_spawn() {
  return envelope::build<wire::SpawnRequest>([](wire::SpawnRequest::Builder b) {
    b.setRequestId(42);
    b.setRole("echo");
    b.setName("echo-1");
    b.setConfigJson(R"({"k": 1})");
    b.setDeadlineMs(1234);
    uint8_t token[4] = {1, 2, 3, 4};
    b.setSessionToken(kj::arrayPtr(token, 4));
  });
}

TEST(envelope, builds_and_reads_in_process_without_copy) {
  auto env = sample_spawn();
  auto copy = env;  // shares the built message
  auto v = copy.read<wire::SpawnRequest>();
  ASSERT_TRUE(v.ok()) << v.error().to_string();
  EXPECT_EQ(v->get().getRequestId(), 42u);
  EXPECT_STREQ(v->get().getRole().cStr(), "echo");
  EXPECT_EQ(v->get().getSessionToken().size(), 4u);
}

TEST(envelope, round_trips_through_bytes) {
  auto env = sample_spawn();
  auto bytes = env.to_bytes();
  EXPECT_EQ(bytes.size(), env.size_bytes());
  auto back = envelope::from_bytes(kind::spawn_request, bytes);
  auto v = back.read<wire::SpawnRequest>();
  ASSERT_TRUE(v.ok()) << v.error().to_string();
  EXPECT_STREQ(v->get().getName().cStr(), "echo-1");
  EXPECT_STREQ(v->get().getConfigJson().cStr(), R"({"k": 1})");
}

template <class T, class F>
void expect_round_trip(F fill) {
  auto env = envelope::build<T>(fill);
  auto back = envelope::from_bytes(env.what(), env.to_bytes());
  EXPECT_EQ(back.to_bytes(), env.to_bytes()) << to_string(env.what());
  auto v = back.template read<T>();
  EXPECT_TRUE(v.ok()) << to_string(env.what()) << ": " << v.error().to_string();
}

TEST(envelope, every_kind_round_trips) {
  expect_round_trip<wire::Error>([](auto b) { b.setCode(wire::ErrorCode::TIMEOUT); });
  expect_round_trip<wire::JoinChallenge>([](auto b) { b.setHeadId("h"); });
  expect_round_trip<wire::JoinRequest>([](auto b) { b.initNode().setNodeId("n"); });
  expect_round_trip<wire::JoinReply>([](auto b) { b.setAccepted(true); });
  expect_round_trip<wire::LeaveNotice>([](auto b) { b.setNodeId("n"); });
  expect_round_trip<wire::Heartbeat>([](auto b) { b.setSeq(7); });
  expect_round_trip<wire::SpawnReply>([](auto b) { b.setOk(true); });
  expect_round_trip<wire::StopRequest>([](auto b) { b.setName("x"); });
  expect_round_trip<wire::ActorStatus>([](auto b) { b.setState(wire::ActorState::FAILED); });
  expect_round_trip<wire::NodeStatus>([](auto b) {
    auto n = b.initNode();
    n.setNodeId("n");
    n.initRoles(2).set(0, "echo");
  });
  expect_round_trip<wire::ClusterStatus>([](auto b) { b.initNodes(3); });
  expect_round_trip<wire::RegionDescriptor>([](auto b) { b.setSizeBytes(64); });
  expect_round_trip<wire::TransferRequest>([](auto b) { b.setTransferId(1); });
  expect_round_trip<wire::TransferReply>([](auto b) { b.setOk(true); });
  expect_round_trip<wire::Ping>([](auto b) { b.setSeq(1); });
  expect_round_trip<wire::SupervisorSpec>([](auto b) { b.initChildren(2); });
  expect_round_trip<wire::SupervisorStatus>([](auto b) { b.setName("s"); });
  auto err = error_from(make_error_envelope(make_error(errc::timeout, "late")));
  EXPECT_EQ(err.code, errc::timeout);
  EXPECT_EQ(err.message, "late");
  EXPECT_TRUE(error_from(sample_spawn()).ok());
}

TEST(envelope, wrong_kind_is_an_error) {
  auto env = sample_spawn();
  auto v = env.read<wire::Heartbeat>();
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.error().code, errc::malformed);
  EXPECT_NE(v.error().message.find("Heartbeat"), std::string::npos);
}

TEST(envelope, truncated_bytes_are_rejected_at_every_length) {
  auto bytes = sample_spawn().to_bytes();
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto env = envelope::from_bytes(kind::spawn_request, std::span(bytes.data(), n));
    auto v = env.read<wire::SpawnRequest>();
    EXPECT_FALSE(v.ok()) << "length " << n;
  }
}

TEST(envelope, random_bytes_never_crash) {
  std::mt19937_64 rng(1);
  auto good = sample_spawn().to_bytes();
  int accepted = 0, rejected = 0;
  for (int i = 0; i < 5000; ++i) {
    auto bytes = good;
    int flips = 1 + static_cast<int>(rng() % 8);
    for (int f = 0; f < flips; ++f) bytes[rng() % bytes.size()] = std::byte(rng() & 0xFF);
    auto v = envelope::from_bytes(kind::spawn_request, bytes).read<wire::SpawnRequest>();
    if (v.ok()) {
      ++accepted;
      // A validated view is safe to read, every field of it.
      (void)v->get().getRole().size();
      (void)v->get().getConfigJson().size();
      (void)v->get().getSessionToken().size();
    } else {
      ++rejected;
      // A refusal is an explicit error reply: malformed, with a message that says why.
      EXPECT_EQ(v.error().code, errc::malformed) << v.error().to_string();
      EXPECT_FALSE(v.error().message.empty());
    }
  }
  EXPECT_EQ(accepted + rejected, 5000);
  // Byte flips in a ~100-byte message must hit pointers and lengths often: a decoder that refused
  // none of them would not be checking anything.
  EXPECT_GT(rejected, 500) << accepted << " accepted";
}

TEST(envelope, unknown_enum_value_is_rejected) {
  auto env = envelope::build<wire::Error>([](wire::Error::Builder b) {
    b.setCode(static_cast<wire::ErrorCode>(999));
    b.setMessage("x");
  });
  auto v = envelope::from_bytes(kind::error, env.to_bytes()).read<wire::Error>();
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.error().message.find("enum"), std::string::npos) << v.error().message;
}

TEST(envelope, invalid_utf8_text_is_rejected) {
  auto env = envelope::build<wire::LeaveNotice>(
      [](wire::LeaveNotice::Builder b) { b.setNodeId(capnp::Text::Reader("\xff\xfe bad", 6)); });
  auto v = envelope::from_bytes(kind::leave_notice, env.to_bytes()).read<wire::LeaveNotice>();
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.error().message.find("UTF-8"), std::string::npos);
}

TEST(envelope, oversized_lists_and_texts_are_rejected) {
  auto env = envelope::build<wire::ClusterStatus>(
      [](wire::ClusterStatus::Builder b) { b.initNodes(100); });
  decode_limits tight;
  tight.max_list_elements = 10;
  auto v =
      envelope::from_bytes(kind::cluster_status, env.to_bytes()).read<wire::ClusterStatus>(tight);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.error().message.find("list"), std::string::npos);

  auto big = envelope::build<wire::LeaveNotice>(
      [](wire::LeaveNotice::Builder b) { b.setReason(std::string(100'000, 'a')); });
  auto v2 = big.read<wire::LeaveNotice>();
  ASSERT_FALSE(v2.ok());
  EXPECT_NE(v2.error().message.find("reason"), std::string::npos) << v2.error().message;
}

TEST(envelope, size_limit_and_alignment) {
  std::vector<std::byte> odd(13, std::byte{0});
  auto v = envelope::from_bytes(kind::ping, odd).read<wire::Ping>();
  ASSERT_FALSE(v.ok());
  decode_limits small;
  small.max_size_bytes = 8;
  auto v2 = envelope::from_bytes(kind::spawn_request, sample_spawn().to_bytes())
                .read<wire::SpawnRequest>(small);
  ASSERT_FALSE(v2.ok());
  EXPECT_NE(v2.error().message.find("exceeds"), std::string::npos);
  auto over = envelope::oversize(1 << 30).read<wire::Ping>();
  ASSERT_FALSE(over.ok());
}

TEST(envelope, unknown_kind_is_rejected) {
  auto bytes = sample_spawn().to_bytes();
  auto st = internal::open_reader(nullptr, static_cast<kind>(200), {});
  EXPECT_FALSE(st.ok());
  auto env = envelope::from_bytes(static_cast<kind>(200), bytes);
  EXPECT_FALSE(env.read<wire::Ping>().ok());
}

TEST(envelope, nesting_limit_applies) {
  auto env = envelope::build<wire::ClusterStatus>([](wire::ClusterStatus::Builder b) {
    auto nodes = b.initNodes(1);
    nodes[0].initNode().initDevices(1)[0].setName("gpu");
  });
  decode_limits shallow;
  shallow.nesting_limit = 2;
  auto v =
      envelope::from_bytes(kind::cluster_status, env.to_bytes()).read<wire::ClusterStatus>(shallow);
  EXPECT_FALSE(v.ok());
  auto ok = envelope::from_bytes(kind::cluster_status, env.to_bytes()).read<wire::ClusterStatus>();
  EXPECT_TRUE(ok.ok()) << ok.error().to_string();
}

}  // namespace
}  // namespace weft::schema
