// The GRPO loop (gpu/rl/grpo_loop.hpp, docs/rl.md) on a generated tiny model: sync runs repeat bit
// for bit and the engine serves the trainer's weights; exact resume; async runs repeat and stay
// within the staleness bound; stream steps repeat and equal sync up to rounding; an async resume
// trains every step once; the KL term; several
// updates per step; learning a graded reward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/rl/grpo_loop.hpp"
#include "gpu/rl/reference.hpp"
#include "gpu/rl/tasks.hpp"
#include "gpu/train/checkpoint.hpp"
#include "gpu/train/trainable_model.hpp"
#include "tests/unit/gpu/rl_test_support.hpp"

namespace {

using namespace weft::gpu;
using namespace weft::gpu::rl;
using weft::gpu::rl_test::digits_task;
using weft::gpu::rl_test::tiny_file;
using weft::gpu::train::trainable_model;

grpo_loop_config loop_cfg() {
  auto c = weft::gpu::rl_test::tiny_loop_config();
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

/// Steps `a` and `b` side by side `n` times; each step's pair of records (empty on a failure,
/// which is reported).
std::vector<std::pair<rl_step_record, rl_step_record>> step_both(grpo_loop& a, grpo_loop& b,
                                                                 int n) {
  std::vector<std::pair<rl_step_record, rl_step_record>> out;
  for (int s = 0; s < n; ++s) {
    auto ra = a.step();
    auto rb = b.step();
    EXPECT_TRUE(ra.ok() && rb.ok()) << (ra.ok() ? rb.error().message() : ra.error().message());
    if (!ra.ok() || !rb.ok()) return {};
    out.emplace_back(*ra, *rb);
  }
  return out;
}

/// Both loops' host parameters are the same bits.
void expect_same_weights(grpo_loop& a, grpo_loop& b) {
  const auto& va = std::as_const(a.model()).parameters();
  const auto& vb = std::as_const(b.model()).parameters();
  ASSERT_EQ(va.size(), vb.size());
  for (size_t i = 0; i < va.size(); ++i) ASSERT_EQ(va[i].value, vb[i].value) << va[i].name;
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
    const gguf_tensor* t = a->rollout_model()->file().find_tensor(pa.name);
    ASSERT_NE(t, nullptr);
    ASSERT_EQ(std::memcmp(t->data, pa.value.data(), pa.value.size() * sizeof(float)), 0) << pa.name;
  }
  // The first step trained on rollouts of version 0, so its ratios were ~1 (engine vs trainer
  // numerics only: the engine's fp16 KV cache).
  EXPECT_LT(a->history().front().ratio_deviation, 0.02);
}

TEST(grpo_loop, stream_steps_repeat_bit_for_bit_and_equal_sync_up_to_rounding) {
  const auto file = tiny_file();
  digits_task task;
  for (auto agg :
       {loss_aggregation::token, loss_aggregation::sequence, loss_aggregation::constant}) {
    auto sync_cfg = loop_cfg();
    sync_cfg.grpo.aggregation = agg;
    auto stream_cfg = sync_cfg;
    stream_cfg.stream = true;
    auto a = make_loop(file, task, stream_cfg);
    auto b = make_loop(file, task, stream_cfg);
    auto c = make_loop(file, task, sync_cfg);
    const auto both = step_both(*a, *b, 3);
    ASSERT_EQ(both.size(), 3u);
    for (const auto& [ra, rb] : both) {
      EXPECT_EQ(ra.loss, rb.loss);
      EXPECT_EQ(ra.samples, 24);
    }
    expect_same_weights(*a, *b);
    // The first step trains sync's very samples; only the order of the gradient sums differs.
    auto rc = c->step();
    ASSERT_TRUE(rc.ok()) << rc.error().message();
    const rl_step_record& ra = both.front().first;
    EXPECT_EQ(ra.reward_mean, rc->reward_mean);
    EXPECT_EQ(ra.completion_tokens, rc->completion_tokens);
    EXPECT_GT(rc->grad_norm, 0.0);
    EXPECT_NEAR(ra.grad_norm, rc->grad_norm, 1e-5 * rc->grad_norm) << static_cast<int>(agg);
    EXPECT_NEAR(ra.loss, rc->loss, 1e-4 * std::abs(rc->loss) + 1e-9) << static_cast<int>(agg);
    EXPECT_EQ(ra.clip_fraction, rc->clip_fraction);
  }
  // Stream trains each group once, on-policy, on the host.
  auto bad = loop_cfg();
  bad.stream = true;
  bad.max_staleness = 1;
  auto m = trainable_model<float>::load(file);
  ASSERT_TRUE(m.ok());
  auto refused = grpo_loop::create(file, std::move(*m), task, bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), status_code::invalid_argument);
}

