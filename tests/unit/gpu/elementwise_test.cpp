// Row-wise and element-wise kernels of the CPU backend (gpu/cpu/elementwise.hpp) against formulas
// in double, and their vectorised bodies against the one-element code bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gpu/cpu/elementwise.hpp"
#include "tests/unit/gpu/device_pair.hpp"

namespace {

using namespace weft::gpu;
using namespace weft::gpu::cpu;
using weft::gpu::testing::randn;

TEST(elementwise, rms_norm_matches_reference) {
  auto x = randn(3 * 80, 8, 4.0f);
  auto w = randn(80, 9);
  std::vector<float> y(x.size());
  rms_norm_rows(x.data(), w.data(), y.data(), 0, 3, 80, 1e-5f);
  for (int r = 0; r < 3; ++r) {
    double ss = 0;
    for (int i = 0; i < 80; ++i) ss += double(x[r * 80 + i]) * x[r * 80 + i];
    const double inv = 1.0 / std::sqrt(ss / 80 + 1e-5);
    for (int i = 0; i < 80; ++i)
      EXPECT_NEAR(y[r * 80 + i], x[r * 80 + i] * inv * w[i], 1e-5 * (1 + std::fabs(y[r * 80 + i])));
  }
}

TEST(elementwise, first_max_index_is_max_element_with_nans_ignored) {
  // The reference: std::max_element's first largest (index 0 when x[0] is NaN) and the largest
  // non-NaN value; lengths around the 8/16/32-lane blocks, ties, signed zeros, NaNs and infinities.
  std::mt19937 rng(7);
  const float nan = std::numeric_limits<float>::quiet_NaN(),
              inf = std::numeric_limits<float>::infinity();
  std::vector<int64_t> lengths = {0, 1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 63, 64, 65, 49152};
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t n = lengths[static_cast<size_t>(trial) % lengths.size()];
    std::vector<float> x(static_cast<size_t>(n));
    // Few distinct values, so that maxima repeat; some special entries.
    for (auto& v : x) {
      const auto r = rng() % 100;
      v = r < 3    ? nan
          : r < 5  ? -inf
          : r < 7  ? -0.0f
          : r == 7 ? (trial % 7 == 0 ? inf : 1.0f)
                   : 0.0f;
      if (r >= 8) v = static_cast<float>(static_cast<int>(rng() % 9) - 6);
    }
    if (trial % 5 == 0 && n > 0) x[0] = nan;
    if (trial % 11 == 0) std::fill(x.begin(), x.end(), nan);
    float want_max = -inf;
    for (const float v : x) want_max = v > want_max ? v : want_max;
    const auto want = n == 0 ? 0 : std::max_element(x.begin(), x.end()) - x.begin();
    float got_max = 1.0f;
    EXPECT_EQ(first_max_index(x.data(), n, &got_max), want) << "n=" << n << " trial " << trial;
    EXPECT_EQ(got_max, want_max) << "n=" << n << " trial " << trial;
  }
}

TEST(elementwise, rope_rotates_pairs_like_the_formula) {
  for (rope_style style : {rope_style::normal, rope_style::neox}) {
    rope_config c;
    c.style = style;
    c.n_dims = 16;
    c.freq_base = 10000.0f;
    auto x = randn(24, 10);
    auto y = x;
    std::vector<float> cache(16);
    rope_cache(cache.data(), 7, c);
    rope_head(y.data(), cache.data(), c);
    for (int i = 0; i < 8; ++i) {
      const double theta = 7.0 * std::pow(10000.0, -2.0 * i / 16.0);
      const int a = style == rope_style::normal ? 2 * i : i;
      const int b = style == rope_style::normal ? 2 * i + 1 : i + 8;
      EXPECT_NEAR(y[a], x[a] * std::cos(theta) - x[b] * std::sin(theta), 1e-4);
      EXPECT_NEAR(y[b], x[a] * std::sin(theta) + x[b] * std::cos(theta), 1e-4);
    }
    for (int i = 16; i < 24; ++i) EXPECT_EQ(y[i], x[i]);  // beyond n_dims: untouched
  }
}

