// The trainer's whole model (gpu/train/): the model's gradient on tiny generated models (tied and
// separate output heads, mixture of experts) against central finite differences in f64, packing
// and recomputation invariance, and the trainer's forward against the serving engine's on the same
// weights. The ops one by one are in train_ops_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <mutex>
#include <random>
#include <span>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/gguf.hpp"
#include "gpu/kv_cache.hpp"
#include "gpu/model.hpp"
#include "gpu/sampler.hpp"
#include "gpu/tiny_model.hpp"
#include "gpu/train/moe_ops.hpp"
#include "gpu/train/optimizer.hpp"
#include "gpu/train/sft_run.hpp"
#include "gpu/train/train_ops.hpp"
#include "gpu/train/trainable_model.hpp"
#include "tests/unit/gpu/finite_difference.hpp"

namespace {

using namespace weft::gpu;
using namespace weft::gpu::train;

using weft::gpu::train::testing::numeric;

// -- the whole model
// -------------------------------------------------------------------------------

tiny_model_config tiny(output_weight out, ggml_type type = ggml_type::f32) {
  tiny_model_config c;
  c.n_layers = 2;
  c.n_embd = 32;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.n_ff = 64;
  c.n_vocab = 300;
  c.output = out;
  c.weight_type = type;
  return c;
}

gguf_file tiny_file(const tiny_model_config& c) {
  auto img = make_tiny_model(c);
  EXPECT_TRUE(img.ok());
  auto f = gguf_file::parse(*img);
  EXPECT_TRUE(f.ok()) << (f.ok() ? "" : f.error().to_string());
  return std::move(f.value());
}

template <class T>
std::unique_ptr<trainable_model<T>> load_trainable(const tiny_model_config& c,
                                                   trainable_config tc = {}) {
  auto f = tiny_file(c);
  auto m = trainable_model<T>::load(f, tc);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().to_string());
  return std::move(m.value());
}

std::vector<int32_t> tokens_of(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(3 + rng() % 290);
  return t;
}

/// Two sequences: the first with its first 3 tokens masked out of the loss (a prompt).
train_batch two_sequences() {
  train_batch b;
  const auto a = tokens_of(9, 1), c = tokens_of(6, 2);
  std::vector<uint8_t> ma(a.size(), 1), mc(c.size(), 1);
  ma[1] = ma[2] = 0;
  b.add(a, ma);
  b.add(c, mc);
  return b;
}

tiny_model_config tiny_moe(ggml_type type = ggml_type::f32) {
  auto c = tiny(output_weight::separate, type);
  c.n_expert = 4;
  c.n_expert_used = 2;
  return c;
}

void check_model_gradient(const tiny_model_config& config) {
  auto m = load_trainable<double>(config);
  const auto batch = two_sequences();
  m->zero_grad();
  auto loss = m->forward_backward(batch);
  ASSERT_TRUE(loss.ok());
  EXPECT_EQ(loss->tokens, batch.n_loss_tokens());
  EXPECT_EQ(loss->tokens, 8 - 2 + 5);
  auto f = [&] {
    auto lp = m->target_logprobs(batch);
    double s = 0;
    for (double x : *lp) s -= x;
    return s;
  };
  EXPECT_NEAR(f(), loss->sum, 1e-9);
  std::mt19937 rng(3);
  for (auto& p : m->parameters()) {
    // A handful of entries of every tensor, and the largest gradient entry.
    std::vector<size_t> idx;
    for (int i = 0; i < 4; ++i) idx.push_back(rng() % p.value.size());
    size_t big = 0;
    for (size_t i = 0; i < p.grad.size(); ++i) {
      if (std::abs(p.grad[i]) > std::abs(p.grad[big])) big = i;
    }
    idx.push_back(big);
    for (size_t i : idx) {
      const double num = numeric(f, p.value[i], 1e-5);
      EXPECT_NEAR(p.grad[i], num, 1e-6 * std::max(1.0, std::abs(num))) << p.name << "[" << i << "]";
    }
  }
}

