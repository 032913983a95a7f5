// AdamW, gradient-norm clipping and the learning-rate schedule against hand-computed values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <span>
#include <vector>

#include "gpu/train/optimizer.hpp"

namespace {

using namespace weft::gpu::train;

TEST(optimizer, adamw_matches_hand_computed_steps) {
  adamw_config c;
  c.weight_decay = 0.01;
  adamw opt(c);
  const std::vector<int64_t> sizes = {1, 1};
  opt.init(sizes);
  std::vector<float> p = {1.0f}, q = {1.0f}, g = {0.5f}, gq = {0.5f};
  const std::vector<uint8_t> decay = {1, 0};
  auto step = [&](float gv) {
    g[0] = gq[0] = gv;
    const std::vector<std::span<float>> vals = {p, q};
    const std::vector<std::span<const float>> grads = {g, gq};
    opt.step(vals, grads, decay, 0.1);
  };
  step(0.5f);
  // p ← p·(1 − lr·wd) − lr/(1−β1) · m / (√(v/(1−β2)) + eps) with m = 0.05, v = 0.00025.
  EXPECT_NEAR(p[0], 0.899000002, 1e-6);
  EXPECT_NEAR(q[0], 0.9, 1e-6);  // no decay
  step(-0.25f);
  EXPECT_NEAR(p[0], 0.8714672987058463, 1e-6);
  EXPECT_EQ(opt.steps(), 2);
}

// The vectorised element update gives the scalar tail's bits wherever a range is cut (threads cut
// anywhere), and PyTorch's formula in double to float rounding.
TEST(optimizer, adamw_update_bits_do_not_depend_on_the_cut_and_match_double) {
  const int64_t n = 1000;
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> p0(n), g(n), m0(n), v0(n);
  for (int64_t i = 0; i < n; ++i) {
    p0[i] = d(rng);
    g[i] = d(rng) * 1e-2f;
    m0[i] = d(rng) * 1e-3f;
    v0[i] = std::fabs(d(rng)) * 1e-5f;
  }
  adamw_config c;
  c.weight_decay = 0.1;
  const adamw_scalars sc = adamw(c).scalars(3, 1e-3);
  for (bool decay : {false, true}) {
    std::vector<float> p1 = p0, m1 = m0, v1 = v0;  // one range
    adamw_update_range(p1.data(), g.data(), m1.data(), v1.data(), 0, n, decay, sc);
    std::vector<float> p2 = p0, m2 = m0, v2 = v0;  // ranges cut at odd places, and one at a time
    int64_t lo = 0;
    for (int64_t cut : {3, 20, 37, 500, 999}) {
      adamw_update_range(p2.data(), g.data(), m2.data(), v2.data(), lo, cut, decay, sc);
      lo = cut;
    }
    adamw_update_range(p2.data(), g.data(), m2.data(), v2.data(), lo, n, decay, sc);
    EXPECT_EQ(p1, p2);
    EXPECT_EQ(m1, m2);
    EXPECT_EQ(v1, v2);
    for (int64_t i = 0; i < n; ++i) {
      const double b1 = 0.9, b2 = 0.999, lr = 1e-3;
      const double m = b1 * m0[i] + (1 - b1) * g[i];
      const double v = b2 * v0[i] + (1 - b2) * double(g[i]) * g[i];
      double p = decay ? p0[i] * (1 - lr * 0.1) : p0[i];
      p -= lr / (1 - std::pow(b1, 3)) * m / (std::sqrt(v / (1 - std::pow(b2, 3))) + 1e-8);
      // β1 and 1 − β1 are floats: relative 1e-6 of the terms, not of their (cancelling) sum.
      EXPECT_NEAR(m1[i], m, 1e-6 * (std::fabs(m0[i]) + std::fabs(g[i])) + 1e-12);
      EXPECT_NEAR(p1[i], p, 1e-6 * (1 + std::fabs(p)));
    }
  }
}

// Σ x² in double: the same bits with any thread count, and the double sum to rounding.
TEST(optimizer, sum_squares_is_fixed_by_the_data_alone) {
  for (int64_t n : {int64_t{0}, int64_t{5}, int64_t{1000}, int64_t{3} << 20}) {
    std::mt19937 rng(static_cast<uint32_t>(n));
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = d(rng);
    long double ref = 0;
    for (float v : x) ref += static_cast<long double>(v) * v;
    const double one = sum_squares(x.data(), n, 1);
    EXPECT_EQ(one, sum_squares(x.data(), n, 2));
    EXPECT_EQ(one, sum_squares(x.data(), n, 3));
    EXPECT_NEAR(one, static_cast<double>(ref), 1e-12 * static_cast<double>(ref) + 1e-300);
    // With a scale: the bits of summing the scaled copy.
    std::vector<float> scaled = x;
    for (auto& v : scaled) v *= 0.37f;
    EXPECT_EQ(sum_squares(scaled.data(), n, 1), sum_squares(x.data(), n, 2, 0.37f));
  }
}

// The global norm is √ of the tensors' sum_squares added in order, whatever the thread count and
// however the tensors' chunks fall among the threads (small tensors beside one larger than a
// chunk).
TEST(optimizer, global_grad_norm_is_the_tensors_sum_squares_in_order) {
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<std::vector<float>> t;
  for (int64_t n : {int64_t{3}, int64_t{200000}, int64_t{0}, int64_t{65537}, int64_t{17}}) {
    t.emplace_back(static_cast<size_t>(n));
    for (auto& v : t.back()) v = d(rng);
  }
  const std::vector<std::span<const float>> view(t.begin(), t.end());
  for (float scale : {1.0f, 0.37f}) {
    double ss = 0.0;
    for (const auto& x : t) ss += sum_squares(x.data(), static_cast<int64_t>(x.size()), 1, scale);
    for (int threads : {1, 2, 3})
      EXPECT_EQ(std::sqrt(ss), global_grad_norm(view, threads, scale)) << threads << " " << scale;
  }
}
// The fused update (the mean's scale and the clip factor applied as AdamW reads the gradients)
// gives the bits of scaling in place, clip_grad_norm and adamw::step, and leaves the sums alone.
TEST(optimizer, scale_clip_and_update_is_the_in_place_path_without_writing_the_gradients) {
  std::mt19937 rng(7);
  std::normal_distribution<float> d(0.0f, 3.0f);
  const std::vector<int64_t> sizes = {5, 1000, int64_t{3} << 18};
  for (const double max_norm : {0.0, 1e9, 0.5}) {  // no clipping, a limit not reached, clipping
    std::vector<std::vector<float>> p0, g0;
    for (int64_t n : sizes) {
      p0.emplace_back(static_cast<size_t>(n));
      g0.emplace_back(static_cast<size_t>(n));
      for (auto& v : p0.back()) v = d(rng);
      for (auto& v : g0.back()) v = d(rng) * 40.0f;
    }
    const float scale = 1.0f / 37.0f;
    const std::vector<uint8_t> decay = {0, 1, 1};
    adamw_config ac;
    ac.weight_decay = 0.1;
    ac.threads = 2;
    // The in-place path.
    auto p1 = p0;
    auto g1 = g0;
    adamw o1(ac);
    o1.init(sizes);
    std::vector<std::span<float>> v1, gs1;
    for (size_t i = 0; i < sizes.size(); ++i) {
      v1.emplace_back(p1[i]);
      gs1.emplace_back(g1[i]);
      for (auto& x : g1[i]) x *= scale;
    }
    const double n1 = clip_grad_norm(gs1, max_norm, ac.threads);
    std::vector<std::span<const float>> cg1(gs1.begin(), gs1.end());
    o1.step(v1, cg1, decay, 1e-3);
    // The fused one.
    auto p2 = p0;
    adamw o2(ac);
    o2.init(sizes);
    std::vector<std::span<float>> v2;
    std::vector<std::span<const float>> gs2;
    for (size_t i = 0; i < sizes.size(); ++i) {
      v2.emplace_back(p2[i]);
      gs2.emplace_back(g0[i]);
    }
    auto n2 = scale_clip_and_update(o2, v2, gs2, decay, scale, max_norm, 1e-3, 1);
    ASSERT_TRUE(n2.ok());
    EXPECT_EQ(*n2, n1) << max_norm;
    for (size_t i = 0; i < sizes.size(); ++i) {
      EXPECT_EQ(p1[i], p2[i]) << "tensor " << i << " max_norm " << max_norm;
      EXPECT_EQ(o1.m(i), o2.m(i));
      EXPECT_EQ(o1.v(i), o2.v(i));
    }
    EXPECT_EQ(o2.steps(), 1);
  }
  // A non-finite norm updates nothing.
  std::vector<float> p = {1.0f}, g = {std::numeric_limits<float>::infinity()};
  adamw o;
  o.init(std::vector<int64_t>{1});
  const std::vector<std::span<float>> v = {p};
  const std::vector<std::span<const float>> gs = {g};
  EXPECT_FALSE(scale_clip_and_update(o, v, gs, {}, 0.5f, 1.0, 1e-3, 4).ok());
  EXPECT_EQ(p[0], 1.0f);
  EXPECT_EQ(o.steps(), 0);
}

TEST(optimizer, clipping_and_schedule) {
  std::vector<float> a = {3.0f}, b = {4.0f};
  const std::vector<std::span<float>> gs = {a, b};
  EXPECT_NEAR(clip_grad_norm(gs, 10.0), 5.0, 1e-12);
  EXPECT_FLOAT_EQ(a[0], 3.0f);  // under the limit: untouched
  EXPECT_NEAR(clip_grad_norm(gs, 1.0), 5.0, 1e-12);
  EXPECT_NEAR(a[0], 3.0 / (5.0 + 1e-6), 1e-7);
  EXPECT_NEAR(b[0], 4.0 / (5.0 + 1e-6), 1e-7);

  lr_schedule s;
  s.peak = 1.0;
  s.warmup_steps = 10;
  s.total_steps = 110;
  s.min_ratio = 0.1;
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);  // half way down the cosine
  EXPECT_NEAR(s.at(110), 0.1, 1e-12);
  EXPECT_NEAR(s.at(500), 0.1, 1e-12);
  s.decay = lr_schedule::shape::constant;
  EXPECT_DOUBLE_EQ(s.at(60), 1.0);
}

}  // namespace
