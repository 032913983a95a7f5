// The fault-injecting decorator: each fault mode surfaces the way the contract says, on the
// in-process engine (deterministic) and on UCX.

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>

#include "tests/unit/transport/engine_pair.hpp"
#include "transport/fault_injection.hpp"

namespace weft::transport::testing {
namespace {

struct faulty_pair {
  std::unique_ptr<engine> a;  // a fault_injecting_engine
  std::unique_ptr<engine> b;
  peer_handle a_to_b;
  region src, dst;
  remote_region rr;
  fault_injecting_engine& faults() { return static_cast<fault_injecting_engine&>(*a); }
};

constexpr std::size_t kSize = 1 << 20;

faulty_pair make_faulty(const std::string& inner, const fault_policy& policy,
                        std::map<std::string, std::string> params = {}) {
  faulty_pair p;
  engine_config cfg;
  cfg.params = params;
  auto raw = make_engine(inner, cfg);
  EXPECT_TRUE(raw.ok());
  auto wrapped = make_fault_injecting_engine(std::move(*raw), policy);
  EXPECT_TRUE(wrapped.ok());
  p.a = std::move(*wrapped);
  p.b = std::move(make_engine(inner, cfg)).value();
  p.a_to_b = *p.a->connect(*p.b->local_address());
  EXPECT_TRUE(p.b->connect(*p.a->local_address()).ok());
  p.src = *p.a->allocate_memory(kSize);
  p.dst = *p.b->allocate_memory(kSize);
  fill_pattern({p.src.data, kSize}, 11);
  std::memset(p.dst.data, 0, kSize);
  p.rr = import_region(*p.b, p.dst, *p.a, p.a_to_b);
  return p;
}

completion put_and_wait(faulty_pair& p, std::uint32_t timeout_ms = 2'000) {
  auto t = p.a->put({.peer = p.a_to_b,
                     .local = p.src,
                     .remote = p.rr,
                     .size_bytes = kSize,
                     .options = {.timeout_ms = timeout_ms}},
                    {});
  EXPECT_TRUE(t.ok());
  return p.a->wait(*t);
}

bool intact(const faulty_pair& p) {
  return checksum(p.dst.data, kSize) == checksum(p.src.data, kSize);
}

class transport_fault_modes : public ::testing::TestWithParam<std::string> {};

TEST_P(transport_fault_modes, no_faults_by_default) {
  auto p = make_faulty(GetParam(), {});
  completion c = put_and_wait(p);
  EXPECT_TRUE(c.result.ok()) << c.result.to_string();
  EXPECT_TRUE(intact(p));
  EXPECT_EQ(p.faults().stats().transfers, 1u);
}

TEST_P(transport_fault_modes, drop_surfaces_as_timeout_at_the_deadline) {
  auto p = make_faulty(GetParam(), {.drop_probability = 1.0});
  auto start = clock::now();
  int calls = 0;
  auto t = p.a->put({.peer = p.a_to_b,
                     .local = p.src,
                     .remote = p.rr,
                     .size_bytes = kSize,
                     .options = {.timeout_ms = 80}},
                    [&](const completion&) { ++calls; });
  ASSERT_TRUE(t.ok());
  completion c = p.a->wait(*t);
  EXPECT_EQ(c.result.code, status_code::timeout) << c.result.to_string();
  EXPECT_GE(clock::now() - start, std::chrono::milliseconds(80));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(p.faults().stats().dropped, 1u);
  // Nothing arrived.
  EXPECT_EQ(checksum(p.dst.data, kSize), checksum(std::vector<std::byte>(kSize).data(), kSize));
}

TEST_P(transport_fault_modes, fail_after_n) {
  auto p = make_faulty(GetParam(), {.fail_after_n = 2});
  EXPECT_TRUE(put_and_wait(p).result.ok());
  EXPECT_TRUE(put_and_wait(p).result.ok());
  for (int i = 0; i < 3; ++i) {
    completion c = put_and_wait(p);
    EXPECT_EQ(c.result.code, status_code::io_error) << c.result.to_string();
  }
  EXPECT_EQ(p.faults().stats().failed, 3u);
  // Healing the link: a new policy lets transfers through again.
  ASSERT_TRUE(p.faults().set_policy({}).ok());
  EXPECT_TRUE(put_and_wait(p).result.ok());
}

TEST_P(transport_fault_modes, corrupt_put_is_caught_by_checksum_and_source_is_restored) {
  auto p = make_faulty(GetParam(), {.corrupt_probability = 1.0, .seed = 5});
  std::uint64_t source_sum = checksum(p.src.data, kSize);
  completion c = put_and_wait(p);
  ASSERT_TRUE(c.result.ok()) << c.result.to_string();
  EXPECT_FALSE(intact(p));
  EXPECT_EQ(checksum(p.src.data, kSize), source_sum);
  // Exactly one byte differs.
  std::size_t diffs = 0;
  for (std::size_t i = 0; i < kSize; ++i) diffs += p.src.data[i] != p.dst.data[i];
  EXPECT_EQ(diffs, 1u);
  EXPECT_EQ(p.faults().stats().corrupted, 1u);
}

TEST_P(transport_fault_modes, corrupt_get_flips_the_destination) {
  auto p = make_faulty(GetParam(), {.corrupt_probability = 1.0});
  fill_pattern({p.dst.data, kSize}, 12);  // the remote side now holds other bytes
  auto t = p.a->get({.peer = p.a_to_b, .local = p.src, .remote = p.rr, .size_bytes = kSize}, {});
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(p.a->wait(*t).result.ok());
  EXPECT_FALSE(intact(p));
}

TEST_P(transport_fault_modes, corrupt_tagged_send_is_caught_by_checksum) {
  auto p = make_faulty(GetParam(), {.corrupt_probability = 1.0});
  auto r = p.b->recv({.tag = 1, .local = p.dst, .size_bytes = kSize}, {});
  auto s = p.a->send({.peer = p.a_to_b, .tag = 1, .local = p.src, .size_bytes = kSize}, {});
  ASSERT_TRUE(r.ok() && s.ok());
  EXPECT_TRUE(p.a->wait(*s).result.ok());
  EXPECT_TRUE(p.b->wait(*r).result.ok());
  EXPECT_FALSE(intact(p));
}

TEST_P(transport_fault_modes, a_batch_is_one_transfer_for_faults) {
  auto p = make_faulty(GetParam(), {.corrupt_probability = 1.0});
  rma_batch_request batch{.peer = p.a_to_b};
  for (std::size_t i = 0; i < 4; ++i) {
    batch.segments.push_back({.local = p.src,
                              .local_offset_bytes = i * (kSize / 4),
                              .remote = p.rr,
                              .remote_offset_bytes = i * (kSize / 4),
                              .size_bytes = kSize / 4});
  }
  auto t = p.a->put_batch(batch, {});
  ASSERT_TRUE(t.ok()) << t.error().to_string();
  completion c = p.a->wait(*t);
  ASSERT_TRUE(c.result.ok()) << c.result.to_string();
  EXPECT_EQ(c.size_bytes, kSize);
  EXPECT_FALSE(intact(p));
  EXPECT_EQ(p.faults().stats().transfers, 1u);
  ASSERT_TRUE(p.faults().set_policy({.drop_probability = 1.0}).ok());
  batch.options.timeout_ms = 30;
  t = p.a->put_batch(batch, {});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(p.a->wait(*t).result.code, status_code::timeout);
}

TEST_P(transport_fault_modes, delay_postpones_but_delivers) {
  auto p = make_faulty(GetParam(), {.delay_ms = 60});
  auto start = clock::now();
  completion c = put_and_wait(p);
  EXPECT_TRUE(c.result.ok()) << c.result.to_string();
  EXPECT_GE(clock::now() - start, std::chrono::milliseconds(60));
  EXPECT_TRUE(intact(p));
  EXPECT_EQ(p.faults().stats().delayed, 1u);
}

TEST_P(transport_fault_modes, delay_beyond_the_deadline_is_a_timeout) {
  auto p = make_faulty(GetParam(), {.delay_ms = 500});
  completion c = put_and_wait(p, 50);
  EXPECT_EQ(c.result.code, status_code::timeout) << c.result.to_string();
}

TEST_P(transport_fault_modes, cancel_a_delayed_transfer) {
  auto p = make_faulty(GetParam(), {.delay_ms = 10'000});
  auto t = p.a->put({.peer = p.a_to_b, .local = p.src, .remote = p.rr, .size_bytes = kSize}, {});
  ASSERT_TRUE(t.ok());
  EXPECT_TRUE(p.a->cancel(*t).ok());
  EXPECT_EQ(p.a->wait(*t).result.code, status_code::canceled);
}

TEST_P(transport_fault_modes, immediate_errors_pass_through) {
  auto p = make_faulty(GetParam(), {});
  auto t =
      p.a->put({.peer = p.a_to_b, .local = p.src, .remote = p.rr, .size_bytes = kSize + 1}, {});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().code, status_code::invalid_argument);
}

TEST_P(transport_fault_modes, same_seed_same_faults) {
  auto run = [&](std::uint64_t seed) {
    auto p = make_faulty(GetParam(), {.corrupt_probability = 0.5, .seed = seed});
    std::vector<bool> pattern;
    for (int i = 0; i < 16; ++i) {
      std::memset(p.dst.data, 0, kSize);
      put_and_wait(p);
      pattern.push_back(intact(p));
    }
    return pattern;
  };
  auto first = run(42);
  EXPECT_EQ(first, run(42));
  EXPECT_NE(std::count(first.begin(), first.end(), true), 0);
  EXPECT_NE(std::count(first.begin(), first.end(), false), 0);
}

// transport::get_all: one completion for a whole pull, whether the engine moves it as one batch
// or (fault.batches = false) as one get per segment.
TEST_P(transport_fault_modes, get_all_joins_single_gets_when_batches_are_off) {
  for (bool batches : {true, false}) {
    auto p = make_faulty(GetParam(), {.batches = batches});
    // The target's bytes hold the pattern; pull them back in four scattered pieces.
    std::memcpy(p.dst.data, p.src.data, kSize);
    region back = *p.a->allocate_memory(kSize);
    std::memset(back.data, 0, kSize);
    rma_batch_request rq{.peer = p.a_to_b, .options = {.timeout_ms = 5'000}};
    const std::size_t q = kSize / 4;
    for (std::size_t i = 0; i < 4; ++i) {
      rq.segments.push_back({.local = back,
                             .local_offset_bytes = ((i + 1) % 4) * q,
                             .remote = p.rr,
                             .remote_offset_bytes = ((i + 1) % 4) * q,
                             .size_bytes = q});
    }
    std::atomic<int> calls{0};
    std::atomic<std::size_t> moved{0};
    auto started = get_all(*p.a, rq, [&](const completion& c) {
      EXPECT_TRUE(c.result.ok()) << c.result.to_string();
      moved = c.size_bytes;
      ++calls;
    });
    ASSERT_TRUE(started.ok()) << started.error().to_string();
    EXPECT_EQ(started->size(), batches ? 1u : 4u);
    for (const auto& t : *started) (void)p.a->wait(t);
    EXPECT_EQ(calls.load(), 1);
    EXPECT_EQ(moved.load(), kSize);
    EXPECT_EQ(checksum(back.data, kSize), checksum(p.src.data, kSize));
    // A pull whose first piece cannot start is an error at once, and no callback.
    rq.segments[0].remote_offset_bytes = kSize;
    int late = 0;
    auto bad = get_all(*p.a, rq, [&](const completion&) { ++late; });
    EXPECT_FALSE(bad.ok());
    EXPECT_EQ(late, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(engines, transport_fault_modes, ::testing::Values("inproc", "ucx"));

TEST(transport_fault_policy, parses_params_and_rejects_bad_values) {
  auto p = parse_fault_policy({{"fault.drop_probability", "0.25"},
                               {"fault.delay_ms", "7"},
                               {"fault.fail_after_n", "3"},
                               {"fault.corrupt_probability", "1"},
                               {"fault.seed", "9"},
                               {"ucx.tls", "tcp"}});
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  EXPECT_DOUBLE_EQ(p->drop_probability, 0.25);
  EXPECT_EQ(p->delay_ms, 7u);
  EXPECT_EQ(p->fail_after_n, 3);
  EXPECT_DOUBLE_EQ(p->corrupt_probability, 1.0);
  EXPECT_EQ(p->seed, 9u);
  EXPECT_FALSE(parse_fault_policy({{"fault.drop_probability", "1.5"}}).ok());
  EXPECT_FALSE(parse_fault_policy({{"fault.delay_ms", "-1"}}).ok());
  EXPECT_FALSE(parse_fault_policy({{"fault.delay_ms", "12abc"}}).ok());
  EXPECT_FALSE(parse_fault_policy({{"fault.unknown", "1"}}).ok());
}

TEST(transport_fault_policy, registry_prefix_wraps_any_engine) {
  engine_config cfg;
  cfg.params = {{"fault.fail_after_n", "0"}};
  auto e = make_engine("fault:inproc", cfg);
  ASSERT_TRUE(e.ok()) << e.error().to_string();
  EXPECT_EQ((*e)->caps().name, "fault:inproc");
  auto peer = (*e)->connect(*(*e)->local_address());
  auto r = (*e)->allocate_memory(64);
  ASSERT_TRUE(peer.ok() && r.ok());
  auto t = (*e)->send({.peer = *peer, .tag = 1, .local = *r, .size_bytes = 64}, {});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ((*e)->wait(*t).result.code, status_code::io_error);
  EXPECT_FALSE(make_engine("fault:nonexistent").ok());
  cfg.params = {{"fault.drop_probability", "2"}};
  EXPECT_EQ(make_engine("fault:inproc", cfg).error().code, status_code::invalid_argument);
}

}  // namespace
}  // namespace weft::transport::testing