TEST(trainable_model, gradients_match_finite_differences_tied_head) {
  check_model_gradient(tiny(output_weight::tied));
}

TEST(trainable_model, gradients_match_finite_differences_separate_head) {
  check_model_gradient(tiny(output_weight::separate));
}

// Mixture of experts (Mixtral routing): the router's gradient flows through the chosen experts'
// renormalised weights; every expert's and the router's entries match finite differences.
TEST(trainable_model, gradients_match_finite_differences_mixture_of_experts) {
  auto m = load_trainable<double>(tiny_moe());
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->parameters().size(), 3u + 10u * 2u);  // router + 3 stacked expert tensors a block
  const auto* gate = m->find("blk.0.ffn_gate_exps.weight");
  ASSERT_NE(gate, nullptr);
  EXPECT_EQ(gate->size(), 32 * 64 * 4);
  check_model_gradient(tiny_moe());
}

// The load-balancing loss (router_aux_loss_coef): transformers' definition, gradient through the
// router's probabilities, checked against finite differences of the returned loss; a dense model
// with a coefficient is refused.
TEST(trainable_model, router_balance_loss_and_its_gradient) {
  trainable_config tc;
  tc.router_aux_loss_coef = 0.5;  // large, so the term is a visible share of the router's gradient
  auto m = load_trainable<double>(tiny_moe(), tc);
  auto plain = load_trainable<double>(tiny_moe());
  ASSERT_NE(m, nullptr);
  const auto batch = two_sequences();
  m->zero_grad();
  plain->zero_grad();
  auto with = m->forward_backward(batch);
  auto without = plain->forward_backward(batch);
  ASSERT_TRUE(with.ok() && without.ok());
  // aux = n_experts · Σ F_e P_e is 1·k = 2 when balanced, larger otherwise; the loss carries
  // coef · aux per loss token.
  const double aux = (with->sum - without->sum) / (tc.router_aux_loss_coef * with->tokens);
  EXPECT_GT(aux, 1.0);
  EXPECT_LT(aux, 4.0);
  auto f = [&] { return m->forward_backward(batch)->sum; };
  const auto* router = m->find("blk.1.ffn_gate_inp.weight");
  const auto* plain_router = plain->find("blk.1.ffn_gate_inp.weight");
  ASSERT_NE(router, nullptr);
  double changed = 0;
  for (size_t i = 0; i < router->grad.size(); ++i)
    changed = std::max(changed, std::abs(router->grad[i] - plain_router->grad[i]));
  EXPECT_GT(changed, 1e-3);
  auto& params = m->parameters();
  std::vector<std::vector<double>> analytic_of;  // f() below adds into the gradients: copy first
  for (const auto& p : params) analytic_of.push_back(p.grad);
  for (size_t pi = 0; pi < params.size(); ++pi) {
    auto& p = params[pi];
    if (p.name.find("ffn_gate_inp") == std::string::npos) continue;
    const std::vector<double>& analytic = analytic_of[pi];
    for (size_t i = 0; i < p.value.size(); i += 7) {
      const double num = numeric(f, p.value[i], 1e-5);
      EXPECT_NEAR(analytic[i], num, 1e-6 * std::max(1.0, std::abs(num)))
          << p.name << "[" << i << "]";
    }
  }
  tc.router_aux_loss_coef = 0.01;
  auto dense = trainable_model<double>::load(tiny_file(tiny(output_weight::tied)), tc);
  ASSERT_FALSE(dense.ok());
  EXPECT_NE(dense.error().message().find("mixture-of-experts"), std::string::npos);
}

// RL (weft rl --router-aux-loss-coef): under a policy objective the balance loss is weighted like
// the policy loss — coef · aux · Σ of the micro-batch's token weights — with the same aux as
// cross-entropy's; its router gradient matches finite differences; the CPU device gives the host's
// bits.
template <class T>
token_objective<T> weighted_logp_objective() {
  return [](const train_batch& b, std::span<const int64_t> pos, std::span<const T> logp,
            std::span<T> d) {
    double sum = 0.0;
    for (size_t j = 0; j < logp.size(); ++j) {
      const T w = static_cast<T>(b.policy[static_cast<size_t>(pos[j])].weight);
      sum -= static_cast<double>(w * logp[j]);
      d[j] = -w;
    }
    return sum;
  };
}

