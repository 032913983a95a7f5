// The data-parallel update of `weft rl --trainers K` (gpu/rl/grpo_update.hpp, docs/rl.md
// "Trainer groups"), with rank 1 simulated in this process: every rank ends each step with the
// same weights; runs repeat bit for bit; a rank lost in the middle of an update — before the sum,
// or at the second of several updates of a step, with its own state spoiled — costs nothing: the
// new group gets rank 0's weights and moments and the run is bit-identical to the undisturbed
// one; the result equals a single trainer's up to the order of the sums.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gpu/rl/grpo_loop.hpp"
#include "gpu/rl/grpo_update.hpp"
#include "gpu/rl/tasks.hpp"
#include "gpu/train/sft_run.hpp"
#include "gpu/train/trainable_model.hpp"
#include "tests/unit/gpu/rl_test_support.hpp"

namespace {

using namespace weft::gpu;
using namespace weft::gpu::rl;
using weft::gpu::rl_test::digits_task;
using weft::gpu::rl_test::tiny_file;
using weft::gpu::train::trainable_model;

/// A group of 2 whose rank 1 runs in this process, in rank 0's reduce(): its forward and backward,
/// the sum (rank 0's gradient + rank 1's, on both), its own AdamW step. `fail_at` (step,
/// iteration): that reduce fails once, as a dead rank's would, after spoiling rank 1's state.
/// `device` (e.g. "cpu:0"): the group sums on the devices, as with NCCL — rank 1 trains
/// device-resident there and the sum adds the two ranks' device gradient buffers in place.
class inprocess_group final : public update_group {
 public:
  inprocess_group(const gguf_file& file, const grpo_loop_config& c, const std::string& device = "")
      : cfg_(c) {
    if (!device.empty()) {
      auto d = train::open_training_device(device);
      EXPECT_TRUE(d.ok() && *d) << device;
      if (d.ok()) dev_ = std::move(*d);
    }
    auto m = trainable_model<float>::load(file);
    EXPECT_TRUE(m.ok());
    model_ = std::move(*m);
    model_->set_logit_temperature(c.temperature);
    std::vector<int64_t> sizes;
    for (const auto& p : std::as_const(*model_).parameters()) {
      sizes.push_back(p.size());
      decay_.push_back(p.ne[1] > 1 ? 1 : 0);
    }
    opt_ = train::adamw(c.adamw);
    opt_.init(sizes);
  }
  std::optional<std::pair<int64_t, int64_t>> fail_at;

  int world() const override { return 2; }
  status ready(const state_source& source) override {
    lost_ = false;
    if (formed_) return {};
    auto state = source();
    if (!state) return state.error();
    auto mine = trainer_state(*model_, opt_);
    EXPECT_EQ(mine.size(), state->size());
    for (size_t i = 0; i < state->size(); ++i) {
      std::copy((*state)[i].begin(), (*state)[i].end(), mine[i].begin());
    }
    model_->host_replaced();
    if (dev_ && !model_->device_resident()) {
      if (auto st = model_->use_device(dev_.get()); !st) return st;
      if (auto st = model_->set_device_resident(true); !st) return st;
      model_->host_replaced();
    }
    formed_ = true;
    ++groups_;
    return {};
  }
  bool sums_on_device() const override { return dev_ != nullptr && formed_; }
  status start(const iteration_inputs& in,
               std::span<const std::vector<std::vector<train::train_batch>>> per_rank) override {
    lost_ = false;
    EXPECT_EQ(per_rank.size(), 1u);
    in_ = in;
    lists_ = per_rank[0];
    return {};
  }
  status reduce(std::span<const std::span<float>> grads, std::span<double> scalars) override {
    if (fail_at && fail_at->first == in_.step && fail_at->second == in_.iteration) {
      fail_at.reset();
      for (auto& p : model_->parameters()) std::fill(p.value.begin(), p.value.end(), 7.0f);
      formed_ = false;
      lost_ = true;
      return {status_code::internal, "gradient all-reduce: rank 1 is gone"};
    }
    std::vector<double> own(scalars.begin(), scalars.end());
    // On the devices `grads` are rank 0's device buffers, here the CPU device's memory.
    const auto sum_both = [&](std::span<const std::span<float>> g1, std::span<double> s1) {
      EXPECT_EQ(g1.size(), grads.size());
      for (size_t i = 0; i < g1.size(); ++i) {
        for (size_t k = 0; k < g1[i].size(); ++k) {
          const float sum = grads[i][k] + g1[i][k];  // rank order
          grads[i][k] = sum;
          g1[i][k] = sum;
        }
      }
      for (size_t k = 0; k < s1.size(); ++k) {
        const double sum = own[k] + s1[k];
        scalars[k] = sum;
        s1[k] = sum;
      }
      return status{};
    };
    const int shares = std::max(1, cfg_.shares);
    auto t =
        dev_ ? device_update_iteration(*model_, opt_, decay_, cfg_.grpo, in_, shares, lists_,
                                       sum_both)
             : update_iteration(*model_, opt_, decay_, cfg_.grpo, in_, shares, lists_, sum_both);
    return t ? status{} : t.error();
  }
  bool lost() const override { return lost_; }
  int64_t groups_formed() const override { return groups_; }
  double take_reduce_seconds() override { return 0.0; }

