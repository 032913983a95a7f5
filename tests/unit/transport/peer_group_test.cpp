// peer_group: the all-reduce of data-parallel trainers, on inproc and UCX engines, members on
// their own threads like processes would be.

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "transport/checksum.hpp"
#include "transport/peer_group.hpp"
#include "transport/registry.hpp"

namespace weft::transport::testing {
namespace {

struct group_case {
  std::string label;
  std::string name;
  std::map<std::string, std::string> params;
};

std::ostream& operator<<(std::ostream& os, const group_case& c) {
  return os << c.label;
}

class peer_group_test : public ::testing::TestWithParam<group_case> {
 public:
  /// `k` engines and their addresses.
  void make(int k) {
    engine_config cfg;
    cfg.params = GetParam().params;
    cfg.default_timeout_ms = 20'000;
    for (int r = 0; r < k; ++r) {
      auto e = make_engine(GetParam().name, cfg);
      ASSERT_TRUE(e.ok()) << e.error().to_string();
      auto a = (*e)->local_address();
      ASSERT_TRUE(a.ok());
      addresses_.push_back(*a);
      engines_.push_back(std::move(*e));
    }
  }

  std::unique_ptr<peer_group> group(int rank, group_options o = {}) {
    auto g = peer_group::connect(*engines_[static_cast<size_t>(rank)], rank, addresses_, o);
    EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.error().to_string());
    return g.ok() ? std::move(*g) : nullptr;
  }

