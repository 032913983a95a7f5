// RL post-training's plain parts (gpu/rl/, docs/rl.md): GRPO advantages, PPO-clip and the loss
// aggregations against hand-computed values; the policy objective's gradient against weighted
// cross-entropy; in-place weight updates of the serving model and version namespaces of the prefix
// cache; tasks, verifiers and the held-out split; the rollout scheduler's invariants under random
// timings; the sync and async loops' determinism, weight sync, resume, and learning on a tiny
// model.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <tuple>

#include "gpu/device.hpp"
#include "gpu/gguf.hpp"
#include "gpu/kv_cache.hpp"
#include "gpu/model.hpp"
#include "gpu/rl/dispatch.hpp"
#include "gpu/rl/grpo.hpp"
#include "gpu/rl/grpo_loop.hpp"
#include "gpu/rl/reward_process.hpp"
#include "gpu/rl/tasks.hpp"
#include "gpu/tiny_model.hpp"
#include "gpu/train/trainable_model.hpp"

namespace {

using namespace weft::gpu;
using namespace weft::gpu::rl;
using weft::gpu::train::policy_token;
using weft::gpu::train::train_batch;
using weft::gpu::train::trainable_model;
namespace fs = std::filesystem;

tiny_model_config tiny_cfg(uint64_t seed = 42) {
  tiny_model_config c;
  c.n_layers = 2;
  c.n_embd = 32;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.n_ff = 64;
  c.n_vocab = 384;
  c.seed = seed;
  return c;
}

gguf_file tiny_file(uint64_t seed = 42) {
  auto img = make_tiny_model(tiny_cfg(seed));
  EXPECT_TRUE(img.ok());
  auto f = gguf_file::parse(*img);
  EXPECT_TRUE(f.ok());
  return std::move(f.value());
}

TEST(grpo, group_advantages_match_hand_computed_values) {
  const std::vector<double> r = {1, 0, 0, 1, 0.5, 0.5, 0.5, 0.5};
  const auto a = group_advantages(r, 4, true);
  // Group 0: mean 0.5, unbiased std sqrt(4·0.25/3) = 0.57735.
  const double sd = std::sqrt(1.0 / 3.0);
  EXPECT_NEAR(a[0], 0.5 / (sd + 1e-4), 1e-12);
  EXPECT_NEAR(a[1], -0.5 / (sd + 1e-4), 1e-12);
  for (int i = 4; i < 8; ++i) EXPECT_EQ(a[i], 0.0);  // no variance, no signal
  const auto d = group_advantages(r, 4, false);      // Dr. GRPO: centred only
  EXPECT_DOUBLE_EQ(d[0], 0.5);
  EXPECT_DOUBLE_EQ(d[2], -0.5);
  EXPECT_EQ(zero_variance_groups(r, 4), (std::vector<uint8_t>{0, 1}));
}

TEST(grpo, ppo_clip_takes_the_pessimistic_branch) {
  // Inside the trust region: ℓ = −r·A, dℓ/dlogp = −r·A.
  auto t = ppo_clip(std::log(1.1), 0.0, 2.0, 0.2, 0.28);
  EXPECT_NEAR(t.ratio, 1.1, 1e-12);
  EXPECT_NEAR(t.loss, -2.2, 1e-12);
  EXPECT_NEAR(t.dloss_dlogp, -2.2, 1e-12);
  EXPECT_FALSE(t.clipped);
  // A > 0 above 1 + clip_high: clipped, no gradient (DAPO's asymmetric ceiling 1.28).
  t = ppo_clip(std::log(1.5), 0.0, 2.0, 0.2, 0.28);
  EXPECT_TRUE(t.clipped);
  EXPECT_NEAR(t.loss, -2.0 * 1.28, 1e-12);
  EXPECT_EQ(t.dloss_dlogp, 0.0);
  // A < 0 below 1 − clip_low: clipped at 0.8.
  t = ppo_clip(std::log(0.5), 0.0, -1.0, 0.2, 0.28);
  EXPECT_TRUE(t.clipped);
  EXPECT_NEAR(t.loss, 0.8, 1e-12);
  EXPECT_EQ(t.dloss_dlogp, 0.0);
  // A < 0 above the ceiling: the unclipped term is the pessimistic one and keeps its gradient.
  t = ppo_clip(std::log(1.5), 0.0, -1.0, 0.2, 0.28);
  EXPECT_FALSE(t.clipped);
  EXPECT_NEAR(t.loss, 1.5, 1e-12);
  EXPECT_NEAR(t.dloss_dlogp, 1.5, 1e-12);
}

TEST(grpo, decoupled_importance_weight_is_truncated_and_detached) {
  // ratio e^0.5 ≈ 1.6487 under the cap: ℓ = −w·A, dℓ/dlogp = −w·A.
  auto t = decoupled_is(-1.0, -1.5, 2.0, 2.0);
  EXPECT_NEAR(t.ratio, std::exp(0.5), 1e-12);
  EXPECT_NEAR(t.loss, -2.0 * std::exp(0.5), 1e-12);
  EXPECT_NEAR(t.dloss_dlogp, -2.0 * std::exp(0.5), 1e-12);
  EXPECT_FALSE(t.clipped);
  // ratio e^1 over the cap 2: the weight is 2, still a gradient (PPO-clip would give none).
  t = decoupled_is(0.0, -1.0, 1.0, 2.0);
  EXPECT_TRUE(t.clipped);
  EXPECT_DOUBLE_EQ(t.dloss_dlogp, -2.0);
  EXPECT_DOUBLE_EQ(ppo_clip(0.0, -1.0, 1.0, 0.2, 0.2).dloss_dlogp, 0.0);
  // Negative advantages push the log-probability down with the same weight.
  t = decoupled_is(-2.0, -2.0, -0.5, 2.0);
  EXPECT_DOUBLE_EQ(t.dloss_dlogp, 0.5);
  off_policy_correction c{};
  EXPECT_TRUE(parse_off_policy_correction("decoupled", c));
  EXPECT_EQ(c, off_policy_correction::decoupled);
  EXPECT_FALSE(parse_off_policy_correction("tis", c));
}

TEST(grpo, kl_k3_and_its_gradient_by_hand) {
  auto k = kl_k3(-1.5, -1.5);
  EXPECT_DOUBLE_EQ(k.kl, 0.0);
  EXPECT_DOUBLE_EQ(k.dkl_dlogp, 0.0);
  k = kl_k3(-1.0, -2.0);  // d = ref − logp = −1
  EXPECT_NEAR(k.kl, std::exp(-1.0) + 1.0 - 1.0, 1e-12);
  EXPECT_NEAR(k.dkl_dlogp, 1.0 - std::exp(-1.0), 1e-12);  // > 0: pushes logp back down
  k = kl_k3(-3.0, -2.0);
  EXPECT_NEAR(k.kl, std::exp(1.0) - 2.0, 1e-12);
  EXPECT_LT(k.dkl_dlogp, 0.0);  // pushes logp back up
}

TEST(rollout_scheduler, sync_admits_one_step_at_a_time) {
  rollout_scheduler s(scheduler_config{2, 2, 0, 3});
  EXPECT_EQ(s.admit(), std::vector<int64_t>{0});
  EXPECT_TRUE(s.admit().empty());
  EXPECT_FALSE(s.ready());
  EXPECT_FALSE(s.train().ok());
  for (int64_t g = 0; g < 2; ++g) {
    for (int64_t j = 0; j < 2; ++j) ASSERT_TRUE(s.finish({0, g, j}, 0, 0).ok());
  }
  EXPECT_EQ(s.finish({0, 1, 1}, 0, 0).code(), status_code::invalid_argument);  // twice
  EXPECT_EQ(s.finish({1, 0, 0}, 0, 0).code(), status_code::invalid_argument);  // not admitted
  EXPECT_EQ(s.finish({0, 2, 0}, 0, 0).code(), status_code::invalid_argument);  // no such group
  ASSERT_TRUE(s.ready());
  auto t = s.train();
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->staleness, std::vector<int64_t>(4, 0));
  EXPECT_EQ(s.version(), 1);
  EXPECT_EQ(s.finish({0, 0, 0}, 0, 0).code(), status_code::invalid_argument);  // trained
  EXPECT_EQ(s.admit(), std::vector<int64_t>{1});
  // Versions a sample cannot have: newer than the trainer's, older than its admission.
  EXPECT_EQ(s.finish({1, 0, 0}, 1, 2).code(), status_code::invalid_argument);
  EXPECT_EQ(s.finish({1, 0, 0}, 0, 1).code(), status_code::invalid_argument);
}