TEST(trainable_model, router_balance_loss_under_a_policy_objective_is_weighted_like_it) {
  trainable_config tc;
  tc.router_aux_loss_coef = 0.5;
  auto m = load_trainable<double>(tiny_moe(), tc);
  auto plain = load_trainable<double>(tiny_moe());
  ASSERT_NE(m, nullptr);
  auto batch = two_sequences();
  batch.policy.assign(batch.tokens.size(), policy_token{});
  double weight_sum = 0.0;
  for (size_t i = 0; i < batch.tokens.size(); ++i) {
    if (batch.targets[i] < 0) continue;
    batch.policy[i].weight = 0.05f + 0.03f * static_cast<float>(i % 3);
    weight_sum += batch.policy[i].weight;
  }
  const auto obj = weighted_logp_objective<double>();
  auto with = m->forward_backward(batch, obj);
  auto without = plain->forward_backward(batch, obj);
  auto with_ce = m->forward_backward(batch);
  auto without_ce = plain->forward_backward(batch);
  ASSERT_TRUE(with.ok() && without.ok() && with_ce.ok() && without_ce.ok());
  const double aux = (with->sum - without->sum) / (tc.router_aux_loss_coef * weight_sum);
  const double aux_ce =
      (with_ce->sum - without_ce->sum) / (tc.router_aux_loss_coef * with_ce->tokens);
  EXPECT_GT(aux, 1.0);
  EXPECT_NEAR(aux, aux_ce, 1e-9);
  m->zero_grad();
  ASSERT_TRUE(m->forward_backward(batch, obj).ok());
  std::vector<std::vector<double>> analytic_of;
  for (const auto& p : m->parameters()) analytic_of.push_back(p.grad);
  auto f = [&] { return m->forward_backward(batch, obj)->sum; };
  auto& params = m->parameters();
  for (size_t pi = 0; pi < params.size(); ++pi) {
    auto& p = params[pi];
    if (p.name.find("ffn_gate_inp") == std::string::npos) continue;
    for (size_t i = 0; i < p.value.size(); i += 5) {
      const double num = numeric(f, p.value[i], 1e-5);
      EXPECT_NEAR(analytic_of[pi][i], num, 1e-6 * std::max(1.0, std::abs(num)))
          << p.name << "[" << i << "]";
    }
  }
  auto dev = device_registry::instance().create("cpu", device_config{1, 0});  // outlives on_dev
  ASSERT_TRUE(dev.ok());
  auto host = load_trainable<float>(tiny_moe(), tc);
  auto on_dev = load_trainable<float>(tiny_moe(), tc);
  ASSERT_TRUE(on_dev->use_device(dev->get()).ok());
  const auto objf = weighted_logp_objective<float>();
  auto lh = host->forward_backward(batch, objf);
  auto ld = on_dev->forward_backward(batch, objf);
  ASSERT_TRUE(lh.ok() && ld.ok());
  EXPECT_EQ(lh->sum, ld->sum);
  for (size_t i = 0; i < host->parameters().size(); ++i)
    EXPECT_EQ(host->parameters()[i].grad, on_dev->parameters()[i].grad) << i;
}