  trainable_model<float>& model() { return *model_; }

 private:
  grpo_loop_config cfg_;
  std::unique_ptr<device> dev_;  // declared before the model: outlives it
  std::unique_ptr<trainable_model<float>> model_;
  train::adamw opt_;
  std::vector<uint8_t> decay_;
  iteration_inputs in_;
  std::vector<std::vector<train::train_batch>> lists_;
  bool formed_ = false, lost_ = false;
  int64_t groups_ = 0;
};

grpo_loop_config cfg() {
  auto c = weft::gpu::rl_test::tiny_loop_config();
  c.shares = 2;
  return c;
}

struct run {
  std::unique_ptr<grpo_loop> loop;
  std::shared_ptr<inprocess_group> group;
  std::vector<rl_step_record> steps;
};

run make_run(const gguf_file& file, const rl_task& task, const grpo_loop_config& c, bool grouped,
             std::optional<std::pair<int64_t, int64_t>> fail_at = std::nullopt, int n = 4,
             const std::string& group_device = "") {
  run r;
  auto m = trainable_model<float>::load(file);
  EXPECT_TRUE(m.ok());
  auto loop = grpo_loop::create(file, std::move(*m), task, c);
  EXPECT_TRUE(loop.ok()) << loop.error().message();
  r.loop = std::move(*loop);
  if (grouped) {
    r.group = std::make_shared<inprocess_group>(file, c, group_device);
    r.group->fail_at = fail_at;
    EXPECT_TRUE(r.loop->set_update_group(r.group).ok());
  }
  for (int s = 0; s < n; ++s) {
    auto rec = r.loop->step();
    EXPECT_TRUE(rec.ok()) << rec.error().message();
    if (!rec.ok()) break;
    r.steps.push_back(*rec);
  }
  return r;
}

void expect_same_weights(trainable_model<float>& a, trainable_model<float>& b) {
  const auto& va = std::as_const(a).parameters();
  const auto& vb = std::as_const(b).parameters();
  ASSERT_EQ(va.size(), vb.size());
  for (size_t i = 0; i < va.size(); ++i) ASSERT_EQ(va[i].value, vb[i].value) << va[i].name;
}

/// The same losses, gradient norms and rewards step for step, bit for bit.
void expect_same_steps(const run& a, const run& b) {
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t s = 0; s < a.steps.size(); ++s) {
    EXPECT_EQ(a.steps[s].loss, b.steps[s].loss) << "step " << s + 1;
    EXPECT_EQ(a.steps[s].grad_norm, b.steps[s].grad_norm) << "step " << s + 1;
    EXPECT_EQ(a.steps[s].reward_mean, b.steps[s].reward_mean) << "step " << s + 1;
  }
}

// plan_update_shares: samples of 10 tokens each, prompt prefixes of 40.
update_unit unit_of(int64_t group, std::vector<size_t> samples) {
  update_unit u{group, std::move(samples), 40, 40};
  u.tokens += 10 * u.samples.size();
  return u;
}

