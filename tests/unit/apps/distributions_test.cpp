#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "apps/loadgen/distributions.hpp"
#include "apps/loadgen/prompt_text.hpp"

namespace lg = weft::apps::loadgen;

namespace {

// Mean and coefficient of variation of the gaps between consecutive send times.
std::pair<double, double> gap_stats(const std::vector<double>& t) {
  std::vector<double> gaps;
  for (size_t i = 1; i < t.size(); ++i) gaps.push_back(t[i] - t[i - 1]);
  const double mean =
      std::accumulate(gaps.begin(), gaps.end(), 0.0) / static_cast<double>(gaps.size());
  double var = 0;
  for (double g : gaps) var += (g - mean) * (g - mean);
  var /= static_cast<double>(gaps.size() - 1);
  return {mean, std::sqrt(var) / mean};
}

}  // namespace

TEST(arrivals, poisson_has_the_requested_mean_rate_and_cv_one) {
  lg::arrival_config c{lg::arrival_kind::poisson, 4.0, 1.0, 7};
  const auto t = lg::generate_arrivals(c, 40000);
  ASSERT_EQ(t.size(), 40000u);
  EXPECT_EQ(t.front(), 0.0);
  EXPECT_TRUE(std::is_sorted(t.begin(), t.end()));
  const auto [mean, cv] = gap_stats(t);
  EXPECT_NEAR(1.0 / mean, 4.0, 4.0 * 0.03);
  EXPECT_NEAR(cv, 1.0, 0.03);
}

TEST(arrivals, gamma_cv_is_one_over_sqrt_shape) {
  for (double shape : {0.25, 4.0}) {
    lg::arrival_config c{lg::arrival_kind::gamma, 10.0, shape, 11};
    const auto [mean, cv] = gap_stats(lg::generate_arrivals(c, 60000));
    EXPECT_NEAR(1.0 / mean, 10.0, 10.0 * 0.04) << "shape " << shape;
    EXPECT_NEAR(cv, 1.0 / std::sqrt(shape), 0.06 / std::sqrt(shape)) << "shape " << shape;
  }
}

TEST(arrivals, deterministic_per_seed) {
  lg::arrival_config c{lg::arrival_kind::gamma, 2.0, 0.5, 3};
  EXPECT_EQ(lg::generate_arrivals(c, 100), lg::generate_arrivals(c, 100));
  auto d = c;
  d.seed = 4;
  EXPECT_NE(lg::generate_arrivals(c, 100), lg::generate_arrivals(d, 100));
}

TEST(arrivals, validate_rejects_bad_rates) {
  EXPECT_FALSE(lg::validate(lg::arrival_config{lg::arrival_kind::poisson, 0.0, 1.0, 0}).empty());
  EXPECT_FALSE(lg::validate(lg::arrival_config{lg::arrival_kind::gamma, 1.0, 0.0, 0}).empty());
  EXPECT_TRUE(lg::validate(lg::arrival_config{lg::arrival_kind::gamma, 1.0, 0.3, 0}).empty());
}

TEST(lengths, fixed_and_uniform) {
  lg::length_config f{lg::length_dist::fixed, 77, 1, 0};
  for (auto v : lg::sample_lengths(f, 50, 1)) EXPECT_EQ(v, 77);
  lg::length_config u{lg::length_dist::uniform, 0, 10, 20};
  const auto s = lg::sample_lengths(u, 5000, 2);
  EXPECT_EQ(*std::min_element(s.begin(), s.end()), 10);
  EXPECT_EQ(*std::max_element(s.begin(), s.end()), 20);
  const double mean = static_cast<double>(std::accumulate(s.begin(), s.end(), int64_t{0})) / 5000.0;
  EXPECT_NEAR(mean, 15.0, 0.3);
}

TEST(lengths, heavy_tailed_have_the_requested_mean_and_a_long_tail) {
  lg::length_config p{lg::length_dist::pareto, 100, 1, 0, 3.0, 1.0};
  lg::length_config l{lg::length_dist::lognormal, 100, 1, 0, 1.5, 1.0};
  for (const auto& c : {p, l}) {
    auto s = lg::sample_lengths(c, 200000, 5);
    const double mean = static_cast<double>(std::accumulate(s.begin(), s.end(), int64_t{0})) /
                        static_cast<double>(s.size());
    EXPECT_NEAR(mean, 100.0, 5.0) << lg::to_string(c.dist);
    std::sort(s.begin(), s.end());
    // Median well below the mean, p99 several times the mean: the tail carries the weight.
    EXPECT_LT(s[s.size() / 2], 90) << lg::to_string(c.dist);
    EXPECT_GT(s[s.size() * 99 / 100], 250) << lg::to_string(c.dist);
  }
}

TEST(lengths, clipping_and_validation) {
  lg::length_config p{lg::length_dist::pareto, 100, 5, 300, 1.2, 1.0};
  for (auto v : lg::sample_lengths(p, 10000, 9)) {
    EXPECT_GE(v, 5);
    EXPECT_LE(v, 300);
  }
  EXPECT_FALSE(lg::validate(lg::length_config{lg::length_dist::uniform, 10, 1, 0}).empty());
  EXPECT_FALSE(
      lg::validate(lg::length_config{lg::length_dist::pareto, 10, 1, 0, 1.0, 1.0}).empty());
  EXPECT_FALSE(lg::validate(lg::length_config{lg::length_dist::fixed, 10, 0, 0}).empty());
  EXPECT_TRUE(lg::validate(p).empty());
}

TEST(prompt_text, word_count_and_prefix_property) {
  const auto a = lg::make_words(42, 50);
  const auto b = lg::make_words(42, 20);
  EXPECT_EQ(std::count(a.begin(), a.end(), ' '), 50);
  EXPECT_EQ(a.rfind(b, 0), 0u);  // shorter text is a prefix
  EXPECT_NE(lg::make_words(43, 50), a);
  EXPECT_TRUE(lg::make_words(1, 0).empty());
}