TEST(grpo_loop, a_device_resident_trainer_gives_the_host_trainers_bits) {
  // The trainer on the CPU device, device-resident (forward, backward and AdamW through
  // device::training(), as `weft rl --device cuda` runs them on a GPU) against the host trainer:
  // the same rewards, losses and weights, and the engine serves the device's weights.
  const auto file = tiny_file();
  digits_task task;
  auto cfg = loop_cfg();
  cfg.shares = 1;  // a device runs one share; the host the same, for the same bits
  auto host = make_loop(file, task, cfg);
  auto on_dev = make_loop(file, task, cfg);
  auto dev = device_registry::instance().create("cpu", device_config{2, 0});
  ASSERT_TRUE(dev.ok());
  ASSERT_TRUE(on_dev->model().use_device(dev->get()).ok());
  ASSERT_TRUE(on_dev->model().set_device_resident(true).ok());
  const auto steps = step_both(*host, *on_dev, 3);
  ASSERT_EQ(steps.size(), 3u);
  for (const auto& [a, b] : steps) {
    EXPECT_EQ(a.reward_mean, b.reward_mean);
    EXPECT_EQ(a.loss, b.loss);
    EXPECT_EQ(a.grad_norm, b.grad_norm);
  }
  EXPECT_TRUE(on_dev->model().host_current());  // the weight push brought the host copy up
  expect_same_weights(*host, *on_dev);
  train::checkpoint_state ckpt;
  ASSERT_TRUE(on_dev->snapshot_into(ckpt).ok());
  EXPECT_EQ(ckpt.step, 3);
  ASSERT_TRUE(on_dev->model().use_device(nullptr).ok());  // host current: detaching is allowed
}

TEST(grpo_loop, named_devices_run_the_trainer_the_kl_reference_and_the_rollout_engine) {
  // train_device / rollout_device by name ("cpu:0" is the CPU *device*, as "cuda:0" a GPU): the
  // trainer device-resident, the KL reference's forward and the rollout engine there give the
  // host loop's bits.
  const auto file = tiny_file();
  digits_task task;
  auto cfg = loop_cfg();
  cfg.shares = 1;
  cfg.grpo.kl_coef = 0.05;
  auto host = make_loop(file, task, cfg);
  cfg.train_device = "cpu:0";
  cfg.rollout_device = "cpu:0";
  auto on_dev = make_loop(file, task, cfg);
  ASSERT_NE(on_dev->model().compute_device(), nullptr);
  EXPECT_TRUE(on_dev->model().device_resident());
  const auto steps = step_both(*host, *on_dev, 3);
  ASSERT_EQ(steps.size(), 3u);
  for (size_t s = 0; s < steps.size(); ++s) {
    const auto& [a, b] = steps[s];
    EXPECT_EQ(a.reward_mean, b.reward_mean);
    EXPECT_EQ(a.loss, b.loss);
    EXPECT_EQ(a.kl, b.kl);
    if (s > 0) {
      EXPECT_GT(b.kl, 0.0);
    }
  }
}

