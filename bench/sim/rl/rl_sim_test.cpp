// The RL cluster simulator (bench/sim/rl): deterministic, exact sample counts and the staleness
// bound in every mode (it drives the real rollout_scheduler), and the effects it exists to show —
// the long tail idles a sync cluster, async overlaps it, length-aware placement balances agents.
#include <gtest/gtest.h>

#include <numeric>

#include "bench/sim/rl/rl_sim.hpp"

namespace {

using namespace weft::bench::sim;

rl_sim_config small() {
  rl_sim_config c;
  c.gpus = 16;
  c.prompts_per_step = 64;
  c.max_running = 16;  // agents queue: where starting the long samples first matters
  c.steps = 8;
  c.mean_len = 400;
  c.max_len = 4096;
  return c;
}

TEST(rl_sim, runs_repeat_and_train_every_sample_once_within_the_bound) {
  const auto c = small();
  for (auto mode : {rl_sim_mode::sync_colocated, rl_sim_mode::async_round_robin,
                    rl_sim_mode::async_length_aware}) {
    for (int64_t k : {1, 2}) {
      const auto a = simulate_rl(c, mode, k);
      const auto b = simulate_rl(c, mode, k);
      ASSERT_TRUE(a.error.empty()) << a.error;
      EXPECT_EQ(a.seconds, b.seconds);
      EXPECT_EQ(a.samples, c.steps * c.prompts_per_step * c.group_size);
      const auto& h = a.staleness_histogram;
      EXPECT_EQ(std::accumulate(h.begin(), h.end(), int64_t{0}), a.samples);
      const int64_t bound = mode == rl_sim_mode::sync_colocated ? 0 : k;
      EXPECT_LE(static_cast<int64_t>(h.size()), bound + 1);
      EXPECT_GT(a.rollout_busy, 0.0);
      EXPECT_LE(a.rollout_busy, 1.0 + 1e-9);
    }
  }
}

TEST(rl_sim, output_lengths_are_heavy_tailed_and_the_same_in_every_mode) {
  const auto c = small();
  std::vector<int64_t> lens;
  for (int64_t g = 0; g < c.prompts_per_step; ++g) {
    for (int64_t j = 0; j < c.group_size; ++j) lens.push_back(sim_output_length(c, 0, g, j));
  }
  std::sort(lens.begin(), lens.end());
  const double median = static_cast<double>(lens[lens.size() / 2]);
  EXPECT_GT(static_cast<double>(lens.back()), 4.0 * median);  // a long tail
  EXPECT_EQ(sim_output_length(c, 3, 2, 1), sim_output_length(c, 3, 2, 1));
}

TEST(rl_sim, async_overlaps_the_tail_and_length_aware_placement_balances_it) {
  auto c = small();
  c.prompt_sigma = 1.0;
  const auto sync = simulate_rl(c, rl_sim_mode::sync_colocated, 0);
  const auto rr = simulate_rl(c, rl_sim_mode::async_round_robin, 2);
  const auto la = simulate_rl(c, rl_sim_mode::async_length_aware, 2);
  ASSERT_TRUE(sync.error.empty() && rr.error.empty() && la.error.empty());
  std::printf("samples/s: sync %.1f, async K=2 %.1f, + length-aware %.1f\n", sync.samples_per_s,
              rr.samples_per_s, la.samples_per_s);
  EXPECT_GT(rr.samples_per_s, sync.samples_per_s);
  EXPECT_GE(la.samples_per_s, rr.samples_per_s);
  // Sync's GPUs idle through the tail: they decode smaller batches.
  EXPECT_LT(sync.mean_batch, rr.mean_batch);
}

}  // namespace
