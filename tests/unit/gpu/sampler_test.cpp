// Sampling: greedy, distributions, truncation, penalties, seeds, log-probs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <vector>

#include "gpu/sampler.hpp"

namespace {

using namespace weft::gpu;

const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.5f, 2.9f, -1.0f};

TEST(sampler, greedy_is_argmax_and_logprobs_are_normalised) {
  sampling_params p;
  p.n_logprobs = 3;
  sampler s(p);
  const auto r = s.sample(logits, {});
  EXPECT_EQ(r.token, 1);
  ASSERT_EQ(r.top.size(), 3u);
  EXPECT_EQ(r.top[0].token, 1);
  EXPECT_EQ(r.top[1].token, 4);
  EXPECT_EQ(r.top[2].token, 2);
  double z = 0;
  for (float l : logits) z += std::exp(l);
  EXPECT_NEAR(r.logprob, 3.0 - std::log(z), 1e-5);
}

// A vocabulary-sized row (the vectorised normaliser's chunks and its scalar tail): log-probs
// within 2e-6 of the C library's exp in double, masked (-inf) entries included.
TEST(sampler, logprobs_of_a_large_vocabulary_match_double_precision) {
  std::vector<float> big(49157);
  uint64_t x = 0x9e3779b97f4a7c15ull;
  for (auto& l : big) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    l = static_cast<float>(static_cast<double>(x >> 11) * 0x1.0p-53 * 30.0 - 20.0);
  }
  big[7] = 14.5f;
  big[100] = -std::numeric_limits<float>::infinity();
  big[49156] = 9.0f;
  double z = 0.0;
  for (float l : big) z += std::exp(static_cast<double>(l) - 14.5);
  const double log_z = std::log(z) + 14.5;
  sampling_params p;
  p.n_logprobs = 2;
  sampler s(p);
  const auto r = s.sample(big, {});
  EXPECT_EQ(r.token, 7);
  EXPECT_NEAR(r.logprob, 14.5 - log_z, 2e-6);
  ASSERT_EQ(r.top.size(), 2u);
  EXPECT_NEAR(r.top[1].logprob, static_cast<double>(big[r.top[1].token]) - log_z, 2e-6);
  // Tempered (the RL behaviour policy at T = 0.7): the drawn token's log-probability under
  // softmax(l / T), against double precision.
  sampling_params t;
  t.temperature = 0.7f;
  t.tempered_logprobs = true;
  t.seed = 3;
  sampler ts(t);
  const auto d = ts.sample(big, {});
  double zt = 0.0;
  for (float l : big) zt += std::exp((static_cast<double>(l) - 14.5) / 0.7f);
  const double want = (static_cast<double>(big[d.token]) - 14.5) / 0.7f - std::log(zt);
  EXPECT_NEAR(d.logprob, want, 4e-6);
}

// Log-probs are of the raw logits unless tempered_logprobs asks for the sampling distribution's
// (before truncation): RL records the policy a rollout was drawn from.
TEST(sampler, tempered_logprobs_are_of_the_distribution_drawn_from) {
  for (const bool tempered : {false, true})
    for (const float t : {0.5f, 1.0f, 1.6f}) {
      sampling_params p;
      p.temperature = t;
      p.top_p = 0.9f;
      p.n_logprobs = 2;
      p.seed = 7;
      p.tempered_logprobs = tempered;
      sampler s(p);
      const auto r = s.sample(logits, {});
      const double scale = tempered ? 1.0 / t : 1.0;
      double z = 0;
      for (float l : logits) z += std::exp(l * scale);
      auto want = [&](int32_t tok) {
        return logits[static_cast<size_t>(tok)] * scale - std::log(z);
      };
      EXPECT_NEAR(r.logprob, want(r.token), 1e-5) << tempered << " " << t;
      ASSERT_EQ(r.top.size(), 2u);
      EXPECT_NEAR(r.top[0].logprob, want(1), 1e-5);
      EXPECT_NEAR(r.top[1].logprob, want(4), 1e-5);
    }
  // Greedy reports the raw logits' whatever the flag.
  sampling_params g;
  g.tempered_logprobs = true;
  sampler s(g);
  double z = 0;
  for (float l : logits) z += std::exp(l);
  EXPECT_NEAR(s.sample(logits, {}).logprob, 3.0 - std::log(z), 1e-5);
}

