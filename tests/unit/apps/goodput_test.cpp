#include <gtest/gtest.h>

#include <cmath>

#include "apps/loadgen/goodput.hpp"

namespace lg = weft::apps::loadgen;

namespace {
// Attainment falls from 1 to 0 around `knee` req/s.
double fake_attainment(double rate, double knee) {
  return 1.0 / (1.0 + std::exp((rate - knee) * 8));
}
}  // namespace

TEST(goodput, bisection_brackets_the_knee) {
  const lg::bisection_config c{0.5, 8.0, 6, 0.9};
  const double knee = 3.3;
  // Attainment 0.9 is reached at knee - ln(9)/8.
  const double exact = knee - std::log(9.0) / 8;
  const auto r = lg::bisect_goodput(c, [&](double rate) { return fake_attainment(rate, knee); });
  EXPECT_EQ(r.status, lg::goodput_status::found);
  EXPECT_EQ(r.probes.size(), 8u);
  EXPECT_DOUBLE_EQ(r.probes[0].rate_rps, 0.5);
  EXPECT_DOUBLE_EQ(r.probes[1].rate_rps, 8.0);
  EXPECT_LE(r.goodput_rps, exact);
  EXPECT_GT(r.upper_bound_rps, exact);
  EXPECT_NEAR(r.upper_bound_rps - r.goodput_rps, 7.5 / 64, 1e-12);
  for (const auto& p : r.probes) EXPECT_EQ(p.pass, p.attainment >= 0.9);
}

TEST(goodput, ends_of_the_range) {
  const lg::bisection_config c{1.0, 4.0, 5, 0.9};
  const auto low = lg::bisect_goodput(c, [](double) { return 0.5; });
  EXPECT_EQ(low.status, lg::goodput_status::below_min);
  EXPECT_EQ(low.goodput_rps, 0.0);
  EXPECT_EQ(low.probes.size(), 1u);
  const auto high = lg::bisect_goodput(c, [](double) { return 0.95; });
  EXPECT_EQ(high.status, lg::goodput_status::at_least_max);
  EXPECT_EQ(high.goodput_rps, 4.0);
  EXPECT_EQ(high.probes.size(), 2u);
}

TEST(goodput, validation) {
  EXPECT_FALSE(lg::validate(lg::bisection_config{2.0, 1.0, 3, 0.9}).empty());
  EXPECT_FALSE(lg::validate(lg::bisection_config{0.0, 1.0, 3, 0.9}).empty());
  EXPECT_FALSE(lg::validate(lg::bisection_config{1.0, 2.0, 3, 1.5}).empty());
  EXPECT_TRUE(lg::validate(lg::bisection_config{1.0, 2.0, 3, 0.9}).empty());
}