// Routing replay: the experts given per position are used (weights from the trainer's router over
// them), so the loss is a smooth function of every weight — finite differences hold for every
// tensor — and the replayed routes that differ from the router's own are counted.
TEST(trainable_model, replayed_routes_are_used_and_their_gradient_is_exact) {
  auto m = load_trainable<double>(tiny_moe());
  ASSERT_NE(m, nullptr);
  auto batch = two_sequences();
  const int64_t layers = 2, k = 2, width = layers * k;
  std::vector<uint8_t> routes;
  for (int64_t pos = 0; pos < batch.n_tokens() - 2; ++pos) {  // the last two route themselves
    for (int64_t l = 0; l < layers; ++l) {
      routes.push_back(static_cast<uint8_t>((pos + l) % 4));
      routes.push_back(static_cast<uint8_t>((pos + l + 1 + pos % 2) % 4));
    }
  }
  batch.set_routes(0, routes, width);
  ASSERT_EQ(batch.routes.size(), routes.size());
  m->zero_grad();
  auto replayed = m->forward_backward(batch);
  ASSERT_TRUE(replayed.ok()) << replayed.error().to_string();
  const auto [forced, differ] = m->take_routing_stats();
  EXPECT_EQ(forced, (batch.n_tokens() - 2) * layers);
  EXPECT_GT(differ, 0);
  EXPECT_LT(differ, forced);
  auto plain = two_sequences();
  auto own = m->forward_backward(plain);
  ASSERT_TRUE(own.ok());
  EXPECT_NE(own->sum, replayed->sum);  // other experts, another loss
  m->zero_grad();
  ASSERT_TRUE(m->forward_backward(batch).ok());
  std::vector<std::vector<double>> analytic;
  for (const auto& p : m->parameters()) analytic.push_back(p.grad);
  auto f = [&] { return m->forward_backward(batch)->sum; };
  std::mt19937 rng(9);
  auto& params = m->parameters();
  for (size_t pi = 0; pi < params.size(); ++pi) {
    auto& p = params[pi];
    for (int i = 0; i < 3; ++i) {
      const size_t at = rng() % p.value.size();
      const double num = numeric(f, p.value[at], 1e-5);
      EXPECT_NEAR(analytic[pi][at], num, 1e-6 * std::max(1.0, std::abs(num)))
          << p.name << "[" << at << "]";
    }
  }
  // Invalid lists are refused: a repeated expert, an expert out of range.
  auto bad = two_sequences();
  std::vector<uint8_t> twice(static_cast<size_t>(width), 1);
  bad.set_routes(0, twice, width);
  EXPECT_FALSE(m->forward_backward(bad).ok());
  std::vector<uint8_t> range(static_cast<size_t>(width), 0);
  range[1] = 7;
  bad.set_routes(0, range, width);
  EXPECT_FALSE(m->forward_backward(bad).ok());
  // The CPU device takes the same routes: the host path's bits.
  auto dev = device_registry::instance().create("cpu", device_config{1, 0});  // outlives on_dev
  ASSERT_TRUE(dev.ok());
  auto host = load_trainable<float>(tiny_moe());
  auto on_dev = load_trainable<float>(tiny_moe());
  ASSERT_TRUE(on_dev->use_device(dev->get()).ok());
  auto lh = host->forward_backward(batch);
  auto ld = on_dev->forward_backward(batch);
  ASSERT_TRUE(lh.ok() && ld.ok());
  EXPECT_EQ(lh->sum, ld->sum);
  for (size_t i = 0; i < host->parameters().size(); ++i)
    EXPECT_EQ(host->parameters()[i].grad, on_dev->parameters()[i].grad) << i;
  EXPECT_EQ(on_dev->take_routing_stats().first, (batch.n_tokens() - 2) * layers);
}

// The check every replayed route goes through (the trainer's batch check, and the RL controller on
// an agent's outputs): per position, layers groups of k distinct ids in [0, experts); a position
// whose first id is negative is left to the router.
TEST(moe_ops, first_invalid_route_names_the_first_bad_position) {
  const route_shape s{2, 4, 2};
  ASSERT_EQ(s.width(), 4);
  std::vector<int16_t> r = {0, 1, 2, 3, /**/ 3, 2, 1, 0, /**/ -1, -1, -1, -1, /**/ 1, 0, 3, 3};
  EXPECT_EQ(first_invalid_route(r.data(), 3, s), -1);
  EXPECT_EQ(first_invalid_route(r.data(), 4, s), 3);  // 3 twice in the second layer
  r[12] = 4;
  r[14] = 2;
  EXPECT_EQ(first_invalid_route(r.data(), 4, s), 3);  // 4 is not an expert
  r[12] = 1;
  EXPECT_EQ(first_invalid_route(r.data(), 4, s), -1);
  r[5] = -2;  // negative inside a given list
  EXPECT_EQ(first_invalid_route(r.data(), 4, s), 1);
}