TEST(sampler, temperature_sampling_follows_the_softmax) {
  sampling_params p;
  p.temperature = 0.7f;
  p.seed = 99;
  sampler s(p);
  std::vector<int> counts(logits.size());
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++counts[static_cast<size_t>(s.sample(logits, {}).token)];
  double z = 0;
  for (float l : logits) z += std::exp(l / 0.7);
  for (size_t i = 0; i < logits.size(); ++i) {
    const double expect = std::exp(logits[i] / 0.7) / z;
    EXPECT_NEAR(counts[i] / double(n), expect, 4 * std::sqrt(expect * (1 - expect) / n) + 1e-3)
        << i;
  }
}

TEST(sampler, top_k_top_p_min_p_truncate) {
  auto support = [](sampling_params p) {
    p.temperature = 1.0f;
    sampler s(p);
    std::map<int, int> seen;
    for (int i = 0; i < 3000; ++i) ++seen[s.sample(logits, {}).token];
    std::vector<int> out;
    for (auto& [t, c] : seen) out.push_back(t);
    return out;
  };
  sampling_params k;
  k.top_k = 2;
  EXPECT_EQ(support(k), (std::vector<int>{1, 4}));
  sampling_params tp;
  tp.top_p = 0.5f;  // p(1) ~ 0.39, p(4) ~ 0.35: both needed to reach 0.5
  EXPECT_EQ(support(tp), (std::vector<int>{1, 4}));
  sampling_params mp;
  mp.min_p = 0.3f;  // keeps p >= 0.3 * p_max: tokens 1, 4, 2
  EXPECT_EQ(support(mp), (std::vector<int>{1, 2, 4}));
}

TEST(sampler, penalties_change_the_choice) {
  sampling_params p;
  p.repetition_penalty = 2.0f;
  sampler s(p);
  const std::vector<int32_t> history = {1};
  EXPECT_EQ(s.sample(logits, history).token, 4);  // 3.0 / 2 < 2.9
  sampling_params f;
  f.frequency_penalty = 0.5f;
  sampler sf(f);
  const std::vector<int32_t> twice = {1, 1, 4};
  EXPECT_EQ(sf.sample(logits, twice).token, 4);  // 3 - 2 * 0.5 = 2.0 < 2.9 - 0.5 = 2.4
  sampling_params pr;
  pr.presence_penalty = 1.5f;
  sampler sp(pr);
  EXPECT_EQ(sp.sample(logits, twice).token, 2);  // 1.5 and 1.4 fall below 2.0
}

TEST(sampler, logit_bias_bans_and_forces_tokens) {
  // Greedy: the argmax (1) banned, the next best (4) wins; a small bias lifts token 0 past both.
  sampling_params ban;
  ban.logit_bias = {{1, -100.0f}};
  sampler sb(ban);
  const sample_result r = sb.sample(logits, {});
  EXPECT_EQ(r.token, 4);
  sampler plain(sampling_params{});
  EXPECT_FLOAT_EQ(r.logprob, plain.sample(logits, std::vector<int32_t>{}).logprob +
                                 (logits[4] - logits[1]));  // the model's, not the biased
  sampling_params lift;
  lift.logit_bias = {{0, 2.5f}, {99, 50.0f}};  // an id past the vocabulary is skipped
  EXPECT_EQ(sampler(lift).sample(logits, {}).token, 0);
  // Sampling: a banned token is never drawn, a forced one always.
  sampling_params t;
  t.temperature = 1.0f;
  t.seed = 3;
  t.logit_bias = {{1, -100.0f}, {4, -100.0f}};
  sampler st(t);
  t.logit_bias = {{2, 100.0f}};
  sampler sf(t);
  for (int i = 0; i < 200; ++i) {
    const int32_t a = st.sample(logits, {}).token;
    EXPECT_TRUE(a != 1 && a != 4) << a;
    EXPECT_EQ(sf.sample(logits, {}).token, 2);
  }
}

TEST(sampler, same_seed_same_tokens_independent_of_other_samplers) {
  sampling_params p;
  p.temperature = 1.0f;
  p.seed = 7;
  sampler a(p), b(p);
  sampling_params q = p;
  q.seed = 8;
  sampler other(q);
  for (int i = 0; i < 200; ++i) {
    (void)other.sample(logits, {});  // interleaved use of another request's sampler
    EXPECT_EQ(a.sample(logits, {}).token, b.sample(logits, {}).token);
  }
}

}  // namespace