TEST(grpo_loop, stream_mode_on_a_device_trains_the_host_streams_bits) {
  // --mode stream with the trainer device-resident (the CPU *device*, a GPU's code path): each
  // chunk's gradients add up on the device, the update runs there (device_step), and the run
  // equals the host trainer's stream run bit for bit, with the KL reference on the device too.
  const auto file = tiny_file();
  digits_task task;
  auto cfg = loop_cfg();
  cfg.shares = 1;
  cfg.stream = true;
  cfg.grpo.kl_coef = 0.05;
  auto host = make_loop(file, task, cfg);
  cfg.train_device = "cpu:0";
  auto on_dev = make_loop(file, task, cfg);
  ASSERT_TRUE(on_dev->model().device_resident());
  const auto steps = step_both(*host, *on_dev, 3);
  ASSERT_EQ(steps.size(), 3u);
  for (size_t s = 0; s < steps.size(); ++s) {
    const auto& [a, b] = steps[s];
    EXPECT_EQ(a.reward_mean, b.reward_mean) << "step " << s + 1;
    EXPECT_EQ(a.loss, b.loss) << "step " << s + 1;
    EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << s + 1;
    EXPECT_GT(b.grad_norm, 0.0);
    EXPECT_EQ(a.kl, b.kl) << "step " << s + 1;
  }
  ASSERT_TRUE(on_dev->model().pull_to_host(nullptr).ok());
  expect_same_weights(*host, *on_dev);
}

/// Every completion scores 0: every group has zero variance, no sample enters the loss.
class zero_task final : public rl_task {
 public:
  std::string name() const override { return "zero"; }
  int64_t size() const override { return 0; }
  rl_prompt problem(uint64_t, int64_t index) const override {
    return rl_prompt{std::to_string(index), "Say anything", "", {}, {}};
  }
  double reward(const rl_prompt&, std::string_view) const override { return 0.0; }
};

TEST(grpo_loop, a_step_with_no_sample_in_the_loss_updates_on_a_device_as_on_the_host) {
  // No forward/backward runs in such a step; AdamW still steps (zero gradients, weight decay).
  // The device-resident trainer once refused it (no gradients on the device yet).
  const auto file = tiny_file();
  zero_task task;
  auto cfg = loop_cfg();
  cfg.shares = 1;
  cfg.adamw.weight_decay = 0.1;
  auto host = make_loop(file, task, cfg);
  cfg.train_device = "cpu:0";
  auto on_dev = make_loop(file, task, cfg);
  const auto steps = step_both(*host, *on_dev, 2);
  ASSERT_EQ(steps.size(), 2u);
  for (const auto& [a, b] : steps) {
    EXPECT_EQ(a.zero_variance_groups, cfg.prompts_per_step);
    EXPECT_EQ(b.grad_norm, 0.0);
  }
  ASSERT_TRUE(on_dev->model().pull_to_host(nullptr).ok());
  expect_same_weights(*host, *on_dev);
  const auto& ph = std::as_const(host->model()).parameters();
  auto fresh = trainable_model<float>::load(file);
  ASSERT_TRUE(fresh.ok());
  bool moved = false;
  for (size_t i = 0; i < ph.size(); ++i) moved |= ph[i].value != (*fresh)->parameters()[i].value;
  EXPECT_TRUE(moved);  // weight decay moved the matrices
}

TEST(grpo_loop, an_unknown_or_malformed_device_is_a_clear_error) {
  const auto file = tiny_file();
  digits_task task;
  for (const char* name : {"tpu", "cuda:x", "cpu:"}) {
    for (bool rollout : {false, true}) {
      auto cfg = loop_cfg();
      (rollout ? cfg.rollout_device : cfg.train_device) = name;
      auto m = trainable_model<float>::load(file);
      ASSERT_TRUE(m.ok());
      auto loop = grpo_loop::create(file, std::move(*m), task, cfg);
      ASSERT_FALSE(loop.ok()) << name;
      EXPECT_EQ(loop.error().code(), status_code::invalid_argument) << loop.error().message();
      EXPECT_NE(loop.error().message().find(name), std::string::npos) << loop.error().message();
    }
  }
}