// RL at a sampling temperature T (weft rl --temperature): per-token objectives and
// target_logprobs see log-softmax(logits / T), the distribution the engine's sampler drew from and
// reported (sampling_params::tempered_logprobs); the gradient of the objective matches finite
// differences; cross-entropy (SFT) is unchanged.
TEST(trainable_model, tempered_objective_is_the_samplers_policy_and_its_gradient_is_exact) {
  auto m = load_trainable<double>(tiny(output_weight::separate));
  const auto batch = two_sequences();
  const double t = 0.7;
  auto plain_ce = m->forward_backward(batch);
  ASSERT_TRUE(plain_ce.ok());
  m->set_logit_temperature(t);
  // target_logprobs = log-softmax(logits / T) of each target, as the sampler reports it.
  auto logits = m->logits(batch);
  auto lp = m->target_logprobs(batch);
  ASSERT_TRUE(logits.ok() && lp.ok());
  const int64_t vocab = static_cast<int64_t>(logits->size()) / batch.n_tokens();
  size_t k = 0;
  for (int64_t i = 0; i < batch.n_tokens(); ++i) {
    const int32_t y = batch.targets[static_cast<size_t>(i)];
    if (y < 0) continue;
    std::vector<float> row(logits->begin() + i * vocab, logits->begin() + (i + 1) * vocab);
    double mx = -1e300, z = 0.0;
    for (float v : row) mx = std::max(mx, static_cast<double>(v) / t);
    for (float v : row) z += std::exp(static_cast<double>(v) / t - mx);
    const double want = static_cast<double>(row[static_cast<size_t>(y)]) / t - mx - std::log(z);
    EXPECT_NEAR((*lp)[k], want, 1e-5) << "position " << i;
    // The sampler at temperature T reports the same for a token it draws (top-k only filters).
    sampling_params sp;
    sp.temperature = static_cast<float>(t);
    sp.top_k = 3;
    sp.tempered_logprobs = true;
    sp.seed = static_cast<uint64_t>(i);
    sampler smp(sp);
    const auto r = smp.sample(row, {});
    double zt = 0.0;
    for (float v : row) zt += std::exp(static_cast<double>(v) / t - mx);
    EXPECT_NEAR(r.logprob,
                static_cast<double>(row[static_cast<size_t>(r.token)]) / t - mx - std::log(zt),
                1e-5);
    ++k;
  }
  EXPECT_EQ(k, lp->size());
  // Cross-entropy ignores the temperature.
  m->zero_grad();
  auto ce = m->forward_backward(batch);
  ASSERT_TRUE(ce.ok());
  EXPECT_EQ(ce->sum, plain_ce->sum);
  // A weighted per-token objective: its gradient at T against central differences.
  const token_objective<double> obj = [](const train_batch&, std::span<const int64_t> pos,
                                         std::span<const double> logp, std::span<double> d) {
    double sum = 0.0;
    for (size_t j = 0; j < logp.size(); ++j) {
      const double c = 1.0 + 0.5 * static_cast<double>(pos[j] % 3);
      sum -= c * logp[j];
      d[j] = -c;
    }
    return sum;
  };
  m->zero_grad();
  auto loss = m->forward_backward(batch, obj);
  ASSERT_TRUE(loss.ok());
  auto f = [&] {
    auto l = m->target_logprobs(batch);
    double s = 0.0;
    size_t j = 0;
    for (int64_t i = 0; i < batch.n_tokens(); ++i) {
      if (batch.targets[static_cast<size_t>(i)] < 0) continue;
      s -= (1.0 + 0.5 * static_cast<double>(i % 3)) * (*l)[j++];
    }
    return s;
  };
  EXPECT_NEAR(f(), loss->sum, 1e-9);
  std::mt19937 rng(5);
  for (auto& p : m->parameters()) {
    std::vector<size_t> idx;
    for (int i = 0; i < 3; ++i) idx.push_back(rng() % p.value.size());
    for (size_t i : idx) {
      const double num = numeric(f, p.value[i], 1e-5);
      EXPECT_NEAR(p.grad[i], num, 1e-6 * std::max(1.0, std::abs(num))) << p.name << "[" << i << "]";
    }
  }
}

