// The agentic rollout simulator (bench/sim/rl/agentic_sim): deterministic, the same trajectories
// under both policies, order irrelevant when nothing queues, and the effect it exists to show —
// with a saturated engine and skewed trajectories, weft rl's trajectory priority shortens the
// rollout phase that first come, first served stretches.
#include <gtest/gtest.h>

#include "bench/sim/rl/agentic_sim.hpp"

namespace {

using namespace weft::bench::sim;

agentic_sim_config small() {
  agentic_sim_config c;
  c.prompts_per_step = 32;
  c.group_size = 8;
  c.steps = 4;
  c.max_running = 32;  // 256 trajectories: most of them queue
  c.tool_mean_s = 1.0;
  c.dataset_prompts = 64;  // prompts come back in step 2: the ranker learns them
  return c;
}

TEST(agentic_sim, runs_repeat_and_every_trajectory_finishes) {
  const auto c = small();
  for (bool prio : {false, true}) {
    const auto a = simulate_agentic(c, prio);
    const auto b = simulate_agentic(c, prio);
    EXPECT_EQ(a.seconds, b.seconds);
    EXPECT_EQ(a.preemptions, b.preemptions);
    EXPECT_EQ(a.trajectories, c.steps * c.prompts_per_step * c.group_size);
    EXPECT_GT(a.samples_per_s, 0.0);
    EXPECT_LE(a.mean_batch, static_cast<double>(c.max_running));
  }
  // Turns spread with the prompt: some trajectories call many tools, some none.
  int64_t lo = 1 << 30, hi = 0;
  for (int64_t g = 0; g < c.prompts_per_step; ++g) {
    for (int64_t j = 0; j < c.group_size; ++j) {
      lo = std::min(lo, agentic_turns(c, 0, g, j));
      hi = std::max(hi, agentic_turns(c, 0, g, j));
    }
  }
  EXPECT_EQ(lo, 1);
  EXPECT_GE(hi, 8);
}

TEST(agentic_sim, order_is_irrelevant_when_nothing_queues) {
  auto c = small();
  c.max_running = c.prompts_per_step * c.group_size;
  const auto fcfs = simulate_agentic(c, false);
  const auto prio = simulate_agentic(c, true);
  EXPECT_EQ(fcfs.seconds, prio.seconds);
  EXPECT_EQ(fcfs.mean_queued_s, 0.0);
  EXPECT_EQ(prio.preemptions, 0);
}

TEST(agentic_sim, trajectory_priority_shortens_a_saturated_skewed_rollout) {
  const auto c = small();
  const auto fcfs = simulate_agentic(c, false);
  const auto prio = simulate_agentic(c, true);
  EXPECT_GT(prio.samples_per_s, 1.08 * fcfs.samples_per_s)
      << fcfs.samples_per_s << " vs " << prio.samples_per_s;
  EXPECT_EQ(fcfs.preemptions, 0);  // FCFS never displaces an earlier request
  EXPECT_GT(prio.preemptions, 0);
}

}  // namespace