TEST(grpo_loop, a_resumed_run_is_bit_identical_to_an_uninterrupted_one) {
  const auto file = tiny_file();
  digits_task task;
  auto whole = make_loop(file, task, loop_cfg());
  for (int s = 0; s < 4; ++s) ASSERT_TRUE(whole->step().ok());
  auto first = make_loop(file, task, loop_cfg());
  for (int s = 0; s < 2; ++s) ASSERT_TRUE(first->step().ok());
  train::checkpoint_state ckpt;
  ASSERT_TRUE(first->snapshot_into(ckpt).ok());
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
  ASSERT_TRUE(first->snapshot_into(ckpt).ok());
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

// An external reference (e.g. on reference workers) must be set before the first step: a loop
// with a KL term and no reference refuses to step instead of training without the term. Once
// set, it gives the in-process reference's bits.
TEST(grpo_loop, an_unset_external_reference_is_refused_and_a_set_one_equals_the_own_one) {
  const auto file = tiny_file();
  digits_task task;
  auto cfg = loop_cfg();
  cfg.grpo.kl_coef = 0.5;
  auto own = make_loop(file, task, cfg);
  cfg.external_reference = true;
  auto ext = make_loop(file, task, cfg);
  auto refused = ext->step();
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message().find("set_reference"), std::string::npos)
      << refused.error().message();
  auto ref = load_local_reference(file, cfg.temperature, nullptr);
  ASSERT_TRUE(ref.ok()) << ref.error().message();
  ext->set_reference(std::shared_ptr<reference_policy>(std::move(*ref)));
  for (int s = 0; s < 2; ++s) {
    auto a = own->step();
    auto b = ext->step();
    ASSERT_TRUE(a.ok()) << a.error().message();
    ASSERT_TRUE(b.ok()) << b.error().message();
    EXPECT_EQ(a->kl, b->kl);
    EXPECT_EQ(a->loss, b->loss);
  }
}

// Inter-stage fusion: with a KL term the reference's log-probs of a group are computed when the
// group finishes (ref_s > 0 counts it), not in the training stage. Fused runs repeat bit for bit,
// and equal the unfused baseline up to the rounding of how the reference's forward is packed.
// AdamW's eps is raised for the comparison: at the first update the policy is the reference, so
// the KL term's gradient is rounding noise of either sign, and with eps 1e-8 AdamW's first step
// (lr · g / |g|) turns any such element into a full ±lr change — on hosts whose BLAS rounds the two
// packings differently (a Zen 1 host did) that amplified the rounding to 1e-3 in the next KL.
TEST(grpo_loop, the_fused_reference_forward_repeats_and_equals_the_unfused_one_to_rounding) {
  const auto file = tiny_file();
  digits_task task;
  auto cfg = loop_cfg();
  cfg.grpo.kl_coef = 0.5;
  cfg.adamw.eps = 1e-4;
  auto fused = make_loop(file, task, cfg);
  auto again = make_loop(file, task, cfg);
  cfg.fuse_reference = false;
  auto unfused = make_loop(file, task, cfg);
  for (int s = 0; s < 4; ++s) {
    auto a = fused->step();
    auto b = again->step();
    auto c = unfused->step();
    ASSERT_TRUE(a.ok() && b.ok() && c.ok());
    EXPECT_EQ(a->loss, b->loss);
    EXPECT_EQ(a->kl, b->kl);
    EXPECT_GT(a->ref_s, 0.0);
    EXPECT_GT(c->ref_s, 0.0);
    EXPECT_EQ(a->reward_mean, c->reward_mean) << "step " << s + 1;
    EXPECT_NEAR(a->loss, c->loss, 1e-4 * std::max(1e-3, std::fabs(c->loss))) << "step " << s + 1;
    EXPECT_NEAR(a->kl, c->kl, 1e-4 * std::max(1e-3, c->kl)) << "step " << s + 1;
    if (s > 0) {
      EXPECT_GT(a->kl, 0.0) << "the policy moved: the test compares real KL terms";
    }
  }
  expect_same_weights(*fused, *again);
}