TEST(rollout_scheduler, async_admits_k_steps_ahead_and_stops_at_the_last_step) {
  rollout_scheduler s(scheduler_config{1, 2, 2, 4});
  EXPECT_EQ(s.admit(), (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(s.in_flight(), 6);
  for (int64_t j = 0; j < 2; ++j) ASSERT_TRUE(s.finish({2, 0, j}, 0, 0).ok());  // out of order
  EXPECT_FALSE(s.ready());
  for (int64_t j = 0; j < 2; ++j) ASSERT_TRUE(s.finish({0, 0, j}, 0, 0).ok());
  ASSERT_TRUE(s.train().ok());
  EXPECT_EQ(s.admit(), std::vector<int64_t>{3});
  ASSERT_TRUE(s.finish({1, 0, 0}, 0, 1).ok());
  ASSERT_TRUE(s.finish({1, 0, 1}, 0, 0).ok());
  auto t = s.train();
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->staleness, (std::vector<int64_t>{1, 1}));
  ASSERT_TRUE(s.train().ok());     // step 2 finished long ago: 2 versions old, within K
  EXPECT_TRUE(s.admit().empty());  // step 4 is past the end
  EXPECT_EQ(s.staleness_histogram(), (std::vector<int64_t>{2, 2, 2}));
}

/// Property test: random rollout lengths, random trainer delays, random token versions; for every
/// K, every sample is trained exactly once, none is lost and none is older than K versions.
TEST(rollout_scheduler, random_timings_never_lose_repeat_or_overage_a_sample) {
  std::mt19937_64 rng(2026);
  for (int64_t K = 0; K <= 3; ++K) {
    for (int trial = 0; trial < 20; ++trial) {
      const int64_t P = 1 + static_cast<int64_t>(rng() % 3),
                    G = 2 + static_cast<int64_t>(rng() % 3);
      const int64_t steps = 6 + static_cast<int64_t>(rng() % 6);
      rollout_scheduler s(scheduler_config{P, G, K, steps});
      struct running {
        sample_key key;
        int64_t left = 0, oldest = -1, newest = -1;
      };
      std::vector<running> live;
      std::map<std::tuple<int64_t, int64_t, int64_t>, int> finished;
      int64_t trainer_busy = 0;
      while (s.version() < steps) {
        for (int64_t m : s.admit()) {
          for (int64_t g = 0; g < P; ++g) {
            for (int64_t j = 0; j < G; ++j) {
              live.push_back({{m, g, j}, 1 + static_cast<int64_t>(rng() % 40), -1, -1});
            }
          }
        }
        // One engine step: every live sample makes a token with the current version.
        for (auto& r : live) {
          if (r.oldest < 0) r.oldest = s.version();
          r.newest = s.version();
          --r.left;
        }
        for (size_t i = 0; i < live.size();) {
          if (live[i].left <= 0) {
            ASSERT_TRUE(s.finish(live[i].key, live[i].oldest, live[i].newest).ok());
            ++finished[{live[i].key.step, live[i].key.group, live[i].key.index}];
            live[i] = live.back();
            live.pop_back();
          } else {
            ++i;
          }
        }
        if (trainer_busy > 0) {
          --trainer_busy;
        } else if (s.ready()) {
          auto t = s.train();
          ASSERT_TRUE(t.ok()) << t.error().message();
          for (int64_t lag : t->staleness) ASSERT_LE(lag, K);
          trainer_busy = static_cast<int64_t>(rng() % 10);
        }
        ASSERT_EQ(s.in_flight(), static_cast<int64_t>(live.size()));
      }
      EXPECT_TRUE(live.empty());
      EXPECT_EQ(s.trained_samples(), steps * P * G);
      EXPECT_EQ(static_cast<int64_t>(finished.size()), steps * P * G);
      for (const auto& [k, n] : finished) ASSERT_EQ(n, 1);
      const auto& h = s.staleness_histogram();
      EXPECT_LE(static_cast<int64_t>(h.size()), K + 1);
      EXPECT_EQ(std::accumulate(h.begin(), h.end(), int64_t{0}), steps * P * G);
    }
  }
}

TEST(dispatch, the_ranker_learns_prompts_then_similar_prompts_then_falls_back_to_the_prior) {
  length_ranker r(64.0);
  EXPECT_EQ(r.predict(1, 100), 64.0);
  r.observe(1, 100, 300);
  r.observe(1, 100, 500);
  EXPECT_EQ(r.predict(1, 100), 400.0);  // its own history
  EXPECT_EQ(r.predict(2, 120), 400.0);  // a new prompt of similar length: the bucket's mean
  r.observe(3, 10, 20);
  EXPECT_EQ(r.predict(4, 9), 20.0);   // the short-prompt bucket
  EXPECT_EQ(r.predict(5, 30), 20.0);  // nearest bucket with history, shorter first
  length_ranker bounded(64.0, 1);
  bounded.observe(1, 100, 10);
  bounded.observe(2, 100, 30);  // table full: feeds only its bucket
  EXPECT_EQ(bounded.prompts_known(), 1);
  EXPECT_EQ(bounded.predict(2, 100), 20.0);
}

TEST(dispatch, longest_first_placement_beats_round_robin_on_makespan) {
  const std::vector<dispatch_item> items{{0, 7}, {1, 5}, {2, 4}, {3, 3}, {4, 3}, {5, 2}};
  std::vector<double> load(2, 0.0);
  const auto lpt = place_longest_first(items, load);
  EXPECT_EQ(lpt, (std::vector<int>{0, 1, 1, 0, 1, 0}));
  EXPECT_EQ(*std::max_element(load.begin(), load.end()), 12.0);
  const auto rr = place_round_robin(items.size(), 2);
  std::vector<double> rr_load(2, 0.0);
  for (size_t i = 0; i < items.size(); ++i)
    rr_load[static_cast<size_t>(rr[i])] += items[i].predicted;
  EXPECT_EQ(*std::max_element(rr_load.begin(), rr_load.end()), 14.0);
  // Existing load counts: everything goes to the idle agent until it catches up.
  std::vector<double> busy{10.0, 0.0};
  EXPECT_EQ(place_longest_first(std::vector<dispatch_item>{{0, 4}, {1, 4}}, busy),
            (std::vector<int>{1, 1}));
  EXPECT_EQ(longest_first_order(items).front(), 0u);
  EXPECT_EQ(place_round_robin(3, 2, 1), (std::vector<int>{1, 0, 1}));
}

TEST(grpo, loss_aggregations_weight_tokens_as_documented) {
  const std::vector<int64_t> len = {2, 4, 6};
  const std::vector<uint8_t> keep = {1, 1, 0};
  auto w = sample_token_weights(len, keep, loss_aggregation::token, 8);
  EXPECT_DOUBLE_EQ(w[0], 1.0 / 6);  // kept tokens: 2 + 4
  EXPECT_DOUBLE_EQ(w[1], 1.0 / 6);
  EXPECT_EQ(w[2], 0.0);
  w = sample_token_weights(len, keep, loss_aggregation::sequence, 8);
  EXPECT_DOUBLE_EQ(w[0], 1.0 / (2 * 2));
  EXPECT_DOUBLE_EQ(w[1], 1.0 / (2 * 4));
  w = sample_token_weights(len, keep, loss_aggregation::constant, 8);
  EXPECT_DOUBLE_EQ(w[0], 1.0 / (2 * 8));
  EXPECT_DOUBLE_EQ(w[1], 1.0 / (2 * 8));
  loss_aggregation a;
  EXPECT_TRUE(parse_loss_aggregation("sequence", a));
  EXPECT_EQ(a, loss_aggregation::sequence);
  EXPECT_FALSE(parse_loss_aggregation("mean", a));
}

/// Gradient of the policy objective = Σ_s A_s·w_s · ∇(cross-entropy of sequence s) at ratio 1
/// (behaviour log-p = the model's own), and zero for tokens whose ratio is clipped.
TEST(grpo, policy_objective_gradient_is_advantage_weighted_cross_entropy) {
  auto file = tiny_file();
  auto m = trainable_model<float>::load(file);
  ASSERT_TRUE(m.ok()) << m.error().message();
  auto& model = **m;
  const std::vector<int32_t> s1 = {5, 9, 40, 77, 12, 3}, s2 = {8, 100, 7, 260, 1};
  const std::vector<uint8_t> l1 = {0, 0, 1, 1, 1, 1}, l2 = {0, 1, 1, 1, 1};
  const float a1 = 1.7f, w1 = 0.25f, a2 = -0.6f, w2 = 0.125f;
  // The model's own log-probs of each sequence's targets.
  auto own_logp = [&](const std::vector<int32_t>& s, const std::vector<uint8_t>& l) {
    train_batch b;
    b.add(s, l);
    return model.target_logprobs(b).value();
  };
  auto info_of = [&](const std::vector<int32_t>& s, const std::vector<uint8_t>& l, float a, float w,
                     float shift) {
    const auto lp = own_logp(s, l);
    std::vector<policy_token> info(s.size());
    size_t k = 0;
    for (size_t i = 0; i < s.size(); ++i) {
      if (l[i] == 0) continue;
      info[i] = policy_token{lp[k++] + shift, a, w, 0};
    }
    return info;
  };
  train_batch b;
  b.add(s1, l1, info_of(s1, l1, a1, w1, 0.0f));
  b.add(s2, l2, info_of(s2, l2, a2, w2, 0.0f));
  grpo_config cfg;
  model.zero_grad();
  ppo_stats stats;
  ASSERT_TRUE(model.forward_backward(b, ppo_objective(cfg, &stats)).ok());
  EXPECT_EQ(stats.tokens.load(), 8);
  EXPECT_EQ(stats.clipped.load(), 0);
  EXPECT_LT(stats.mean_abs_ratio_deviation(), 1e-5);
  std::vector<std::vector<float>> got;
  for (auto& p : model.parameters()) got.push_back(p.grad);
  // Reference: the two sequences' cross-entropy gradients, weighted.
  std::vector<std::vector<float>> want(got.size());
  for (int which = 0; which < 2; ++which) {
    train_batch c;
    c.add(which == 0 ? s1 : s2, which == 0 ? l1 : l2);
    model.zero_grad();
    ASSERT_TRUE(model.forward_backward(c).ok());
    const double k = which == 0 ? a1 * w1 : a2 * w2;
    for (size_t i = 0; i < got.size(); ++i) {
      const auto& g = model.parameters()[i].grad;
      want[i].resize(g.size(), 0.0f);
      for (size_t j = 0; j < g.size(); ++j) want[i][j] += static_cast<float>(k * g[j]);
    }
  }
  for (size_t i = 0; i < got.size(); ++i) {
    float mx = 0.0f, err = 0.0f;
    for (size_t j = 0; j < got[i].size(); ++j) {
      mx = std::max(mx, std::fabs(want[i][j]));
      err = std::max(err, std::fabs(want[i][j] - got[i][j]));
    }
    EXPECT_LE(err, 1e-4f * mx + 1e-9f) << model.parameters()[i].name;
    EXPECT_GT(mx, 0.0f) << model.parameters()[i].name;
  }
  // Behaviour log-p far below the model's (ratio e^2 > 1.2) with positive advantages: every
  // token is clipped and nothing flows back.
  train_batch clipped;
  clipped.add(s1, l1, info_of(s1, l1, a1, w1, -2.0f));
  model.zero_grad();
  ppo_stats cs;
  ASSERT_TRUE(model.forward_backward(clipped, ppo_objective(cfg, &cs)).ok());
  EXPECT_EQ(cs.clipped.load(), 4);
  for (const auto& p : model.parameters()) {
    for (float g : p.grad) ASSERT_EQ(g, 0.0f) << p.name;
  }
}

/// A shared prefix (a GRPO group's prompt, computed once) gives the loss and gradients of packing
/// prefix + sequence separately for each sequence: exactly (to f64 rounding) in double, and with
/// the PPO objective in float.
TEST(shared_prefix, equals_packing_the_prefix_with_every_sequence) {
  auto file = tiny_file();
  const std::vector<int32_t> prompt = {1, 17, 90, 5, 200, 33, 71};  // last token leads each sample
  const std::vector<std::vector<int32_t>> completions = {{9, 40, 2}, {12, 7, 300, 8, 2}, {5}};
  auto expanded = [&](bool policy, float adv_sign) {
    train_batch b;
    b.add(std::vector<int32_t>{3, 4, 5, 6}, std::vector<uint8_t>{0, 1, 1, 1});  // an unrelated one
    for (size_t c = 0; c < completions.size(); ++c) {
      std::vector<int32_t> t = prompt;
      t.insert(t.end(), completions[c].begin(), completions[c].end());
      std::vector<uint8_t> l(t.size(), 0);
      std::vector<policy_token> info(t.size());
      for (size_t i = prompt.size(); i < t.size(); ++i) {
        l[i] = 1;
        info[i] = policy_token{-3.0f, adv_sign * (0.5f + static_cast<float>(c)), 0.1f, 0};
      }
      if (policy) {
        b.add(t, l, info);
      } else {
        b.add(t, l);
      }
    }
    return b;
  };
  auto shared = [&](float adv_sign) {
    train_batch b;
    b.add(std::vector<int32_t>{3, 4, 5, 6}, std::vector<uint8_t>{0, 1, 1, 1});
    const int64_t p = b.add_prefix(std::span<const int32_t>(prompt).first(prompt.size() - 1));
    for (size_t c = 0; c < completions.size(); ++c) {
      std::vector<int32_t> t = {prompt.back()};
      t.insert(t.end(), completions[c].begin(), completions[c].end());
      std::vector<uint8_t> l(t.size(), 1);
      l[0] = 0;
      std::vector<policy_token> info(t.size());
      for (size_t i = 1; i < t.size(); ++i) {
        info[i] = policy_token{-3.0f, adv_sign * (0.5f + static_cast<float>(c)), 0.1f, 0};
      }
      b.add(t, l, info, p);
    }
    return b;
  };
  {  // f64, cross-entropy: the same loss and gradients to rounding.
    auto m = trainable_model<double>::load(file);
    ASSERT_TRUE(m.ok());
    auto run = [&](const train_batch& b) {
      (*m)->zero_grad();
      auto l = (*m)->forward_backward(b);
      EXPECT_TRUE(l.ok()) << l.error().message();
      std::vector<std::vector<double>> g;
      for (auto& p : (*m)->parameters()) g.push_back(p.grad);
      return std::make_pair(*l, g);
    };
    train_batch sb = shared(1.0f);
    sb.policy.clear();
    const auto [la, ga] = run(expanded(false, 1.0f));
    const auto [lb, gb] = run(sb);
    EXPECT_EQ(la.tokens, lb.tokens);
    EXPECT_NEAR(la.sum, lb.sum, 1e-10 * std::fabs(la.sum));
    for (size_t i = 0; i < ga.size(); ++i) {
      double mx = 0, err = 0;
      for (size_t j = 0; j < ga[i].size(); ++j) {
        mx = std::max(mx, std::fabs(ga[i][j]));
        err = std::max(err, std::fabs(ga[i][j] - gb[i][j]));
      }
      EXPECT_LE(err, 1e-10 * mx) << (*m)->parameters()[i].name;
    }
  }
  {  // f32, the PPO objective, parallel shares of one batch each.
    auto m = trainable_model<float>::load(file);
    ASSERT_TRUE(m.ok());
    grpo_config cfg;
    auto run = [&](const train_batch& b) {
      (*m)->zero_grad();
      ppo_stats st;
      auto l = (*m)->forward_backward(b, ppo_objective(cfg, &st));
      EXPECT_TRUE(l.ok()) << l.error().message();
      std::vector<std::vector<float>> g;
      for (auto& p : (*m)->parameters()) g.push_back(p.grad);
      return std::make_pair(*l, g);
    };
    const auto [la, ga] = run(expanded(true, -1.0f));
    const auto [lb, gb] = run(shared(-1.0f));
    EXPECT_EQ(la.tokens, lb.tokens);
    EXPECT_NEAR(la.sum, lb.sum, 1e-5 * std::fabs(la.sum));
    for (size_t i = 0; i < ga.size(); ++i) {
      float mx = 0, err = 0;
      for (size_t j = 0; j < ga[i].size(); ++j) {
        mx = std::max(mx, std::fabs(ga[i][j]));
        err = std::max(err, std::fabs(ga[i][j] - gb[i][j]));
      }
      EXPECT_LE(err, 1e-4f * mx) << (*m)->parameters()[i].name;
    }
  }
  // A prefix must be an earlier sequence without a prefix of its own.
  train_batch bad = shared(1.0f);
  bad.seqs.prefix[1] = 2;
  auto m = trainable_model<float>::load(file);
  EXPECT_EQ((*m)->forward_backward(bad).error().code(), status_code::invalid_argument);
}

TEST(rollout_weights, set_weight_makes_the_engine_serve_the_new_weights) {
  auto dev = device_registry::instance().create("cpu", device_config{1, 0});
  ASSERT_TRUE(dev.ok());
  auto mine = model::load(tiny_file(42), **dev);
  auto other = model::load(tiny_file(7), **dev);
  ASSERT_TRUE(mine.ok() && other.ok());
  // Copy every tensor of model 7 into model 42, as floats.
  for (const gguf_tensor& t : (*other)->file().tensors()) {
    std::vector<float> v(static_cast<size_t>(t.n_elements));
    for (int64_t r = 0; r < t.n_rows(); ++r) {
      ASSERT_EQ(dequantize_row(t.type, t.data + static_cast<size_t>(r) * t.row_size_bytes(),
                               v.data() + r * t.ne[0], t.ne[0]),
                row_status::ok);
    }
    ASSERT_TRUE((*mine)->set_weight(t.name, v).ok()) << t.name;
  }
  auto logits_of = [&](model& m) {
    kv_cache_config kc;
    kc.layout = m.kv_layout_for(16);
    kc.n_blocks = 8;
    auto kv = kv_cache::create(**dev, kc).value();
    const seq_id s = kv->create_sequence();
    forward_batch b;
    const std::vector<int32_t> toks = {5, 17, 90, 200};
    b.add(s, toks, true);
    forward_output out;
    EXPECT_TRUE(m.forward(b, *kv, out).ok());
    return out.logits;
  };
  EXPECT_EQ(logits_of(**mine), logits_of(**other));
  // Wrong size and unknown names are errors; a read-only mapped file cannot be updated.
  std::vector<float> small(3);
  EXPECT_EQ((*mine)->set_weight("output_norm.weight", small).code(), status_code::invalid_argument);
  EXPECT_EQ((*mine)->set_weight("nope", small).code(), status_code::not_found);
  const auto path = fs::temp_directory_path() / ("weft-rl-tiny-" + std::to_string(::getpid()));
  ASSERT_TRUE(write_tiny_model(tiny_cfg(), path).ok());
  auto mapped = model::load(gguf_file::open(path).value(), **dev);
  ASSERT_TRUE(mapped.ok());
  std::vector<float> norm(32, 1.0f);
  EXPECT_EQ((*mapped)->set_weight("output_norm.weight", norm).code(), status_code::unsupported);
  fs::remove(path);
}

TEST(rollout_weights, a_new_prefix_namespace_never_matches_old_blocks) {
  auto dev = device_registry::instance().create("cpu", device_config{1, 0});
  kv_cache_config kc;
  kc.layout = kv_layout{1, 2, 4, 4};
  kc.n_blocks = 16;
  auto kv = kv_cache::create(**dev, kc).value();
  const std::vector<int32_t> toks = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const seq_id a = kv->create_sequence();
  ASSERT_TRUE(kv->reserve(a, 9).ok());
  ASSERT_TRUE(kv->commit(a, toks).ok());
  EXPECT_EQ(kv->match_prefix(toks), 8);
  kv->set_prefix_namespace(1);
  EXPECT_EQ(kv->match_prefix(toks), 0);
  // A sequence created under version 0 still publishes its blocks under version 0.
  const seq_id b = kv->create_sequence();
  ASSERT_TRUE(kv->reserve(b, 9).ok());
  ASSERT_TRUE(kv->commit(b, toks).ok());
  EXPECT_EQ(kv->match_prefix(toks), 8);
  kv->set_prefix_namespace(0);
  EXPECT_EQ(kv->match_prefix(toks), 8);
}

TEST(tasks, arithmetic_and_reverse_prompts_and_verifiers) {
  auto add = make_arithmetic_task(2, "+");
  const rl_prompt p = add->problem(3, 17);
  EXPECT_EQ(add->problem(3, 17).text, p.text);  // a pure function of (seed, index)
  EXPECT_NE(add->problem(4, 17).key, p.key);
  long long a = 0, b = 0;
  ASSERT_EQ(std::sscanf(p.key.c_str(), "%lld+%lld", &a, &b), 2);
  EXPECT_GE(a, 10);
  EXPECT_LE(b, 99);
  EXPECT_EQ(p.answer, std::to_string(a + b));
  EXPECT_EQ(add->reward(p, " The answer is " + p.answer + "."), 1.0);
  EXPECT_EQ(add->reward(p, std::to_string(a + b + 1)), 0.0);
  EXPECT_EQ(add->reward(p, p.key + " = " + p.answer), 1.0);  // restating the sum is fine
  EXPECT_EQ(add->reward(p, p.answer + " or " + std::to_string(a + b + 1)), 0.0);
  long long v = 0;
  ASSERT_TRUE(last_integer("3-8", v));
  EXPECT_EQ(v, 8);
  ASSERT_TRUE(last_integer("so = -5.", v));
  EXPECT_EQ(v, -5);
  EXPECT_FALSE(last_integer("none", v));
  EXPECT_EQ(add->reward(p, "I don't know"), 0.0);
  auto sub = make_arithmetic_task(1, "-");
  rl_prompt neg{"3-8", "", "-5", {}};
  EXPECT_EQ(sub->reward(neg, "-5"), 1.0);
  EXPECT_EQ(sub->reward(neg, "5"), 0.0);
  auto rev = make_reverse_task(5);
  const rl_prompt r = rev->problem(1, 2);
  EXPECT_EQ(r.answer, std::string(r.key.rbegin(), r.key.rend()));
  EXPECT_EQ(rev->reward(r, " \"" + r.answer + "\"\nmore"), 1.0);
  EXPECT_EQ(rev->reward(r, r.key == r.answer ? "zzzzz" : r.key), 0.0);
}

TEST(tasks, the_answer_format_rewards_the_tags_and_the_answer_inside_them) {
  auto t = make_answer_format_task(make_arithmetic_task(1, "+"), 0.1);
  const rl_prompt p = t->problem(5, 3);
  EXPECT_EQ(p.text.find("Answer with"), std::string::npos);
  EXPECT_NE(p.text.find("<answer></answer>"), std::string::npos);
  const std::string a = p.answer;
  EXPECT_DOUBLE_EQ(t->reward(p, "It is " + a + ".\n<answer>" + a + "</answer>\n"), 1.0);
  EXPECT_DOUBLE_EQ(t->reward(p, "<answer>" + std::to_string(std::stoi(a) + 1) + "</answer>"),
                   0.1);                   // formatted, wrong
  EXPECT_DOUBLE_EQ(t->reward(p, a), 0.0);  // right, not formatted
  EXPECT_DOUBLE_EQ(t->reward(p, "<answer>" + a + "</answer> and more"), 0.0);  // text after it
  EXPECT_DOUBLE_EQ(t->reward(p, "<answer>" + a), 0.0);                         // never closed
  EXPECT_DOUBLE_EQ(t->reward(p, "<answer>1</answer><answer>" + a + "</answer>"), 1.0);  // last
  EXPECT_EQ(t->reference_completion(p), "<answer>" + a + "</answer>");
  EXPECT_DOUBLE_EQ(t->reward(p, t->reference_completion(p)), 1.0);
  EXPECT_NE(t->name().find("<answer>"), std::string::npos);
}

TEST(tasks, countdown_problems_and_expressions) {
  double v = 0;
  std::vector<long long> used;
  ASSERT_TRUE(eval_expression("(25 - 3) * 2 / 4", v, used));
  EXPECT_DOUBLE_EQ(v, 11.0);
  EXPECT_EQ(used, (std::vector<long long>{25, 3, 2, 4}));
  ASSERT_TRUE(eval_expression("-3 + 10", v, used));
  EXPECT_DOUBLE_EQ(v, 7.0);
  EXPECT_FALSE(eval_expression("3 / (2 - 2)", v, used));
  EXPECT_FALSE(eval_expression("(3 + 4", v, used));
  EXPECT_FALSE(eval_expression("3 +", v, used));
  EXPECT_FALSE(eval_expression(std::string(200, '('), v, used));  // bounded nesting
  auto cd = make_countdown_task(3);
  rl_prompt p{"", "", "46", {3, 7, 25}};
  EXPECT_EQ(cd->reward(p, "25 + 3 * 7"), 1.0);
  EXPECT_EQ(cd->reward(p, "I think (3*7)+25 = 46."), 1.0);
  EXPECT_EQ(cd->reward(p, "25 + 21"), 0.0);         // 21 is not given
  EXPECT_EQ(cd->reward(p, "25 + 7 + 7 + 7"), 0.0);  // 7 used three times
  EXPECT_EQ(cd->reward(p, "25 + 3 + 7"), 0.0);      // 35
  EXPECT_EQ(cd->reward(p, "46"), 0.0);              // no expression
  for (int i = 0; i < 50; ++i) {
    const rl_prompt q = cd->problem(9, i);
    ASSERT_EQ(q.numbers.size(), 3u);
    const long long target = std::stoll(q.answer);
    EXPECT_GE(target, 1);
    EXPECT_LE(target, 999);
    for (long long n : q.numbers) EXPECT_TRUE(n >= 1 && n <= 25);
    EXPECT_EQ(cd->problem(9, i).key, q.key);
    EXPECT_NE(q.text.find("make " + q.answer), std::string::npos) << q.text;
  }
}

TEST(tasks, training_never_draws_a_held_out_problem) {
  auto add = make_arithmetic_task(1, "+");  // 100 distinct problems
  prompt_source src(*add, 5, 20);
  ASSERT_EQ(src.eval_set().size(), 20u);
  std::set<std::string> held;
  for (const auto& p : src.eval_set()) held.insert(p.key);
  std::vector<std::string> drawn;
  for (int i = 0; i < 500; ++i) {
    drawn.push_back(src.next().key);
    EXPECT_EQ(held.count(drawn.back()), 0u) << drawn.back();
  }
  // The cursor determines what comes next.
  prompt_source again(*add, 5, 20);
  again.set_cursor(250);
  for (int i = 250; i < 500; ++i) EXPECT_EQ(again.next().key, drawn[static_cast<size_t>(i)]);
}

TEST(tasks, datasets_hold_out_their_tail_and_name_bad_lines) {
  const auto dir = fs::temp_directory_path() / ("weft-rl-data-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  {
    std::ofstream f(dir / "good.jsonl");
    for (int i = 0; i < 10; ++i) {
      f << "{\"prompt\": \"q" << i << "\", \"answer\": " << i << "}\n";
    }
  }
  auto t = load_prompt_dataset(dir / "good.jsonl", answer_match::number);
  ASSERT_TRUE(t.ok()) << t.error().message();
  prompt_source src(**t, 1, 3);
  ASSERT_EQ(src.eval_set().size(), 3u);
  EXPECT_EQ(src.eval_set()[0].text, "q7");
  std::multiset<std::string> epoch;
  for (int i = 0; i < 7; ++i) epoch.insert(src.next().text);
  EXPECT_EQ(epoch, (std::multiset<std::string>{"q0", "q1", "q2", "q3", "q4", "q5", "q6"}));
  EXPECT_EQ((*t)->reward(src.eval_set()[0], "it is 7.0"), 1.0);
  {
    std::ofstream f(dir / "bad.jsonl");
    f << "{\"prompt\": \"ok\", \"answer\": \"1\"}\n"
      << "not json\n"
      << "{\"prompt\": \"no answer\"}\n";
  }
  auto bad = load_prompt_dataset(dir / "bad.jsonl", answer_match::exact);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("bad.jsonl:2"), std::string::npos) << bad.error().message();
  EXPECT_NE(bad.error().message().find("bad.jsonl:3"), std::string::npos);
  fs::remove_all(dir);
}

