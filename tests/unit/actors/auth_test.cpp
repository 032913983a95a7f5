#include <gtest/gtest.h>

#include <capnp/message.h>

#include <chrono>
#include <thread>

#include "actors/auth.hpp"
#include "actors/signed_requests.hpp"

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

namespace weft::actors {
namespace {

/// A copy of `env`'s request with `edit` applied, its token kept (what a tampering relay sends).
template <class T, class F>
schema::envelope tampered(const schema::envelope& env, F edit) {
  auto v = env.read<T>();
  EXPECT_TRUE(v.ok());
  auto mb = std::make_unique<capnp::MallocMessageBuilder>();
  mb->setRoot(v->get());
  edit(mb->getRoot<T>());
  return schema::envelope::from_builder(schema::kind_of<T>::value, std::move(mb));
}

TEST(signed_requests, spawn_token_covers_every_field_including_config) {
  cluster_secret s{"signed-requests-secret-0001"};
  auto env = make_spawn_request(s, 7, "echo", "e1", R"({"a":1})", 10'000);
  ASSERT_TRUE(verify_spawn_request(s, env.read<schema::wire::SpawnRequest>()->get()).ok());
  auto bad_config =
      tampered<schema::wire::SpawnRequest>(env, [](auto b) { b.setConfigJson(R"({"a":2})"); });
  auto st = verify_spawn_request(s, bad_config.read<schema::wire::SpawnRequest>()->get());
  EXPECT_EQ(st.code, errc::unauthorized) << st.to_string();
  auto bad_role = tampered<schema::wire::SpawnRequest>(env, [](auto b) { b.setRole("crasher"); });
  EXPECT_FALSE(verify_spawn_request(s, bad_role.read<schema::wire::SpawnRequest>()->get()).ok());
  EXPECT_FALSE(verify_spawn_request(cluster_secret{"another-secret-00000000"},
                                    env.read<schema::wire::SpawnRequest>()->get())
                   .ok());
}

TEST(signed_requests, stop_tokens_expire_and_a_replay_after_the_deadline_is_refused) {
  cluster_secret s{"signed-requests-secret-0001"};
  auto env = make_stop_request(s, 3, "e1", "test", 50);
  ASSERT_TRUE(verify_stop_request(s, env.read<schema::wire::StopRequest>()->get()).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  auto st = verify_stop_request(s, env.read<schema::wire::StopRequest>()->get());
  EXPECT_EQ(st.code, errc::timeout) << st.to_string();
  // A token that would never expire, or only far in the future, is refused outright.
  auto forever = tampered<schema::wire::StopRequest>(env, [](auto b) { b.setDeadlineMs(0); });
  EXPECT_EQ(verify_stop_request(s, forever.read<schema::wire::StopRequest>()->get()).code,
            errc::unauthorized);
  auto far = make_stop_request(s, 4, "e1", "test", 10'000);
  auto farther = tampered<schema::wire::StopRequest>(
      far, [](auto b) { b.setDeadlineMs(now_ms() + 24ull * 3600 * 1000); });
  EXPECT_FALSE(verify_stop_request(s, farther.read<schema::wire::StopRequest>()->get()).ok());
}

TEST(signed_requests, supervisor_spec_token_covers_the_children) {
  cluster_secret s{"signed-requests-secret-0001"};
  std::vector<child_spec> children = {{"w", "echo", "{}", restart_type::permanent}};
  auto env = make_supervisor_spec(s, "sup", restart_strategy::one_for_one, {3, 1000},
                                  backoff_policy{}, children, 10'000);
  ASSERT_TRUE(verify_supervisor_spec(s, env.read<schema::wire::SupervisorSpec>()->get()).ok());
  auto swapped = tampered<schema::wire::SupervisorSpec>(
      env, [](auto b) { b.getChildren()[0].setRole("engine_worker"); });
  EXPECT_FALSE(verify_supervisor_spec(s, swapped.read<schema::wire::SupervisorSpec>()->get()).ok());
  auto more_restarts =
      tampered<schema::wire::SupervisorSpec>(env, [](auto b) { b.setMaxRestarts(1000000); });
  EXPECT_FALSE(
      verify_supervisor_spec(s, more_restarts.read<schema::wire::SupervisorSpec>()->get()).ok());
}

TEST(signed_requests, a_token_without_deadline_is_refused) {
  cluster_secret s{"signed-requests-secret-0001"};
  auto token = request_token(s, "spawn", "x", 0);
  EXPECT_EQ(verify_request_token(s, "spawn", "x", 0, token.data(), token.size()).code,
            errc::unauthorized);
}

}  // namespace
}  // namespace weft::actors