TEST(update_shares, one_prompt_is_split_so_no_share_idles) {
  const auto ten = [](size_t) { return size_t{10}; };
  // One group of 8 (the other all had advantage 0): halves on the two shares, each with the
  // prefix — 80 tokens against 120 on one share.
  auto p = plan_update_shares({unit_of(3, {8, 9, 10, 11, 12, 13, 14, 15})}, 2, ten);
  ASSERT_EQ(p.units.size(), 2u);
  EXPECT_EQ(p.units[0].samples, (std::vector<size_t>{8, 9, 10, 11}));
  EXPECT_EQ(p.units[1].samples, (std::vector<size_t>{12, 13, 14, 15}));
  EXPECT_EQ(p.units[1].group, 3);
  EXPECT_EQ(p.units[1].tokens, 80u);
  EXPECT_EQ(p.heaviest, 80u);
  EXPECT_EQ(p.shares, (std::vector<std::vector<size_t>>{{0}, {1}}));
  // Four shares: quarters (60 each); a split that would not lighten the heaviest share stops.
  p = plan_update_shares({unit_of(0, {0, 1, 2, 3, 4, 5, 6, 7})}, 4, ten);
  EXPECT_EQ(p.units.size(), 4u);
  EXPECT_EQ(p.heaviest, 60u);
  // Balanced units are left whole (splitting only adds prefixes).
  p = plan_update_shares({unit_of(0, {0, 1, 2, 3}), unit_of(1, {4, 5, 6, 7})}, 2, ten);
  EXPECT_EQ(p.units.size(), 2u);
  EXPECT_EQ(p.heaviest, 80u);
  // Lopsided: 16 samples against 2 → the big one is split (120 + 60 against 200); 8 against 2
  // is left (a split's extra prefix would make the heavier share 140 against 120).
  std::vector<size_t> sixteen(16);
  for (size_t i = 0; i < 16; ++i) sixteen[i] = i;
  p = plan_update_shares({unit_of(0, sixteen), unit_of(1, {16, 17})}, 2, ten);
  EXPECT_EQ(p.units.size(), 3u);
  EXPECT_EQ(p.heaviest, 180u);
  p = plan_update_shares({unit_of(0, {0, 1, 2, 3, 4, 5, 6, 7}), unit_of(1, {8, 9})}, 2, ten);
  EXPECT_EQ(p.units.size(), 2u);
  EXPECT_EQ(p.heaviest, 120u);
  for (const auto& s : p.shares) EXPECT_TRUE(std::is_sorted(s.begin(), s.end()));
  // A single sample cannot be split; one share and no units are fine.
  p = plan_update_shares({unit_of(0, {5})}, 2, ten);
  EXPECT_EQ(p.units.size(), 1u);
  EXPECT_EQ(plan_update_shares({unit_of(0, {0, 1})}, 1, ten).units.size(), 1u);
  EXPECT_TRUE(plan_update_shares({}, 2, ten).units.empty());
}

TEST(grpo_group, every_rank_holds_the_same_weights_and_runs_repeat_bit_for_bit) {
  const auto file = tiny_file();
  digits_task task;
  auto a = make_run(file, task, cfg(), true);
  auto b = make_run(file, task, cfg(), true);
  ASSERT_EQ(a.steps.size(), 4u);
  expect_same_weights(a.loop->model(), a.group->model());
  expect_same_weights(a.loop->model(), b.loop->model());
  bool moved = false;
  for (size_t s = 0; s < a.steps.size(); ++s) {
    EXPECT_EQ(a.steps[s].loss, b.steps[s].loss);
    EXPECT_EQ(a.steps[s].trainer_groups, 1);
    moved |= a.steps[s].grad_norm > 0.0;
  }
  EXPECT_TRUE(moved);
}

TEST(grpo_group, a_rank_lost_mid_update_changes_nothing) {
  const auto file = tiny_file();
  digits_task task;
  auto c = cfg();
  c.updates_per_step = 2;
  auto whole = make_run(file, task, c, true);
  // Lost before the sum of step 2's first update, and of step 3's second update.
  for (auto at : {std::pair<int64_t, int64_t>{1, 0}, std::pair<int64_t, int64_t>{2, 1}}) {
    auto hit = make_run(file, task, c, true, at);
    ASSERT_EQ(hit.steps.size(), 4u);
    EXPECT_EQ(hit.steps.back().trainer_groups, 2) << "a new group formed";
    expect_same_weights(whole.loop->model(), hit.loop->model());
    expect_same_weights(hit.loop->model(), hit.group->model());
    for (size_t s = 0; s < whole.steps.size(); ++s) {
      EXPECT_EQ(whole.steps[s].loss, hit.steps[s].loss) << "step " << s + 1;
      EXPECT_EQ(whole.steps[s].grad_norm, hit.steps[s].grad_norm) << "step " << s + 1;
      EXPECT_EQ(whole.steps[s].clip_fraction, hit.steps[s].clip_fraction) << "step " << s + 1;
    }
  }
}

