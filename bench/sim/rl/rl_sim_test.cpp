// The RL cluster simulator (bench/sim/rl): deterministic, exact sample counts and the staleness
// bound in every mode (it drives the real rollout_scheduler), and the effects it exists to show —
// the long tail idles a sync cluster, async overlaps it, length-aware placement balances agents.
#include <gtest/gtest.h>

#include <numeric>

#include "bench/sim/rl/rl_sim.hpp"
#include "gpu/rl/dispatch.hpp"

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
                    rl_sim_mode::async_length_aware, rl_sim_mode::sync_fused}) {
    for (int64_t k : {1, 2}) {
      const auto a = simulate_rl(c, mode, k);
      const auto b = simulate_rl(c, mode, k);
      ASSERT_TRUE(a.error.empty()) << a.error;
      EXPECT_EQ(a.seconds, b.seconds);
      EXPECT_EQ(a.samples, c.steps * c.prompts_per_step * c.group_size);
      const auto& h = a.staleness_histogram;
      EXPECT_EQ(std::accumulate(h.begin(), h.end(), int64_t{0}), a.samples);
      const bool sync = mode == rl_sim_mode::sync_colocated || mode == rl_sim_mode::sync_fused;
      const int64_t bound = sync ? 0 : k;
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

TEST(rl_sim, fusion_moves_the_tail_onto_fewer_gpus_and_trains_meanwhile) {
  auto c = small();
  c.prompt_sigma = 1.0;
  const auto sync = simulate_rl(c, rl_sim_mode::sync_colocated, 0);
  const auto fused = simulate_rl(c, rl_sim_mode::sync_fused, 0);
  ASSERT_TRUE(sync.error.empty() && fused.error.empty()) << fused.error;
  std::printf(
      "samples/s: sync %.1f, sync + fusion %.1f (%lld samples moved, %.0f%% of the tokens "
      "trained during the tail)\n",
      sync.samples_per_s, fused.samples_per_s, static_cast<long long>(fused.migrated),
      100.0 * fused.fused_train_share);
  EXPECT_GT(fused.migrated, 0);
  EXPECT_GT(fused.fused_train_share, 0.0);
  EXPECT_GT(fused.samples_per_s, sync.samples_per_s);
  EXPECT_EQ(sync.migrated, 0);
}

TEST(rl_sim, consolidation_targets_keep_the_fullest_agents_once_half_can_go) {
  using weft::gpu::rl::consolidation_targets;
  // 5 unfinished over 4 agents, 4 a GPU: 2 needed, 4 busy -> the two fullest stay.
  EXPECT_EQ(consolidation_targets(std::vector<int64_t>{1, 3, 0, 1, 0, 0}, 4).size(),
            0u);  // 5 fit on 2 of 3 busy agents: fewer than half freed, not yet
  EXPECT_EQ(consolidation_targets(std::vector<int64_t>{1, 3, 1, 2}, 4), (std::vector<int>{1, 3}));
  EXPECT_EQ(consolidation_targets(std::vector<int64_t>{2, 2, 2, 2}, 4), (std::vector<int>{0, 1}));
  EXPECT_TRUE(consolidation_targets(std::vector<int64_t>{0, 0}, 4).empty());
  EXPECT_TRUE(consolidation_targets(std::vector<int64_t>{4, 4}, 4).empty());
}

}  // namespace