/// The in-process reference as reference workers look to the loop: it runs elsewhere, takes its
/// time, and records the threads it was called from and the batches of each call.
class elsewhere_reference final : public reference_policy {
 public:
  explicit elsewhere_reference(std::unique_ptr<reference_policy> inner)
      : inner_(std::move(inner)) {}
  result<std::vector<std::vector<float>>> logprobs(
      std::span<const train::train_batch* const> batches) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(4));
    threads.push_back(std::this_thread::get_id());
    sizes.push_back(batches.size());
    return inner_->logprobs(batches);
  }
  bool runs_elsewhere() const override { return true; }
  std::vector<std::thread::id> threads;  // one call at a time: no lock needed
  std::vector<size_t> sizes;

 private:
  std::unique_ptr<reference_policy> inner_;
};

// A fused reference that runs elsewhere is called from the loop's reference thread while the
// rollouts go on (config.async_reference): the same bits as the reference in the loop, in sync,
// async and stream mode; the blocking baseline calls it from the loop and waits for all of it.
TEST(grpo_loop, an_async_reference_elsewhere_trains_the_bits_of_the_one_in_the_loop) {
  const auto file = tiny_file();
  digits_task task;
  struct mode {
    const char* name;
    int64_t staleness;
    bool stream;
  };
  for (const mode& md :
       {mode{"sync", 0, false}, mode{"async K=2", 2, false}, mode{"stream", 0, true}}) {
    SCOPED_TRACE(md.name);
    auto cfg = loop_cfg();
    cfg.grpo.kl_coef = 0.5;
    cfg.max_staleness = md.staleness;
    cfg.stream = md.stream;
    cfg.total_steps = 3;
    auto own = make_loop(file, task, cfg);
    cfg.external_reference = true;
    auto async = make_loop(file, task, cfg);
    cfg.async_reference = false;
    auto blocking = make_loop(file, task, cfg);
    auto a_ref = std::make_shared<elsewhere_reference>(
        std::move(*load_local_reference(file, cfg.temperature, nullptr)));
    auto b_ref = std::make_shared<elsewhere_reference>(
        std::move(*load_local_reference(file, cfg.temperature, nullptr)));
    async->set_reference(a_ref);
    blocking->set_reference(b_ref);
    for (int s = 0; s < 3; ++s) {
      auto x = own->step();
      auto a = async->step();
      auto b = blocking->step();
      ASSERT_TRUE(x.ok() && a.ok() && b.ok()) << (!x.ok()   ? x.error().message()
                                                  : !a.ok() ? a.error().message()
                                                            : b.error().message());
      EXPECT_EQ(a->loss, x->loss) << "step " << s + 1;
      EXPECT_EQ(a->kl, x->kl) << "step " << s + 1;
      EXPECT_EQ(b->loss, x->loss) << "step " << s + 1;
      EXPECT_EQ(b->kl, x->kl) << "step " << s + 1;
      if (s > 0) {
        EXPECT_GT(x->kl, 0.0) << "the policy moved: the test compares real KL terms";
      }
      EXPECT_GT(a->ref_s, 0.0);
      EXPECT_EQ(x->ref_wait_s, 0.0);  // the in-process reference is compute, not a wait
      if (md.staleness == 0) {        // blocking: all of a step's calls waited for, in its step()
        EXPECT_GE(b->ref_wait_s, b->ref_s * 0.99);
      }
    }
    expect_same_weights(*own, *async);
    expect_same_weights(*own, *blocking);
    const auto caller = std::this_thread::get_id();
    ASSERT_FALSE(a_ref->threads.empty());
    for (const auto& t : a_ref->threads) EXPECT_NE(t, caller);
    for (const auto& t : b_ref->threads) EXPECT_EQ(t, caller);
    // Blocking: a group a call. Async: every group of the 3 steps (6 prompts each) in some call.
    for (size_t n : b_ref->sizes) EXPECT_EQ(n, 1u);
    EXPECT_EQ(std::accumulate(a_ref->sizes.begin(), a_ref->sizes.end(), size_t{0}),
              std::accumulate(b_ref->sizes.begin(), b_ref->sizes.end(), size_t{0}));
    async->stop_references();
    async->stop_references();  // idempotent
  }
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