TEST(grpo_group, equals_one_trainer_up_to_the_order_of_the_sums) {
  const auto file = tiny_file();
  digits_task task;
  auto one_cfg = cfg();
  one_cfg.shares = 4;  // the same 4 lists, summed in another order
  auto one = make_run(file, task, one_cfg, false, std::nullopt, 2);
  auto two = make_run(file, task, cfg(), true, std::nullopt, 2);
  ASSERT_EQ(one.steps.size(), 2u);
  ASSERT_EQ(two.steps.size(), 2u);
  EXPECT_EQ(one.steps[0].reward_mean, two.steps[0].reward_mean);
  EXPECT_NEAR(one.steps[0].loss, two.steps[0].loss, 1e-6);
  EXPECT_NEAR(one.steps[0].grad_norm, two.steps[0].grad_norm, 1e-4 * one.steps[0].grad_norm);
  const auto& va = std::as_const(one.loop->model()).parameters();
  const auto& vb = std::as_const(two.loop->model()).parameters();
  double worst = 0.0;
  for (size_t i = 0; i < va.size(); ++i) {
    for (size_t k = 0; k < va[i].value.size(); ++k) {
      worst = std::max(worst, std::fabs(static_cast<double>(va[i].value[k]) - vb[i].value[k]));
    }
  }
  EXPECT_LT(worst, 1e-4);
}

TEST(grpo_group, on_a_device_trainer_rank_0_adds_its_gradients_into_host_memory) {
  // --device with --trainers K: rank 0 leaves device-resident training when the group is set
  // (forward and backward stay on the device; the gradients are summed and AdamW runs on the
  // host), and the grouped run on the CPU device gives the grouped host run's bits.
  const auto file = tiny_file();
  digits_task task;
  auto c = cfg();
  c.shares = 1;
  auto host = make_run(file, task, c, true);
  c.train_device = "cpu:0";
  auto dev = make_run(file, task, c, true);
  expect_same_steps(host, dev);
  EXPECT_NE(dev.loop->model().compute_device(), nullptr);
  EXPECT_FALSE(dev.loop->model().device_resident());
  expect_same_weights(host.loop->model(), dev.loop->model());
}

TEST(grpo_group, summing_on_the_devices_every_rank_trains_device_resident) {
  // --dist-backend nccl: when the group sums on the GPUs, rank 0 trains device-resident
  // (weights, gradients and AdamW in device memory), its device gradient buffers are summed in
  // place and AdamW runs there, on every rank. On the CPU device: the host group's bits, with a
  // rank lost in the middle of an update (the new group gets rank 0's state from its device).
  const auto file = tiny_file();
  digits_task task;
  auto c = cfg();
  c.shares = 1;
  auto host = make_run(file, task, c, true);
  c.train_device = "cpu:0";
  for (auto fail_at : {std::optional<std::pair<int64_t, int64_t>>{},
                       std::optional<std::pair<int64_t, int64_t>>{{2, 0}}}) {
    auto dev = make_run(file, task, c, true, fail_at, 4, "cpu:0");
    expect_same_steps(host, dev);
    EXPECT_TRUE(dev.loop->model().device_resident());
    EXPECT_TRUE(dev.group->model().device_resident());
    EXPECT_EQ(dev.group->groups_formed(), fail_at ? 2 : 1);
    ASSERT_TRUE(dev.loop->model().pull_to_host(nullptr).ok());
    ASSERT_TRUE(dev.group->model().pull_to_host(nullptr).ok());
    expect_same_weights(host.loop->model(), dev.loop->model());
    expect_same_weights(dev.loop->model(), dev.group->model());
  }
}

TEST(grpo_group, is_refused_with_stream_mode) {
  const auto file = tiny_file();
  digits_task task;
  auto c = cfg();
  auto m = trainable_model<float>::load(file);
  ASSERT_TRUE(m.ok());
  auto loop = grpo_loop::create(file, std::move(*m), task, c);
  ASSERT_TRUE(loop.ok());
  auto g = std::make_shared<inprocess_group>(file, c);
  EXPECT_TRUE((*loop)->set_update_group(g).ok());
  c.stream = true;
  c.max_staleness = 0;
  auto m2 = trainable_model<float>::load(file);
  ASSERT_TRUE(m2.ok());
  auto s = grpo_loop::create(file, std::move(*m2), task, c);
  ASSERT_TRUE(s.ok()) << s.error().message();
  EXPECT_EQ((*s)->set_update_group(g).code(), status_code::invalid_argument);
}

}  // namespace