/// Writes a Python reward script; `first_run` is code run only by the first process started in
/// `dir` (a marker file tells), to make that one crash or hang.
std::string reward_script(const fs::path& dir, const std::string& name,
                          const std::string& first_run, const std::string& answer) {
  const fs::path script = dir / (name + ".py");
  std::ofstream f(script);
  f << "import json, os, sys, time\n"
    << "marker = "
    << "'" << (dir / (name + ".started")).string() << "'\n"
    << "first = not os.path.exists(marker)\n"
    << "open(marker, 'w').close()\n"
    << "reqs = []\n"
    << "for line in sys.stdin:\n"
    << "    r = json.loads(line)\n"
    << "    reqs.append(r)\n"
    << "    if first:\n"
    << "        " << (first_run.empty() ? "pass" : first_run) << "\n"
    << "    " << answer << "\n"
    << "    sys.stdout.flush()\n";
  return "python3 " + script.string();
}

TEST(reward_process, scores_restarts_after_crashes_and_hangs_and_names_bad_answers) {
  const auto dir = fs::temp_directory_path() / ("weft-reward-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<reward_request> items;
  for (int i = 0; i < 6; ++i) {
    items.push_back(reward_request{"p" + std::to_string(i),
                                   std::string(static_cast<size_t>(i), 'x'), std::to_string(i)});
  }
  const std::string good =
      "print(json.dumps({'id': r['id'], 'reward': len(r['completion']) / 10 + "
      "float(r['answer'] == str(r['id']))}))";
  auto expect_scores = [&](const std::vector<double>& got) {
    ASSERT_EQ(got.size(), items.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_DOUBLE_EQ(got[i], i / 10.0 + 1.0) << i;
  };
  {  // A well-behaved process, started once and reused across batches.
    reward_process rp({reward_script(dir, "good", "", good), 10.0, 3});
    auto a = rp.score(items);
    ASSERT_TRUE(a.ok()) << a.error().message();
    expect_scores(*a);
    auto b = rp.score(items);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(rp.starts(), 1);
    EXPECT_EQ(rp.restarts(), 0);
  }
  {  // The first process dies after two answers: restarted, the rest re-sent and scored.
    reward_process rp(
        {reward_script(dir, "crash", "os._exit(3) if len(reqs) == 3 else None", good), 10.0, 3});
    auto a = rp.score(items);
    ASSERT_TRUE(a.ok()) << a.error().message();
    expect_scores(*a);
    EXPECT_EQ(rp.restarts(), 1);
  }
  {  // The first process hangs: killed after the timeout, restarted, scored.
    reward_process rp({reward_script(dir, "hang", "time.sleep(3600)", good), 1.0, 3});
    auto a = rp.score(items);
    ASSERT_TRUE(a.ok()) << a.error().message();
    expect_scores(*a);
    EXPECT_EQ(rp.restarts(), 1);
  }
  {  // Garbage is an error, never a silent 0.
    reward_process rp({reward_script(dir, "garbage", "", "print('hello')"), 10.0, 3});
    auto a = rp.score(items);
    ASSERT_FALSE(a.ok());
    EXPECT_NE(a.error().message().find("'hello'"), std::string::npos) << a.error().message();
    reward_process nan(
        {reward_script(dir, "nan", "", "print(json.dumps({'id': r['id'], 'reward': 'high'}))"),
         10.0, 3});
    auto b = nan.score(items);
    ASSERT_FALSE(b.ok());
    EXPECT_NE(b.error().message().find("sample 0"), std::string::npos) << b.error().message();
  }
  {  // A process that always dies: the batch fails after the allowed restarts, saying why.
    reward_process rp({"exit 7", 10.0, 2});
    auto a = rp.score(items);
    ASSERT_FALSE(a.ok());
    EXPECT_NE(a.error().message().find("failed 3 time(s)"), std::string::npos)
        << a.error().message();
    EXPECT_NE(a.error().message().find("exited with status 7"), std::string::npos)
        << a.error().message();
  }
  fs::remove_all(dir);
}

/// A test task with a graded reward a random tiny model gets partly right: the fraction of the
/// completion's characters that are digits.
class digits_task final : public rl_task {
 public:
  std::string name() const override { return "digits"; }
  int64_t size() const override { return 0; }
  rl_prompt problem(uint64_t seed, int64_t index) const override {
    const std::string k = std::to_string((seed * 131 + static_cast<uint64_t>(index)) % 997);
    return rl_prompt{k, "Say some digits after " + k, "", {}};
  }
  double reward(const rl_prompt&, std::string_view c) const override {
    if (c.empty()) return 0.0;
    double d = 0;
    for (char ch : c) d += std::isdigit(static_cast<unsigned char>(ch)) ? 1 : 0;
    return d / static_cast<double>(c.size());
  }
};

grpo_loop_config loop_cfg() {
  grpo_loop_config c;
  c.seed = 11;
  c.prompts_per_step = 4;
  c.group_size = 6;
  c.max_new_tokens = 12;
  c.eval_prompts = 8;
  c.schedule.peak = 3e-3;
  c.schedule.total_steps = 100;
  c.schedule.decay = train::lr_schedule::shape::constant;
  c.shares = 2;
  return c;
}

std::unique_ptr<grpo_loop> make_loop(const gguf_file& file, const rl_task& task,
                                     const grpo_loop_config& c) {
  auto m = trainable_model<float>::load(file);
  EXPECT_TRUE(m.ok());
  auto loop = grpo_loop::create(file, std::move(*m), task, c);
  EXPECT_TRUE(loop.ok()) << loop.error().message();
  return std::move(*loop);
}

TEST(grpo_loop, sync_runs_repeat_bit_for_bit_and_the_engine_serves_the_trainers_weights) {
  const auto file = tiny_file();
  digits_task task;
  auto a = make_loop(file, task, loop_cfg());
  auto b = make_loop(file, task, loop_cfg());
  for (int s = 0; s < 3; ++s) {
    auto ra = a->step();
    auto rb = b->step();
    ASSERT_TRUE(ra.ok() && rb.ok()) << (ra.ok() ? rb.error().message() : ra.error().message());
    EXPECT_EQ(ra->reward_mean, rb->reward_mean);
    EXPECT_EQ(ra->loss, rb->loss);
    EXPECT_EQ(ra->version, s + 1);
    EXPECT_EQ(ra->samples, 24);
    EXPECT_GT(ra->completion_tokens, 0);
  }
  for (size_t i = 0; i < a->model().parameters().size(); ++i) {
    const auto& pa = a->model().parameters()[i];
    const auto& pb = b->model().parameters()[i];
    ASSERT_EQ(pa.value, pb.value) << pa.name;
    // The rollout engine's f32 copy is the trainer's, bit for bit.
    const gguf_tensor* t = a->rollout_model().file().find_tensor(pa.name);
    ASSERT_NE(t, nullptr);
    ASSERT_EQ(std::memcmp(t->data, pa.value.data(), pa.value.size() * sizeof(float)), 0) << pa.name;
  }
  // The first step trained on rollouts of version 0, so its ratios were ~1 (engine vs trainer
  // numerics only: the engine's fp16 KV cache).
  EXPECT_LT(a->history().front().ratio_deviation, 0.02);
}

TEST(grpo_loop, a_resumed_run_is_bit_identical_to_an_uninterrupted_one) {
  const auto file = tiny_file();
  digits_task task;
  auto whole = make_loop(file, task, loop_cfg());
  for (int s = 0; s < 4; ++s) ASSERT_TRUE(whole->step().ok());
  auto first = make_loop(file, task, loop_cfg());
  for (int s = 0; s < 2; ++s) ASSERT_TRUE(first->step().ok());
  train::checkpoint_state ckpt;
  first->snapshot_into(ckpt);
  first.reset();
  auto second = make_loop(file, task, loop_cfg());
  ASSERT_TRUE(second->restore(ckpt).ok());
  EXPECT_EQ(second->version(), 2);
  for (int s = 0; s < 2; ++s) ASSERT_TRUE(second->step().ok());
  for (size_t i = 0; i < whole->model().parameters().size(); ++i) {
    ASSERT_EQ(whole->model().parameters()[i].value, second->model().parameters()[i].value)
        << whole->model().parameters()[i].name;
  }
  ASSERT_EQ(whole->history().size(), second->history().size());
  for (size_t i = 0; i < whole->history().size(); ++i) {
    EXPECT_EQ(whole->history()[i].loss, second->history()[i].loss) << "step " << i + 1;
  }
  // Another seed's checkpoint is refused.
  auto other_cfg = loop_cfg();
  other_cfg.seed = 12;
  auto other = make_loop(file, task, other_cfg);
  EXPECT_EQ(other->restore(ckpt).code(), status_code::invalid_argument);
}

TEST(grpo_loop, async_runs_repeat_bit_for_bit_within_the_staleness_bound) {
  const auto file = tiny_file();
  digits_task task;
  auto cfg = loop_cfg();
  cfg.max_staleness = 2;
  cfg.total_steps = 5;
  auto a = make_loop(file, task, cfg);
  auto b = make_loop(file, task, cfg);
  int64_t mixed = 0, stale = 0;
  for (int s = 0; s < 5; ++s) {
    auto ra = a->step();
    auto rb = b->step();
    ASSERT_TRUE(ra.ok() && rb.ok()) << (ra.ok() ? rb.error().message() : ra.error().message());
    EXPECT_EQ(ra->loss, rb->loss);
    EXPECT_EQ(ra->samples, 24);
    EXPECT_EQ(ra->version, s + 1);
    EXPECT_LE(ra->staleness_max, 2);
    mixed += ra->mixed_version_samples;
    stale += ra->staleness_max;
    // An evaluation between steps shares the engine with the rollouts in flight.
    if (s == 1) {
      ASSERT_TRUE(a->evaluate().ok() && b->evaluate().ok());
    }
  }
  EXPECT_GT(stale, 0);  // later steps did generate while earlier ones trained
  std::printf("async K=2: %lld samples of mixed versions\n", static_cast<long long>(mixed));
  for (size_t i = 0; i < a->model().parameters().size(); ++i) {
    ASSERT_EQ(a->model().parameters()[i].value, b->model().parameters()[i].value);
  }
  EXPECT_EQ(a->scheduler().trained_samples(), 5 * 24);
  EXPECT_EQ(a->scheduler().in_flight(), 0);  // nothing started past the last step
  // A different bound trains on other rollouts: the mode is not a no-op.
  auto sync = make_loop(file, task, loop_cfg());
  for (int s = 0; s < 5; ++s) ASSERT_TRUE(sync->step().ok());
  bool differs = false;
  for (size_t i = 0; i < a->model().parameters().size(); ++i) {
    differs = differs || a->model().parameters()[i].value != sync->model().parameters()[i].value;
  }
  EXPECT_TRUE(differs);
}

TEST(grpo_loop, an_async_resume_trains_every_step_once) {
  const auto file = tiny_file();
  digits_task task;
  auto cfg = loop_cfg();
  cfg.max_staleness = 1;
  cfg.total_steps = 4;
  auto first = make_loop(file, task, cfg);
  for (int s = 0; s < 2; ++s) ASSERT_TRUE(first->step().ok());
  EXPECT_GT(first->scheduler().in_flight(), 0);  // step 3's rollouts were running
  train::checkpoint_state ckpt;
  first->snapshot_into(ckpt);
  EXPECT_EQ(ckpt.cursor.index, 2 * cfg.prompts_per_step);  // step 3's prompts are drawn again
  first.reset();
  auto second = make_loop(file, task, cfg);
  ASSERT_TRUE(second->restore(ckpt).ok());
  for (int s = 0; s < 2; ++s) {
    auto r = second->step();
    ASSERT_TRUE(r.ok()) << r.error().message();
    EXPECT_EQ(r->step, 3 + s);
    EXPECT_EQ(r->samples, 24);
  }
  EXPECT_EQ(second->scheduler().trained_samples(), 2 * 24);
  EXPECT_EQ(second->prompts().cursor(), 4 * cfg.prompts_per_step);
}

TEST(grpo_loop, the_kl_term_starts_at_zero_and_holds_the_policy_near_the_reference) {
  const auto file = tiny_file();
  digits_task task;
  auto final_kl = [&](double beta) {
    auto cfg = loop_cfg();
    cfg.grpo.kl_coef = beta;
    auto loop = make_loop(file, task, cfg);
    std::vector<double> kl;
    for (int s = 0; s < 10; ++s) {
      auto r = loop->step();
      EXPECT_TRUE(r.ok()) << r.error().message();
      if (!r.ok()) return kl;
      kl.push_back(r->kl);
    }
    return kl;
  };
  const auto weak = final_kl(0.01);
  const auto strong = final_kl(5.0);
  ASSERT_EQ(weak.size(), 10u);
  ASSERT_EQ(strong.size(), 10u);
  // Step 1 trains the starting weights: the policy is the reference.
  EXPECT_LT(weak.front(), 1e-6);
  // Every sample trains with a KL term (zero advantages too), so every later step measures it.
  const double w = std::accumulate(weak.begin() + 5, weak.end(), 0.0) / 5;
  const double k = std::accumulate(strong.begin() + 5, strong.end(), 0.0) / 5;
  std::printf("mean KL over steps 6-10: beta 0.01 -> %.4g, beta 5 -> %.4g\n", w, k);
  EXPECT_GT(w, 1e-3);  // the policy moved
  EXPECT_LT(k, 0.5 * w);
}

TEST(grpo_loop, several_updates_per_step_move_the_ratio_within_the_clip_range) {
  const auto file = tiny_file();
  digits_task task;
  auto cfg = loop_cfg();
  auto one = make_loop(file, task, cfg);
  cfg.updates_per_step = 3;
  auto three = make_loop(file, task, cfg);
  auto again = make_loop(file, task, cfg);
  auto r1 = one->step();
  auto r3 = three->step();
  auto r3b = again->step();
  ASSERT_TRUE(r1.ok() && r3.ok() && r3b.ok());
  // Update 1 sees ratio ~1; updates 2 and 3 see the policy the earlier ones made.
  EXPECT_GT(r3->ratio_deviation, 10 * r1->ratio_deviation);
  EXPECT_GT(r3->clip_fraction, 0.0);
  EXPECT_EQ(r3->loss, r3b->loss);  // deterministic
  for (size_t i = 0; i < three->model().parameters().size(); ++i) {
    ASSERT_EQ(three->model().parameters()[i].value, again->model().parameters()[i].value);
  }
  EXPECT_EQ(three->version(), 1);  // one weight version per step, whatever the updates
  cfg.grpo.correction = off_policy_correction::decoupled;
  auto m = trainable_model<float>::load(file);
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(grpo_loop::create(file, std::move(*m), task, cfg).error().code(),
            status_code::invalid_argument);
}

TEST(grpo_loop, a_tiny_model_learns_a_graded_reward) {
  const auto file = tiny_file();
  digits_task task;
  auto loop = make_loop(file, task, loop_cfg());
  auto before = loop->evaluate();
  ASSERT_TRUE(before.ok());
  std::vector<double> rewards;
  for (int s = 0; s < 30; ++s) {
    auto r = loop->step();
    ASSERT_TRUE(r.ok()) << r.error().message();
    rewards.push_back(r->reward_mean);
  }
  auto after = loop->evaluate();
  ASSERT_TRUE(after.ok());
  const double first = (rewards[0] + rewards[1] + rewards[2]) / 3;
  const double last = (rewards[27] + rewards[28] + rewards[29]) / 3;
  std::printf("digits reward: first 3 steps %.3f, last 3 %.3f; held-out greedy %.3f -> %.3f\n",
              first, last, before->pass_at_1, after->pass_at_1);
  EXPECT_GT(last, first + 0.3);
  EXPECT_GT(after->pass_at_1, before->pass_at_1 + 0.3);
}

}  // namespace