  std::vector<std::unique_ptr<engine>> engines_;
  std::vector<bytes> addresses_;
};

template <class T>
std::vector<std::vector<T>> random_inputs(int k, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> d(-1.0, 1.0);
  std::vector<std::vector<T>> in(static_cast<size_t>(k), std::vector<T>(n));
  for (auto& v : in) {
    // Magnitudes that differ by orders, so the order of summation shows in the bits.
    for (auto& x : v) x = static_cast<T>(d(rng) * std::pow(10.0, d(rng) * 6));
  }
  return in;
}

template <class T>
void check_sum(peer_group_test& t, int k, size_t n) {
  t.make(k);
  auto in = random_inputs<T>(k, n, static_cast<uint32_t>(n + k));
  std::vector<T> expect(n);
  for (size_t i = 0; i < n; ++i) {
    T s = in[0][i];
    for (int r = 1; r < k; ++r) s += in[static_cast<size_t>(r)][i];
    expect[i] = s;
  }
  auto data = in;
  std::vector<status> results(static_cast<size_t>(k));
  std::vector<std::thread> threads;
  for (int r = 0; r < k; ++r) {
    threads.emplace_back([&, r] {
      auto g = t.group(r);
      if (!g) return;
      // Two calls in a row: sequence numbers keep them apart.
      auto& v = data[static_cast<size_t>(r)];
      results[static_cast<size_t>(r)] = g->all_reduce_sum(std::span<T>(v));
      std::vector<T> again = in[static_cast<size_t>(r)];
      if (results[static_cast<size_t>(r)].ok()) {
        results[static_cast<size_t>(r)] = g->all_reduce_sum(std::span<T>(again));
      }
      if (again != v) results[static_cast<size_t>(r)] = make_status(status_code::internal, "2nd");
    });
  }
  for (auto& th : threads) th.join();
  for (int r = 0; r < k; ++r) {
    ASSERT_TRUE(results[static_cast<size_t>(r)].ok())
        << "rank " << r << ": " << results[static_cast<size_t>(r)].to_string();
    // Bit for bit: the rank-order sum, on every member.
    ASSERT_EQ(0, std::memcmp(data[static_cast<size_t>(r)].data(), expect.data(), n * sizeof(T)))
        << "rank " << r << " of " << k << ", n " << n;
  }
}

TEST_P(peer_group_test, sums_floats_in_rank_order_on_every_member) {
  check_sum<float>(*this, 3, 100'003);
}

TEST_P(peer_group_test, sums_doubles_of_two_members) {
  check_sum<double>(*this, 2, 4);
}

TEST_P(peer_group_test, handles_vectors_shorter_than_the_group) {
  check_sum<float>(*this, 4, 2);
}

TEST_P(peer_group_test, a_single_member_keeps_its_data) {
  check_sum<float>(*this, 1, 10);
}

TEST_P(peer_group_test, broadcasts_bytes_exactly_to_the_chosen_members_only) {
  // Rank 1 sends to ranks 0 and 3; rank 2 takes no part, yet its next all-reduce still matches
  // the others' (every member counts the broadcast). The bytes include NaN patterns that float
  // arithmetic would quieten.
  const int k = 4;
  make(k);
  std::vector<std::vector<std::byte>> data(k, std::vector<std::byte>(70'001, std::byte{0}));
  fill_pattern(data[1], 42);
  const std::vector<bool> to = {true, false, false, true};
  std::vector<status> results(k);
  std::vector<double> sums(k);
  std::vector<std::thread> threads;
  for (int r = 0; r < k; ++r) {
    threads.emplace_back([&, r] {
      auto g = group(r);
      if (!g) return;
      auto& st = results[static_cast<size_t>(r)];
      st = g->broadcast(data[static_cast<size_t>(r)], 1, to);
      double x[1] = {static_cast<double>(r)};
      if (st.ok()) st = g->all_reduce_sum(std::span<double>(x, 1));
      sums[static_cast<size_t>(r)] = x[0];
    });
  }
  for (auto& th : threads) th.join();
  const std::vector<std::byte> zeros(data[0].size(), std::byte{0});
  for (int r = 0; r < k; ++r) {
    ASSERT_TRUE(results[static_cast<size_t>(r)].ok())
        << "rank " << r << ": " << results[static_cast<size_t>(r)].to_string();
    EXPECT_EQ(sums[static_cast<size_t>(r)], 6.0) << "rank " << r;
  }
  EXPECT_EQ(data[0], data[1]);
  EXPECT_EQ(data[3], data[1]);
  EXPECT_EQ(data[2], zeros);
  EXPECT_NE(data[1], zeros);
}

TEST_P(peer_group_test, a_member_that_never_comes_fails_the_call_by_its_deadline) {
  make(2);
  group_options o;
  o.timeout_ms = 300;
  auto g = group(0, o);
  ASSERT_TRUE(g);
  std::vector<float> v(1000, 1.0f);
  const auto t0 = std::chrono::steady_clock::now();
  auto s = g->all_reduce_sum(std::span<float>(v));
  EXPECT_FALSE(s.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
}

TEST_P(peer_group_test, abort_from_another_thread_ends_a_waiting_call) {
  make(2);
  auto g = group(0);
  ASSERT_TRUE(g);
  std::vector<float> v(1000, 1.0f);
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    g->abort();
  });
  const auto t0 = std::chrono::steady_clock::now();
  auto s = g->all_reduce_sum(std::span<float>(v));
  aborter.join();
  EXPECT_EQ(s.code, status_code::canceled) << s.to_string();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_EQ(g->all_reduce_sum(std::span<float>(v)).code, status_code::canceled);
}

TEST_P(peer_group_test, another_generation_does_not_match) {
  make(2);
  group_options a, b;
  a.timeout_ms = b.timeout_ms = 500;
  a.generation = 1;
  b.generation = 2;
  std::vector<float> v0(64, 1.0f), v1(64, 2.0f);
  status s0, s1;
  std::thread t0([&] {
    auto g = group(0, a);
    if (g) s0 = g->all_reduce_sum(std::span<float>(v0));
  });
  std::thread t1([&] {
    auto g = group(1, b);
    if (g) s1 = g->all_reduce_sum(std::span<float>(v1));
  });
  t0.join();
  t1.join();
  EXPECT_FALSE(s0.ok());
  EXPECT_FALSE(s1.ok());
}

TEST(peer_group, refuses_a_rank_outside_the_group) {
  auto e = make_engine("inproc");
  ASSERT_TRUE(e.ok());
  std::vector<bytes> addrs(2);
  EXPECT_FALSE(peer_group::connect(**e, 2, addrs).ok());
  EXPECT_FALSE(peer_group::connect(**e, -1, addrs).ok());
  EXPECT_FALSE(peer_group::connect(**e, 0, {}).ok());
}

INSTANTIATE_TEST_SUITE_P(engines, peer_group_test,
                         ::testing::Values(group_case{"inproc", "inproc", {}},
                                           group_case{"ucx_tcp", "ucx", {{"ucx.tls", "tcp"}}},
                                           group_case{"ucx_shm", "ucx", {{"ucx.tls", "shm"}}}),
                         [](const auto& info) { return info.param.label; });

}  // namespace
}  // namespace weft::transport::testing