TEST(elementwise, exp_softmax_swiglu_match_libm) {
  for (float v = -80.0f; v < 80.0f; v += 0.37f) {
    const float e = exp_approx(v);
    EXPECT_NEAR(e, std::exp(v), std::exp(v) * 4e-7f) << v;
  }
  EXPECT_EQ(exp_approx(-std::numeric_limits<float>::infinity()), 0.0f);
  auto x = randn(50, 11, 3.0f);
  auto s = x;
  softmax_row(s.data(), 50);
  double z = 0;
  for (float v : x) z += std::exp(double(v));
  for (int i = 0; i < 50; ++i) EXPECT_NEAR(s[i], std::exp(double(x[i])) / z, 1e-6);
  auto g = randn(40, 12, 3.0f);
  auto u = randn(40, 13);
  std::vector<float> y(40);
  swiglu_range(g.data(), u.data(), y.data(), 0, 40);
  for (int i = 0; i < 40; ++i) EXPECT_NEAR(y[i], g[i] / (1 + std::exp(-double(g[i]))) * u[i], 1e-5);
}

TEST(elementwise, swiglu_range_is_the_scalar_formula_bit_for_bit) {
  // The vectorised body (AVX-512 builds) against exp_approx one element at a time, with
  // arguments beyond the polynomial's range and a tail.
  const int64_t n = 75;
  auto g = randn(n, 24, 8.0f);
  g[0] = 100.0f;
  g[1] = -100.0f;
  g[2] = 150.0f;
  g[3] = -150.0f;
  g[17] = 300.0f;
  g[18] = -300.0f;
  auto u = randn(n, 25);
  std::vector<float> y(n, -1.0f);
  swiglu_range(g.data(), u.data(), y.data(), 3, n);
  EXPECT_EQ(y[2], -1.0f);  // before `begin`: untouched
  for (int64_t i = 3; i < n; ++i) {
    const float want = (g[i] / (1.0f + exp_approx(-g[i]))) * u[i];
    EXPECT_EQ(std::bit_cast<uint32_t>(y[i]), std::bit_cast<uint32_t>(want)) << i << " " << g[i];
  }
}

TEST(elementwise, training_swiglu_matches_double_and_does_not_depend_on_the_cut) {
  const int64_t n = 53;  // whole vectors and a tail on AVX2 and AVX-512 builds
  auto g = randn(n, 21, 6.0f);
  g[3] = 120.0f;  // beyond the clamp on both sides
  g[4] = -120.0f;
  auto u = randn(n, 22), dh = randn(n, 23);
  std::vector<float> h(n), dg(n), du(n);
  silu_mul_forward(g.data(), u.data(), h.data(), n);
  silu_mul_backward(g.data(), u.data(), dh.data(), dg.data(), du.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    const double s = 1.0 / (1.0 + std::exp(-double(g[i])));
    const double tol = 4e-7 * (1.0 + std::fabs(double(g[i])));
    EXPECT_NEAR(h[i], g[i] * s * u[i], tol) << i;
    EXPECT_NEAR(du[i], dh[i] * g[i] * s, tol) << i;
    EXPECT_NEAR(dg[i], dh[i] * u[i] * s * (1.0 + g[i] * (1.0 - s)), 2 * tol) << i;
  }
  // Any cut of the range gives the same bits: each element runs the same instructions.
  for (int64_t cut : {1, 7, 16, 29}) {
    std::vector<float> h2(n), dg2(n), du2(n);
    silu_mul_forward(g.data(), u.data(), h2.data(), cut);
    silu_mul_forward(g.data() + cut, u.data() + cut, h2.data() + cut, n - cut);
    silu_mul_backward(g.data(), u.data(), dh.data(), dg2.data(), du2.data(), cut);
    silu_mul_backward(g.data() + cut, u.data() + cut, dh.data() + cut, dg2.data() + cut,
                      du2.data() + cut, n - cut);
    EXPECT_EQ(h2, h) << cut;
    EXPECT_EQ(dg2, dg) << cut;
    EXPECT_EQ(du2, du) << cut;
  }
}

}  // namespace
