#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "actors/cache/heavy_hitters.hpp"

namespace weft::cache {
namespace {

uint64_t key_of_rank(size_t rank) {
  return (rank + 1) * 0x9E3779B97F4A7C15ULL;
}

// Zipf(s) over n ranks by inverse CDF; a fixed-seed engine and our own uniform mapping keep the
// stream identical across standard libraries.
class zipf_stream {
 public:
  zipf_stream(size_t n, double s, uint64_t seed) : rng_(seed) {
    cdf_.resize(n);
    double sum = 0;
    for (size_t k = 0; k < n; ++k) cdf_[k] = (sum += 1.0 / std::pow(static_cast<double>(k + 1), s));
    for (double& c : cdf_) c /= sum;
  }
  size_t next_rank() {
    double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
    return static_cast<size_t>(std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin());
  }

 private:
  std::mt19937_64 rng_;
  std::vector<double> cdf_;
};

TEST(heavy_hitters, finds_the_true_top_keys_of_a_zipf_stream) {
  heavy_hitters hh(heavy_hitters_config{
      .capacity = 128, .window = uint64_t{1} << 40, .hot_share = 0.05, .min_count = 16});
  zipf_stream z(10'000, 1.1, 7);
  std::map<uint64_t, uint64_t> truth;
  const uint64_t n = 200'000;
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t key = key_of_rank(z.next_rank());
    hh.record(key);
    truth[key] += 1;
  }
  EXPECT_EQ(hh.total(), n);

  std::vector<std::pair<uint64_t, uint64_t>> ranked(truth.begin(), truth.end());
  std::sort(ranked.begin(), ranked.end(), [](auto& a, auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  auto top = hh.top(10);
  ASSERT_EQ(top.size(), 10u);
  std::set<uint64_t> true_top, found_top;
  for (size_t i = 0; i < 10; ++i) {
    true_top.insert(ranked[i].first);
    found_top.insert(top[i].key);
  }
  EXPECT_EQ(found_top, true_top);
  EXPECT_EQ(top[0].key, key_of_rank(0));
  for (size_t i = 1; i < top.size(); ++i) EXPECT_GE(top[i - 1].count, top[i].count);

  // Space-Saving guarantees: count - error <= true <= count, and every key above n / capacity is
  // monitored.
  for (const auto& h : hh.top(128)) {
    EXPECT_LE(h.count - h.error, truth[h.key]);
    EXPECT_GE(h.count, truth[h.key]);
  }
  for (const auto& [key, count] : truth)
    if (count > n / 128) {
      EXPECT_GT(hh.estimate(key), 0u) << key;
    }

  // The head is hot, the tail is not.
  EXPECT_TRUE(hh.hot(key_of_rank(0)));
  EXPECT_TRUE(hh.hot(key_of_rank(1)));
  EXPECT_FALSE(hh.hot(key_of_rank(50)));
  EXPECT_FALSE(hh.hot(key_of_rank(9'999)));
}

TEST(heavy_hitters, nothing_is_hot_on_a_uniform_stream) {
  heavy_hitters hh(
      heavy_hitters_config{.capacity = 128, .window = 50'000, .hot_share = 0.01, .min_count = 16});
  std::mt19937_64 rng(11);
  for (int i = 0; i < 300'000; ++i) hh.record(key_of_rank(rng() % 1000));
  for (size_t r = 0; r < 1000; ++r) EXPECT_FALSE(hh.hot(key_of_rank(r))) << r;
  EXPECT_LE(hh.n_monitored(), 128u);
}

TEST(heavy_hitters, decay_cools_a_formerly_hot_key) {
  heavy_hitters hh(
      heavy_hitters_config{.capacity = 64, .window = 1000, .hot_share = 0.05, .min_count = 8});
  const uint64_t burst = key_of_rank(0);
  for (int i = 0; i < 900; ++i) hh.record(burst);
  EXPECT_TRUE(hh.hot(burst));
  const uint64_t peak = hh.estimate(burst);
  EXPECT_EQ(peak, 900u);
  std::mt19937_64 rng(3);
  for (int i = 0; i < 10'000; ++i) hh.record(key_of_rank(1 + rng() % 500));
  EXPECT_FALSE(hh.hot(burst));
  EXPECT_LT(hh.estimate(burst), peak / 100);
  EXPECT_LT(hh.total(), 2000u);  // recent total, halved every window
}

TEST(heavy_hitters, min_count_and_top_ordering) {
  heavy_hitters hh(
      heavy_hitters_config{.capacity = 8, .window = 1'000'000, .hot_share = 0.1, .min_count = 5});
  hh.record(1);
  EXPECT_FALSE(hh.hot(1));  // a single read is 100% of traffic, but not evidence
  for (int i = 0; i < 4; ++i) hh.record(1);
  EXPECT_TRUE(hh.hot(1));
  for (int i = 0; i < 5; ++i) hh.record(3);
  for (int i = 0; i < 5; ++i) hh.record(2);
  auto top = hh.top(3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].key, 1u);  // ties: smaller key first
  EXPECT_EQ(top[1].key, 2u);
  EXPECT_EQ(top[2].key, 3u);
  EXPECT_EQ(hh.top(100).size(), 3u);
  EXPECT_EQ(hh.estimate(99), 0u);
  EXPECT_FALSE(hh.hot(99));
}

}  // namespace
}  // namespace weft::cache
