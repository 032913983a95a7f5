// RL post-training's plain parts (gpu/rl/, docs/rl.md): GRPO advantages, PPO-clip and the loss
// aggregations against hand-computed values; the policy objective's gradient against weighted
// cross-entropy; in-place weight updates of the serving model and version namespaces of the prefix
// cache; tasks, verifiers and the held-out split; the reward process. (The GRPO loop:
// rl_loop_test.cpp; the rollout scheduler and dispatch classes: rl_schedule_test.cpp.)
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

#include "gpu/cpu/amx_matmul.hpp"
#include "gpu/cpu/matmul.hpp"
#include "gpu/device.hpp"
#include "gpu/gguf.hpp"
#include "gpu/kv_cache.hpp"
#include "gpu/model.hpp"
#include "gpu/rl/grpo.hpp"
#include "gpu/rl/grpo_loop.hpp"
#include "gpu/rl/reward_process.hpp"
#include "gpu/rl/rollout_backend.hpp"
#include "gpu/rl/tasks.hpp"
#include "gpu/tiny_model.hpp"
#include "gpu/train/export.hpp"
#include "gpu/train/trainable_model.hpp"
#include "tests/unit/gpu/rl_test_support.hpp"

namespace {

using namespace weft::gpu;
using namespace weft::gpu::rl;
using weft::gpu::train::policy_token;
using weft::gpu::train::train_batch;
using weft::gpu::train::trainable_model;
namespace fs = std::filesystem;
using weft::gpu::rl_test::tiny_cfg;
using weft::gpu::rl_test::tiny_file;

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

/// The logits of a fixed 4-token prompt under `m`.
std::vector<float> logits_of(device& dev, model& m) {
  kv_cache_config kc;
  kc.layout = m.kv_layout_for(16);
  kc.n_blocks = 8;
  auto kv = kv_cache::create(dev, kc).value();
  const seq_id s = kv->create_sequence();
  forward_batch b;
  const std::vector<int32_t> toks = {5, 17, 90, 200};
  b.add(s, toks, true);
  forward_output out;
  EXPECT_TRUE(m.forward(b, *kv, out).ok());
  return out.logits;
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
  EXPECT_EQ(logits_of(**dev, **mine), logits_of(**dev, **other));
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

void check_q8_0_rollout_serves_the_new_weights() {
  auto dev = device_registry::instance().create("cpu", device_config{1, 0});
  ASSERT_TRUE(dev.ok());
  const auto file = tiny_file(42);
  auto weights = trainable_model<float>::load(file);
  ASSERT_TRUE(weights.ok());
  rollout_engine_params p;
  p.weight_type = ggml_type::q8_0;
  ASSERT_TRUE(is_rollout_weight_type(ggml_type::q8_0));
  EXPECT_FALSE(is_rollout_weight_type(ggml_type::q4_1));
  auto rollout = load_rollout_model(file, **weights, p, **dev);
  ASSERT_TRUE(rollout.ok()) << rollout.error().message();
  // Matrices are stored as q8_0, norms stay f32 (as the GGUF export writes them).
  int quantized = 0;
  for (const gguf_tensor& t : (*rollout)->file().tensors()) quantized += t.type == ggml_type::q8_0;
  EXPECT_GT(quantized, 0);
  // A weight version: every tensor moved; the engine's model must equal a q8_0 export of it.
  for (auto& prm : (*weights)->parameters()) {
    for (size_t i = 0; i < prm.value.size(); ++i) prm.value[i] += 0.01f * std::sin(float(i));
  }
  for (const auto& prm : std::as_const(**weights).parameters()) {
    ASSERT_TRUE((*rollout)->set_weight(prm.name, prm.value).ok()) << prm.name;
  }
  auto image = train::export_gguf_bytes(file, **weights, ggml_type::q8_0);
  ASSERT_TRUE(image.ok());
  auto fresh = model::load(gguf_file::parse(*image).value(), **dev);
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(logits_of(**dev, **rollout), logits_of(**dev, **fresh));
}

TEST(rollout_weights, quantized_q8_0_rollouts_serve_the_quantized_new_weights) {
  check_q8_0_rollout_serves_the_new_weights();
}

// The amx and vnni kernels multiply from a packed copy of each weight (amx_matmul.hpp): set_weight
// must rewrite it too, or the engine would keep serving the old version.
TEST(rollout_weights, amx_matmuls_repack_what_set_weight_changes) {
  if (!cpu::amx_available()) GTEST_SKIP() << "no AMX here: " << cpu::amx_unavailable_reason();
  ASSERT_TRUE(cpu::set_quant_matmul_kernel(cpu::quant_matmul_kernel::amx).ok());
  check_q8_0_rollout_serves_the_new_weights();
  (void)cpu::set_quant_matmul_kernel(cpu::quant_matmul_kernel::ggml);
}

TEST(rollout_weights, vnni_matmuls_repack_what_set_weight_changes) {
  if (!cpu::amx_vnni_available())
    GTEST_SKIP() << "no AVX-512 VNNI here: " << cpu::amx_vnni_unavailable_reason();
  ASSERT_TRUE(cpu::set_quant_matmul_kernel(cpu::quant_matmul_kernel::vnni).ok());
  check_q8_0_rollout_serves_the_new_weights();
  (void)cpu::set_quant_matmul_kernel(cpu::quant_matmul_kernel::ggml);
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
  rl_prompt neg{"3-8", "", "-5", {}, {}};
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
  rl_prompt p{"", "", "46", {3, 7, 25}, {}};
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

}  // namespace