TEST(trainable_model, packing_sums_sequences_and_masks_prompts) {
  auto m = load_trainable<double>(tiny(output_weight::separate));
  const auto packed = two_sequences();
  m->zero_grad();
  auto both = m->forward_backward(packed);
  ASSERT_TRUE(both.ok());
  std::vector<std::vector<double>> g_both;
  for (auto& p : m->parameters()) g_both.push_back(p.grad);
  // The same two sequences one at a time.
  m->zero_grad();
  double sum = 0;
  for (int s = 0; s < 2; ++s) {
    train_batch one;
    const auto b = static_cast<size_t>(packed.seqs.starts[s]);
    const auto e = static_cast<size_t>(packed.seqs.starts[s + 1]);
    one.tokens.assign(packed.tokens.begin() + b, packed.tokens.begin() + e);
    one.targets.assign(packed.targets.begin() + b, packed.targets.begin() + e);
    one.seqs.starts = {0, static_cast<int64_t>(e - b)};
    auto l = m->forward_backward(one);
    ASSERT_TRUE(l.ok());
    sum += l->sum;
  }
  EXPECT_NEAR(both->sum, sum, 1e-10);
  for (size_t i = 0; i < g_both.size(); ++i) {
    const auto& g = m->parameters()[i].grad;
    for (size_t j = 0; j < g.size(); ++j) ASSERT_NEAR(g[j], g_both[i][j], 1e-10) << i;
  }
  // Masked positions: the first sequence's targets at 0 and 1 are prompt tokens.
  EXPECT_EQ(packed.targets[0], -1);
  EXPECT_EQ(packed.targets[1], -1);
  EXPECT_EQ(packed.targets[2], packed.tokens[3]);
  EXPECT_EQ(packed.targets[8], -1);  // last token of the sequence
}

// zero_grad only marks the gradients zero; the backward's first GEMM into each overwrites it, the
// rest are cleared before use. Whatever the buffers held (NaN here), the gradients are those of
// a model that never had any, in one share and in two, and read back as zero when nothing ran.
void check_marked_zero(const tiny_model_config& config) {
  const auto batch = two_sequences();
  std::vector<std::vector<train_batch>> shares(2);
  shares[0].push_back(batch);
  shares[1].push_back(batch);
  for (const size_t n_shares : {size_t{1}, size_t{2}}) {
    const std::span<const std::vector<train_batch>> run(shares.data(), n_shares);
    auto clean = load_trainable<float>(config);
    clean->zero_grad();
    ASSERT_TRUE(clean->forward_backward(run).ok());
    auto dirty = load_trainable<float>(config);
    ASSERT_TRUE(dirty->forward_backward(run).ok());  // the replicas' buffers too
    for (auto& p : dirty->parameters()) std::fill(p.grad.begin(), p.grad.end(), NAN);
    dirty->zero_grad(2);
    ASSERT_TRUE(dirty->forward_backward(run).ok());
    for (size_t i = 0; i < clean->parameters().size(); ++i) {
      EXPECT_EQ(clean->parameters()[i].grad, dirty->parameters()[i].grad)
          << clean->parameters()[i].name << ", " << n_shares << " shares";
    }
    for (auto& p : dirty->parameters()) std::fill(p.grad.begin(), p.grad.end(), NAN);
    dirty->zero_grad();
    for (const auto& g : dirty->gradients()) {
      ASSERT_TRUE(std::all_of(g.begin(), g.end(), [](float v) { return v == 0.0f; }));
    }
  }
}

