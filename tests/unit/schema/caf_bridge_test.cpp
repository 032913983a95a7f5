// The envelope as a CAF message element: serialized by CAF's binary serializer as it is across
// processes; a hostile size is skipped, not allocated.

#include <gtest/gtest.h>
#include <caf/all.hpp>

#include "schema/caf_bridge.hpp"

namespace weft::schema {
namespace {

struct bridge_fixture : ::testing::Test {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  void SetUp() override {
    add_message_types(cfg);
    sys = std::make_unique<caf::actor_system>(cfg);
  }
};

TEST_F(bridge_fixture, serializes_like_a_remote_peer) {
  auto env = envelope::build<wire::Ping>([](wire::Ping::Builder b) {
    b.setSeq(9);
    b.setPayload(kj::heapArray<kj::byte>(100).asPtr());
  });
  std::vector<char> buf;
  caf::binary_serializer sink{*sys, buf};
  ASSERT_FALSE(sink(env));
  envelope back;
  caf::binary_deserializer source{*sys, buf};
  ASSERT_FALSE(source(back));
  auto v = back.read<wire::Ping>();
  ASSERT_TRUE(v.ok()) << v.error().to_string();
  EXPECT_EQ(v->get().getSeq(), 9u);
  EXPECT_EQ(v->get().getPayload().size(), 100u);
}

TEST_F(bridge_fixture, hostile_sizes_do_not_allocate) {
  // kind = Ping, size = 64 MiB, followed by 64 MiB of bytes: skipped, arrives as oversize.
  std::vector<char> buf;
  caf::binary_serializer sink{*sys, buf};
  uint16_t k = static_cast<uint16_t>(kind::ping);
  uint32_t size = 64u << 20;
  ASSERT_FALSE(sink(k, size));
  buf.resize(buf.size() + size, 'x');
  envelope back;
  caf::binary_deserializer source{*sys, buf};
  ASSERT_FALSE(source(back));
  EXPECT_EQ(back.what(), kind::oversize);
  EXPECT_FALSE(back.read<wire::Ping>().ok());
}

TEST_F(bridge_fixture, lying_size_is_a_deserialization_error_not_a_crash) {
  std::vector<char> buf;
  caf::binary_serializer sink{*sys, buf};
  uint16_t k = static_cast<uint16_t>(kind::ping);
  uint32_t size = 1000;  // but only 10 bytes follow
  ASSERT_FALSE(sink(k, size));
  buf.resize(buf.size() + 10, 'x');
  envelope back;
  caf::binary_deserializer source{*sys, buf};
  EXPECT_TRUE(static_cast<bool>(source(back)));
}

TEST_F(bridge_fixture, local_messages_share_the_buffer) {
  auto env = envelope::build<wire::Ping>([](wire::Ping::Builder b) { b.setSeq(1); });
  auto msg = caf::make_message(env);
  const auto& inside = msg.get_as<envelope>(0);
  EXPECT_EQ(inside.storage_id(), env.storage_id());
  auto copy = msg;  // CAF copies messages by reference count
  EXPECT_EQ(copy.get_as<envelope>(0).storage_id(), env.storage_id());
  EXPECT_EQ(caf::to_string(msg).find("Ping") != std::string::npos, true) << caf::to_string(msg);
}

}  // namespace
}  // namespace weft::schema
