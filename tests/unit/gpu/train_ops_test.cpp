// The trainer's ops (gpu/train/train_ops): every op's gradient against central finite
// differences in f64 — linear, RMSNorm, RoPE, attention over packed sequences, SwiGLU and
// cross-entropy — and the float kernels against the double ones.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <span>
#include <vector>

#include "gpu/train/train_ops.hpp"
#include "tests/unit/gpu/finite_difference.hpp"

namespace {

using namespace weft::gpu;
using namespace weft::gpu::train;
using weft::gpu::train::testing::numeric;

std::vector<double> randn(size_t n, uint32_t seed, double scale = 1.0) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<double> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

/// Checks every element of `analytic` (the gradient of f w.r.t. `xs`) against finite differences.
void expect_gradient(const std::function<double()>& f, std::vector<double>& xs,
                     const std::vector<double>& analytic, const char* what, double tol = 1e-6) {
  ASSERT_EQ(xs.size(), analytic.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    const double num = numeric(f, xs[i]);
    EXPECT_NEAR(analytic[i], num, tol * std::max(1.0, std::abs(num))) << what << "[" << i << "]";
  }
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

TEST(train_ops, linear_gradients_match_finite_differences) {
  const int64_t n = 3, in = 5, out = 4;
  auto x = randn(n * in, 1), w = randn(out * in, 2), r = randn(n * out, 3);
  std::vector<double> y(n * out);
  auto f = [&] {
    linear_forward(x.data(), w.data(), n, in, out, y.data());
    return dot(y, r);
  };
  std::vector<double> dx(x.size(), 7.0), dw(w.size(), 0.0);
  linear_backward(x.data(), w.data(), r.data(), n, in, out, dx.data(), dw.data());
  expect_gradient(f, x, dx, "dx");
  expect_gradient(f, w, dw, "dw");
  // add_dx adds; dw always accumulates.
  std::vector<double> dx2(x.size(), 1.0), dw2 = dw;
  linear_backward(x.data(), w.data(), r.data(), n, in, out, dx2.data(), dw2.data(), true);
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(dx2[i], dx[i] + 1.0, 1e-12);
  for (size_t i = 0; i < dw.size(); ++i) EXPECT_NEAR(dw2[i], 2 * dw[i], 1e-12);
}

TEST(train_ops, rms_norm_gradients_match_finite_differences) {
  const int64_t n = 3, d = 8;
  auto x = randn(n * d, 4), g = randn(d, 5), r = randn(n * d, 6);
  std::vector<double> y(n * d), rstd(n);
  auto f = [&] {
    rms_norm_forward(x.data(), g.data(), n, d, 1e-5, y.data(), rstd.data());
    return dot(y, r);
  };
  f();
  std::vector<double> dx(x.size(), 0.0), dg(g.size(), 0.0);
  rms_norm_backward(x.data(), g.data(), rstd.data(), r.data(), n, d, dx.data(), dg.data());
  expect_gradient(f, x, dx, "dx");
  expect_gradient(f, g, dg, "dg");
}

TEST(train_ops, rope_inverse_is_the_backward_for_both_styles) {
  for (auto style : {rope_style::normal, rope_style::neox}) {
    const int64_t n = 4, heads = 2, hd = 8;
    std::vector<int32_t> pos = {0, 1, 2, 7};
    rope_config rc;
    rc.n_dims = hd;
    rc.freq_base = 10000.0f;
    rc.style = style;
    const auto table = make_rope_table(pos, rc);
    auto x = randn(n * heads * hd, 7), r = randn(n * heads * hd, 8);
    auto f = [&] {
      auto y = x;
      rope_apply(y.data(), n, heads, hd, table, style, false);
      return dot(y, r);
    };
    auto dx = r;
    rope_apply(dx.data(), n, heads, hd, table, style, true);
    expect_gradient(f, x, dx, "dx");
    // Position 0 is the identity; inverse undoes the rotation.
    auto y = x;
    rope_apply(y.data(), n, heads, hd, table, style, false);
    for (int64_t i = 0; i < heads * hd; ++i) EXPECT_DOUBLE_EQ(y[i], x[i]);
    rope_apply(y.data(), n, heads, hd, table, style, true);
    for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(y[i], x[i], 1e-12);
  }
}

TEST(train_ops, attention_gradients_match_finite_differences_over_packed_sequences) {
  packed_sequences seqs;
  seqs.starts = {0, 5, 8};
  const attention_shape shape{4, 2, 4, 0.5};
  const int64_t n = 8, qd = 16, kvd = 8;
  auto q = randn(n * qd, 9), k = randn(n * kvd, 10), v = randn(n * kvd, 11);
  auto r = randn(n * qd, 12);
  std::vector<double> out(n * qd), lse(n * 4);
  auto f = [&] {
    attention_forward(q.data(), k.data(), v.data(), seqs, shape, out.data(), lse.data());
    return dot(out, r);
  };
  f();
  std::vector<double> dq(q.size()), dk(k.size()), dv(v.size());
  attention_backward(q.data(), k.data(), v.data(), out.data(), lse.data(), r.data(), seqs, shape,
                     dq.data(), dk.data(), dv.data());
  expect_gradient(f, q, dq, "dq");
  expect_gradient(f, k, dk, "dk");
  expect_gradient(f, v, dv, "dv");
  // Causal and per-sequence: changing the last token of sequence 0 changes nothing before it
  // and nothing in sequence 1.
  f();
  const auto before = out;
  for (int64_t c = 0; c < kvd; ++c) {
    k[4 * kvd + c] += 1.0;
    v[4 * kvd + c] -= 1.0;
  }
  f();
  for (int64_t t = 0; t < n; ++t) {
    if (t == 4) continue;
    for (int64_t c = 0; c < qd; ++c) EXPECT_DOUBLE_EQ(out[t * qd + c], before[t * qd + c]) << t;
  }
}

TEST(train_ops, swiglu_and_cross_entropy_gradients_match_finite_differences) {
  const int64_t n = 12;
  auto gate = randn(n, 13), up = randn(n, 14), r = randn(n, 15);
  std::vector<double> h(n);
  auto f = [&] {
    swiglu_forward(gate.data(), up.data(), n, h.data());
    return dot(h, r);
  };
  std::vector<double> dg(n), du(n);
  swiglu_backward(gate.data(), up.data(), r.data(), n, dg.data(), du.data());
  expect_gradient(f, gate, dg, "dgate");
  expect_gradient(f, up, du, "dup");

  const int64_t rows = 3, vocab = 7;
  auto logits = randn(rows * vocab, 16, 3.0);
  const std::vector<int32_t> targets = {2, 0, 6};
  std::vector<double> dl(logits.size()), logp(rows);
  const double loss =
      cross_entropy(logits.data(), targets.data(), rows, vocab, 0.5, dl.data(), logp.data());
  EXPECT_NEAR(loss, -(logp[0] + logp[1] + logp[2]), 1e-12);
  auto ce = [&] {
    return 0.5 * cross_entropy(logits.data(), targets.data(), rows, vocab, 0.0,
                               static_cast<double*>(nullptr), static_cast<double*>(nullptr));
  };
  expect_gradient(ce, logits, dl, "dlogits");
}

// The float kernels (vectorised exp and SwiGLU) agree with the double ones, which the finite
// differences above check; sequences long enough for whole vectors and tails.
TEST(train_ops, float_kernels_agree_with_double) {
  auto to_f = [](const std::vector<double>& v) { return std::vector<float>(v.begin(), v.end()); };
  auto expect_near = [](const std::vector<float>& a, const std::vector<double>& b, double tol,
                        const char* what) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i)
      EXPECT_NEAR(a[i], b[i], tol * std::max(1.0, std::abs(b[i]))) << what << "[" << i << "]";
  };
  packed_sequences seqs;
  seqs.starts = {0, 37, 60};
  const attention_shape shape{4, 2, 8, 0.35};
  const int64_t n = 60, qd = 32, kvd = 16;
  auto q = randn(n * qd, 31), k = randn(n * kvd, 32), v = randn(n * kvd, 33);
  auto r = randn(n * qd, 34);
  std::vector<double> out(n * qd), lse(n * 4), dq(q.size()), dk(k.size()), dv(v.size());
  attention_forward(q.data(), k.data(), v.data(), seqs, shape, out.data(), lse.data());
  attention_backward(q.data(), k.data(), v.data(), out.data(), lse.data(), r.data(), seqs, shape,
                     dq.data(), dk.data(), dv.data());
  auto qf = to_f(q), kf = to_f(k), vf = to_f(v), rf = to_f(r);
  std::vector<float> outf(out.size()), lsef(lse.size()), dqf(dq.size()), dkf(dk.size()),
      dvf(dv.size());
  attention_forward(qf.data(), kf.data(), vf.data(), seqs, shape, outf.data(), lsef.data());
  attention_backward(qf.data(), kf.data(), vf.data(), outf.data(), lsef.data(), rf.data(), seqs,
                     shape, dqf.data(), dkf.data(), dvf.data());
  expect_near(outf, out, 1e-5, "out");
  expect_near(lsef, lse, 1e-5, "lse");
  expect_near(dqf, dq, 1e-4, "dq");
  expect_near(dkf, dk, 1e-4, "dk");
  expect_near(dvf, dv, 1e-4, "dv");

