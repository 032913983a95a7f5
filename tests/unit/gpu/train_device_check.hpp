#pragma once
// The trainable model on a device (trainable_model::use_device) against the same model on the
// host: a few SGD steps over batches with a masked prompt, a shared prefix and a per-token
// objective; each step's loss and every gradient compared. Used by the CPU-device test (CI) and
// the CUDA one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/gguf.hpp"
#include "gpu/tiny_model.hpp"
#include "gpu/train/export.hpp"
#include "gpu/train/sft_trainer.hpp"
#include "gpu/train/trainable_model.hpp"

namespace weft::gpu::testing {

struct device_training_diff {
  double loss_rel = 0;  ///< Largest |host − device| loss relative to the host's.
  double grad_rel = 0;  ///< Largest per-tensor max |host − device| relative to its max |host|.
  bool bitwise = true;  ///< Every loss and gradient bit-identical.
};

/// The small model both checks train: 2 layers, GQA (4 heads over 2), a 300-token vocabulary;
/// `experts` > 0: a mixture-of-experts FFN with 2 of them used per token.
inline tiny_model_config training_model_config(bool tied, int experts = 0) {
  tiny_model_config c;
  c.n_layers = 2;
  c.n_embd = 64;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.n_ff = 128;
  c.n_vocab = 300;
  c.output = tied ? output_weight::tied : output_weight::separate;
  c.n_expert = static_cast<uint32_t>(experts);
  c.n_expert_used = experts > 0 ? 2 : 0;
  return c;
}

inline device_training_diff compare_device_training(device& dev, bool recompute, bool tied = false,
                                                    int steps = 3, int experts = 0,
                                                    double router_aux_loss_coef = 0.0) {
  using namespace weft::gpu::train;
  auto img = make_tiny_model(training_model_config(tied, experts));
  EXPECT_TRUE(img.ok());
  trainable_config tc;
  tc.recompute = recompute;
  tc.head_chunk_rows = 5;  // several output-head chunks
  tc.router_aux_loss_coef = router_aux_loss_coef;
  auto load = [&] {
    auto f = gguf_file::parse(*img);
    EXPECT_TRUE(f.ok());
    auto m = trainable_model<float>::load(*f, tc);
    EXPECT_TRUE(m.ok());
    return std::move(m.value());
  };
  auto host = load();
  auto on_dev = load();
  EXPECT_TRUE(on_dev->use_device(&dev).ok());
  EXPECT_EQ(on_dev->compute_device(), &dev);
  std::mt19937 rng(5);
  auto toks = [&](int n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = static_cast<int32_t>(3 + rng() % 290);
    return t;
  };
  // Batch 1: two sequences, the first with a 3-token prompt out of the loss.
  train_batch plain;
  {
    const auto a = toks(11), b = toks(7);
    std::vector<uint8_t> ma(a.size(), 1), mb(b.size(), 1);
    ma[1] = ma[2] = 0;
    plain.add(a, ma);
    plain.add(b, mb);
  }
  // Batch 2: a shared 6-token prompt and two samples continuing it, with policy inputs.
  train_batch grouped;
  {
    const int64_t p = grouped.add_prefix(toks(6));
    for (int s = 0; s < 2; ++s) {
      const auto t = toks(5 + 3 * s);
      std::vector<uint8_t> m(t.size(), 1);
      std::vector<policy_token> info(t.size());
      for (auto& x : info) {
        x.advantage = s == 0 ? 1.0f : -0.5f;
        x.weight = 0.1f;
      }
      grouped.add(t, m, info, p);
    }
  }
  // A policy-gradient-like objective: ℓ = −advantage·weight·logp.
  const token_objective<float> objective = [](const train_batch& b, std::span<const int64_t> pos,
                                              std::span<const float> logp, std::span<float> dlogp) {
    double sum = 0;
    for (size_t i = 0; i < pos.size(); ++i) {
      const auto& pt = b.policy[static_cast<size_t>(pos[i])];
      const float k = -pt.advantage * pt.weight;
      sum += double(k) * logp[i];
      dlogp[i] = k;
    }
    return sum;
  };
  device_training_diff diff;
  auto compare_grads = [&] {
    auto& ph = host->parameters();
    auto& pd = on_dev->parameters();
    for (size_t i = 0; i < ph.size(); ++i) {
      double mx = 0, d = 0;
      for (size_t j = 0; j < ph[i].grad.size(); ++j) {
        mx = std::max(mx, double(std::fabs(ph[i].grad[j])));
        d = std::max(d, double(std::fabs(ph[i].grad[j] - pd[i].grad[j])));
      }
      diff.grad_rel = std::max(diff.grad_rel, d / std::max(mx, 1e-12));
      diff.bitwise = diff.bitwise && ph[i].grad == pd[i].grad;
    }
  };
  auto compare_loss = [&](const loss_sum& a, const loss_sum& b) {
    EXPECT_EQ(a.tokens, b.tokens);
    diff.loss_rel =
        std::max(diff.loss_rel, std::fabs(a.sum - b.sum) / std::max(std::fabs(a.sum), 1e-12));
    diff.bitwise = diff.bitwise && a.sum == b.sum;
  };
  for (int step = 0; step < steps; ++step) {
    // Each call from zeroed gradients (accumulating into non-zero ones rounds differently on the
    // host, where BLAS adds into the existing gradient block by block).
    host->zero_grad();
    on_dev->zero_grad();
    auto oh = host->forward_backward(grouped, objective);
    auto od = on_dev->forward_backward(grouped, objective);
    EXPECT_TRUE(oh.ok() && od.ok()) << (od.ok() ? "" : od.error().to_string());
    if (!oh.ok() || !od.ok()) return diff;
    compare_loss(*oh, *od);
    compare_grads();
    host->zero_grad();
    on_dev->zero_grad();
    auto lh = host->forward_backward(plain);
    auto ld = on_dev->forward_backward(plain);
    EXPECT_TRUE(lh.ok() && ld.ok()) << (ld.ok() ? "" : ld.error().to_string());
    if (!lh.ok() || !ld.ok()) return diff;
    compare_loss(*lh, *ld);
    compare_grads();
    auto& ph = host->parameters();
    auto& pd = on_dev->parameters();
    // An SGD step on both (parameters() marks them changed: the device uploads them again).
    for (size_t i = 0; i < ph.size(); ++i) {
      for (size_t j = 0; j < ph[i].value.size(); ++j) {
        ph[i].value[j] -= 0.05f * ph[i].grad[j];
        pd[i].value[j] = ph[i].value[j];
      }
    }
  }
  // Logits after the updates.
  auto gh = host->logits(plain);
  auto gd = on_dev->logits(plain);
  EXPECT_TRUE(gh.ok() && gd.ok());
  if (gh.ok() && gd.ok()) {
    double mx = 0, d = 0;
    for (size_t j = 0; j < gh->size(); ++j) {
      mx = std::max(mx, double(std::fabs((*gh)[j])));
      d = std::max(d, double(std::fabs((*gh)[j] - (*gd)[j])));
    }
    diff.grad_rel = std::max(diff.grad_rel, d / std::max(mx, 1e-12));
    diff.bitwise = diff.bitwise && *gh == *gd;
  }
  std::printf("[train] %s%s%s: loss relative %.3g, gradients/logits relative %.3g, %s\n",
              dev.capabilities().name.c_str(), recompute ? " (recompute)" : "",
              tied ? " (tied head)" : "", diff.loss_rel, diff.grad_rel,
              diff.bitwise ? "bit-identical" : "not bit-identical");
  return diff;
}

struct resident_training_diff {
  double loss_rel = 0;       ///< Largest step-loss difference relative to the host's.
  double norm_rel = 0;       ///< Largest gradient-norm difference relative to the host's.
  double weight_rel = 0;     ///< Largest per-tensor weight difference relative to its max |host|.
  double moment_rel = 0;     ///< The same over AdamW's first and second moments.
  bool bitwise = true;       ///< Losses, norms, weights and moments bit-identical.
  bool resume_exact = true;  ///< A device run resumed from its checkpoint matched its straight run.
};

/// `examples` random examples of 6-19 tokens of the tiny vocabulary, the first `prompt` tokens of
/// each out of the loss.
inline train::sft_dataset random_sft_data(uint32_t seed, int examples, int prompt) {
  std::mt19937 rng(seed);
  train::sft_dataset data;
  for (int e = 0; e < examples; ++e) {
    train::sft_example ex;
    const int n = 6 + static_cast<int>(rng() % 14);
    for (int i = 0; i < n; ++i) {
      ex.tokens.push_back(static_cast<int32_t>(3 + rng() % 290));
      ex.in_loss.push_back(i >= prompt ? 1 : 0);
    }
    data.tokens += n;
    data.loss_tokens += n - prompt;
    data.examples.push_back(std::move(ex));
  }
  return data;
}

/// The loop's settings for the tiny model: updates of `step_tokens` in micro-batches of 20 (two or
/// three per update), lr 2e-3 over `steps` updates.
inline train::sft_config small_sft_config(uint64_t seed, int64_t step_tokens, int64_t steps) {
  train::sft_config sc;
  sc.seed = seed;
  sc.step_tokens = step_tokens;
  sc.micro_batch_tokens = 20;
  sc.schedule.peak = 2e-3;
  sc.schedule.total_steps = steps;
  return sc;
}

/// sft_trainer on the host against the same loop on `dev` — device-resident (AdamW on the device)
/// or with the optimizer offloaded — over `steps` updates of micro-batches with weight decay,
/// warmup and clipping that engages; then a device run cut at step 2, snapshotted, restored into a
/// fresh model and continued, against the straight device run (bit-identical on any device).
inline resident_training_diff compare_resident_training(device& dev, bool offload, int steps = 4) {
  using namespace weft::gpu::train;
  auto img = make_tiny_model(training_model_config(true));
  EXPECT_TRUE(img.ok());
  auto load = [&](device* d) {
    auto f = gguf_file::parse(*img);
    EXPECT_TRUE(f.ok());
    auto m = trainable_model<float>::load(*f);
    EXPECT_TRUE(m.ok());
    if (d != nullptr) {
      EXPECT_TRUE((*m)->use_device(d).ok());
    }
    return std::move(m.value());
  };
  const sft_dataset data = random_sft_data(11, 12, 3);
  sft_config sc = small_sft_config(3, 48, steps);
  sc.schedule.warmup_steps = 1;
  sc.adamw.weight_decay = 0.1;
  sc.max_grad_norm = 0.5;  // below the tiny model's norms: clipping engages
  sc.offload_optimizer = offload;
  resident_training_diff diff;
  auto rel = [](double a, double b) { return std::fabs(a - b) / std::max(std::fabs(a), 1e-12); };
  auto max_rel = [](const std::vector<float>& a, const std::vector<float>& b) {
    double mx = 0, d = 0;
    for (size_t j = 0; j < a.size(); ++j) {
      mx = std::max(mx, double(std::fabs(a[j])));
      d = std::max(d, double(std::fabs(a[j] - b[j])));
    }
    return d / std::max(mx, 1e-12);
  };
  auto host = load(nullptr);
  auto on_dev = load(&dev);
  sft_trainer th(*host, data, sc);
  sft_trainer td(*on_dev, data, sc);
  EXPECT_EQ(on_dev->device_resident(), !offload);
  for (int i = 0; i < steps; ++i) {
    auto rh = th.step();
    auto rd = td.step();
    EXPECT_TRUE(rh.ok() && rd.ok()) << (rd.ok() ? "" : rd.error().to_string());
    if (!rh.ok() || !rd.ok()) return diff;
    diff.loss_rel = std::max(diff.loss_rel, rel(rh->loss, rd->loss));
    diff.norm_rel = std::max(diff.norm_rel, rel(rh->grad_norm, rd->grad_norm));
    diff.bitwise = diff.bitwise && rh->loss == rd->loss && rh->grad_norm == rd->grad_norm;
  }
  // After device steps the host copy is stale until brought up to date: export says so.
  if (!offload) {
    EXPECT_FALSE(on_dev->host_current());
    auto f = gguf_file::parse(*img);
    EXPECT_FALSE(export_gguf(*f, *on_dev, ggml_type::f32, "/nonexistent/never-written.gguf").ok());
  }
  auto sh = th.snapshot();
  auto sd = td.snapshot();
  EXPECT_TRUE(sh.ok() && sd.ok());
  if (!sh.ok() || !sd.ok()) return diff;
  EXPECT_TRUE(on_dev->host_current());
  for (size_t i = 0; i < sh->values.size(); ++i) {
    diff.weight_rel = std::max(diff.weight_rel, max_rel(sh->values[i], sd->values[i]));
    diff.moment_rel =
        std::max({diff.moment_rel, max_rel(sh->m[i], sd->m[i]), max_rel(sh->v[i], sd->v[i])});
    diff.bitwise = diff.bitwise && sh->values[i] == sd->values[i] && sh->m[i] == sd->m[i] &&
                   sh->v[i] == sd->v[i];
  }
  // Resume on the device from a snapshot at step 2.
  auto first = load(&dev);
  sft_trainer a(*first, data, sc);
  for (int i = 0; i < 2; ++i) EXPECT_TRUE(a.step().ok());
  auto cut = a.snapshot();
  EXPECT_TRUE(cut.ok());
  if (!cut.ok()) return diff;
  auto second = load(&dev);
  sft_trainer b(*second, data, sc);
  EXPECT_TRUE(b.restore(*cut).ok());
  for (int i = 2; i < steps; ++i) EXPECT_TRUE(b.step().ok());
  auto sb = b.snapshot();
  EXPECT_TRUE(sb.ok());
  if (!sb.ok()) return diff;
  diff.resume_exact = b.history() == td.history() && sb->values == sd->values && sb->m == sd->m &&
                      sb->v == sd->v && sb->step == sd->step;
  std::printf(
      "[train] sft on %s (%s): loss %.3g, norm %.3g, weights %.3g, moments %.3g relative, %s; "
      "resume %s\n",
      dev.capabilities().name.c_str(), offload ? "optimizer offloaded" : "device-resident",
      diff.loss_rel, diff.norm_rel, diff.weight_rel, diff.moment_rel,
      diff.bitwise ? "bit-identical" : "not bit-identical",
      diff.resume_exact ? "exact" : "NOT exact");
  return diff;
}

}  // namespace weft::gpu::testing