TEST(trainable_model, zero_grad_marks_and_the_first_write_overwrites) {
  check_marked_zero(tiny(output_weight::tied));
  check_marked_zero(tiny(output_weight::separate));
  check_marked_zero(tiny_moe());
}

// forward_backward with a gradient_ready listener (the overlapped all-reduce's hook): the groups
// cover every parameter once; each is told once, and what its buffers hold when told is what they
// hold at the end (final: the backward no longer touches them, the shares' sums are added); the
// gradients are the bits of the call without a listener. One to three shares (one with two
// batches, one with none), buffers that held NaN before zero_grad.
void check_gradient_ready(const tiny_model_config& config) {
  std::vector<std::vector<train_batch>> shares(3);
  shares[0] = {two_sequences(), two_sequences()};
  shares[1] = {two_sequences()};  // shares[2] stays empty
  for (const size_t n_shares : {size_t{1}, size_t{2}, size_t{3}}) {
    const std::span<const std::vector<train_batch>> run(shares.data(), n_shares);
    auto plain = load_trainable<float>(config);
    plain->zero_grad();
    ASSERT_TRUE(plain->forward_backward(run).ok());
    auto told = load_trainable<float>(config);
    const auto groups = told->gradient_groups();
    std::vector<int> seen(told->parameters().size(), 0);
    for (const auto& g : groups)
      for (const int i : g) ++seen[static_cast<size_t>(i)];
    EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
    ASSERT_TRUE(told->forward_backward(run).ok());  // the replicas' buffers too
    for (auto& p : told->parameters()) std::fill(p.grad.begin(), p.grad.end(), NAN);
    told->zero_grad(2);
    const auto buffers = told->gradient_buffers();
    std::mutex mu;
    std::vector<int> times(groups.size(), 0);
    std::vector<std::vector<float>> when_told(buffers.size());
    auto l = told->forward_backward(run, [&](size_t g) {
      std::lock_guard<std::mutex> lock(mu);
      ++times[g];
      for (const int i : groups[g]) {
        const auto b = buffers[static_cast<size_t>(i)];
        when_told[static_cast<size_t>(i)].assign(b.begin(), b.end());
      }
    });
    ASSERT_TRUE(l.ok());
    EXPECT_TRUE(std::all_of(times.begin(), times.end(), [](int n) { return n == 1; }))
        << n_shares << " shares";
    for (size_t i = 0; i < buffers.size(); ++i) {
      const auto& name = plain->parameters()[i].name;
      EXPECT_EQ(plain->parameters()[i].grad, told->parameters()[i].grad)
          << name << ", " << n_shares << " shares";
      EXPECT_EQ(when_told[i], told->parameters()[i].grad)
          << name << " changed after it was told, " << n_shares << " shares";
    }
  }
}

TEST(trainable_model, gradient_ready_tells_each_group_once_its_gradients_are_final) {
  check_gradient_ready(tiny(output_weight::tied));
  check_gradient_ready(tiny(output_weight::separate));
  check_gradient_ready(tiny_moe());
}

void check_recomputation(const tiny_model_config& config) {
  auto plain = load_trainable<float>(config);
  trainable_config tc;
  tc.recompute = true;
  tc.head_chunk_rows = 3;  // several head chunks too
  auto rec = load_trainable<float>(config, tc);
  const auto batch = two_sequences();
  auto a = plain->forward_backward(batch);
  auto b = rec->forward_backward(batch);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NEAR(a->sum, b->sum, 1e-4);
  for (size_t i = 0; i < plain->parameters().size(); ++i) {
    const auto& ga = plain->parameters()[i].grad;
    const auto& gb = rec->parameters()[i].grad;
    double mx = 0, diff = 0;
    for (size_t j = 0; j < ga.size(); ++j) {
      mx = std::max(mx, static_cast<double>(std::abs(ga[j])));
      diff = std::max(diff, static_cast<double>(std::abs(ga[j] - gb[j])));
    }
    EXPECT_LE(diff, 1e-5 * std::max(mx, 1e-3)) << plain->parameters()[i].name;
  }
}