  const int64_t rows = 3, vocab = 301;
  auto logits = randn(rows * vocab, 35, 4.0);
  const std::vector<int32_t> targets = {2, 300, 150};
  std::vector<double> dl(logits.size()), logp(rows);
  const double loss =
      cross_entropy(logits.data(), targets.data(), rows, vocab, 0.25, dl.data(), logp.data());
  auto lf = to_f(logits);
  std::vector<float> dlf(dl.size()), logpf(rows);
  const double lossf =
      cross_entropy(lf.data(), targets.data(), rows, vocab, 0.25f, dlf.data(), logpf.data());
  EXPECT_NEAR(lossf, loss, 1e-5 * loss);
  expect_near(logpf, logp, 1e-5, "logp");
  expect_near(dlf, dl, 1e-6, "dlogits");

  auto gate = randn(77, 36, 3.0), up = randn(77, 37);
  std::vector<double> h(77), dg(77), du(77);
  swiglu_forward(gate.data(), up.data(), 77, h.data());
  swiglu_backward(gate.data(), up.data(), r.data(), 77, dg.data(), du.data());
  auto gf = to_f(gate), uf = to_f(up);
  std::vector<float> hf(77), dgf(77), duf(77);
  swiglu_forward(gf.data(), uf.data(), 77, hf.data());
  swiglu_backward(gf.data(), uf.data(), rf.data(), 77, dgf.data(), duf.data());
  expect_near(hf, h, 1e-6, "h");
  expect_near(dgf, dg, 1e-6, "dgate");
  expect_near(duf, du, 1e-6, "dup");
}

}  // namespace