TEST(trainable_model, recomputation_gives_bit_identical_gradients) {
  check_recomputation(tiny(output_weight::tied));
  check_recomputation(tiny_moe());
}

TEST(trainable_model, loads_quantized_weights_and_refuses_bad_batches) {
  auto q = load_trainable<float>(tiny(output_weight::tied, ggml_type::q4_1));
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->parameters().size(), 2u + 9u * 2u);
  auto moe = load_trainable<float>(tiny_moe(ggml_type::q8_0));  // quantized experts dequantize
  ASSERT_NE(moe, nullptr);
  EXPECT_TRUE(moe->forward_backward(two_sequences()).ok());
  train_batch bad;
  EXPECT_FALSE(q->forward_backward(bad).ok());
  bad.add(std::vector<int32_t>{5, 6, 9999}, std::vector<uint8_t>{1, 1, 1});
  auto r = q->forward_backward(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("out of range"), std::string::npos);
}

void check_against_engine(const tiny_model_config& cfg) {
  auto tm = load_trainable<float>(cfg);
  auto dev = device_registry::instance().create("cpu", device_config{1, 0});
  ASSERT_TRUE(dev.ok());
  auto em = model::load(tiny_file(cfg), **dev);
  ASSERT_TRUE(em.ok());
  kv_cache_config kc;
  kc.layout = (*em)->kv_layout_for(4);
  kc.n_blocks = 16;
  auto kv = kv_cache::create(**dev, kc);
  ASSERT_TRUE(kv.ok());
  const auto toks = tokens_of(12, 5);
  train_batch b;
  b.add(toks, std::vector<uint8_t>(toks.size(), 1));
  auto tl = tm->logits(b);
  ASSERT_TRUE(tl.ok());
  const int64_t vocab = tm->hparams().n_vocab;
  const seq_id s = (*kv)->create_sequence();
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < toks.size(); ++i) {
    forward_batch fb;
    fb.add(s, std::span<const int32_t>(&toks[i], 1), true);
    forward_output out;
    ASSERT_TRUE((*em)->forward(fb, **kv, out).ok());
    for (int64_t j = 0; j < vocab; ++j) {
      const double e = out.logits[static_cast<size_t>(j)];
      max_abs = std::max(max_abs, std::abs(e));
      max_diff = std::max(max_diff, std::abs(e - (*tl)[i * vocab + j]));
    }
  }
  EXPECT_GT(max_abs, 0.01);
  EXPECT_LE(max_diff, 2e-3 * std::max(1.0, max_abs)) << "max |logit| " << max_abs;
}

// Same f32 weights: the trainer's logits against the engine's (whose KV cache is fp16, so
// agreement is to that precision, not bit for bit); dense and MoE (same routing).
TEST(trainable_model, forward_agrees_with_the_serving_engine) {
  check_against_engine(tiny(output_weight::tied));
  check_against_engine(tiny_moe());
}

TEST(sft_run, a_group_rank_without_a_device_index_takes_its_own_gpu) {
  // As torchrun's LOCAL_RANK: local rank mod the host's GPUs; anything explicit stays.
  EXPECT_EQ(device_for_local_rank("cuda", 0, 4), "cuda:0");
  EXPECT_EQ(device_for_local_rank("cuda", 3, 4), "cuda:3");
  EXPECT_EQ(device_for_local_rank("cuda", 5, 4), "cuda:1");
  EXPECT_EQ(device_for_local_rank("cuda", 2, 1), "cuda:0");
  EXPECT_EQ(device_for_local_rank("cuda:2", 1, 4), "cuda:2");
  EXPECT_EQ(device_for_local_rank("cpu", 1, 1), "cpu");
  EXPECT_EQ(device_for_local_rank("cuda", 1, 0), "cuda") << "no GPU: opening it says why";
}

}  // namespace
