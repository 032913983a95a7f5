// The scheduling simulator against hand-computed timelines (1 ms per pass, no other cost).
#include <gtest/gtest.h>

#include "actors/serve/mlfq_policy.hpp"
#include "bench/sim/sched/sched_sim.hpp"

namespace weft::bench::sim {
namespace {

#define EXPECT_NEAR_MS(a, b) EXPECT_NEAR(a, b, 1e-12)

sim_engine_config unit_steps(int64_t slots, int64_t batch_tokens = 512) {
  sim_engine_config c;
  c.max_running = slots;
  c.max_batch_tokens = batch_tokens;
  c.model = step_model{
      .base_ms = 1.0, .per_seq_ms = 0.0, .per_prefill_token_ms = 0.0, .overhead_ms = 0.0};
  return c;
}

TEST(sched_sim, fcfs_one_slot_serves_in_arrival_order) {
  gpu::fcfs_policy fcfs;
  const auto run = simulate({{0.0, 4, 3}, {0.0, 4, 3}}, fcfs, unit_steps(1));
  ASSERT_EQ(run.outcomes.size(), 2u);
  // Passes 1-3 serve the first request (prefill + first token, then two decodes), 4-6 the second.
  EXPECT_NEAR_MS(run.outcomes[0].ttft_s, 0.001);
  EXPECT_NEAR_MS(run.outcomes[0].e2e_s, 0.003);
  EXPECT_NEAR_MS(run.outcomes[1].ttft_s, 0.004);
  EXPECT_NEAR_MS(run.outcomes[1].e2e_s, 0.006);
  EXPECT_EQ(run.steps, 6);
  EXPECT_NEAR_MS(run.busy_s, 0.006);
}

TEST(sched_sim, two_slots_run_together) {
  gpu::fcfs_policy fcfs;
  const auto run = simulate({{0.0, 4, 3}, {0.0, 4, 3}}, fcfs, unit_steps(2));
  EXPECT_NEAR_MS(run.outcomes[0].e2e_s, 0.003);
  EXPECT_NEAR_MS(run.outcomes[1].e2e_s, 0.003);
  EXPECT_EQ(run.steps, 3);
}

TEST(sched_sim, chunked_prefill_obeys_the_token_budget) {
  gpu::fcfs_policy fcfs;
  // 10 prompt tokens in passes of at most 4: 4, 4, 2 (the token comes with the last chunk).
  const auto run = simulate({{0.0, 10, 1}}, fcfs, unit_steps(1, 4));
  EXPECT_NEAR_MS(run.outcomes[0].ttft_s, 0.003);
  EXPECT_NEAR_MS(run.outcomes[0].e2e_s, 0.003);
}

TEST(sched_sim, passes_without_decodes_take_the_idle_budget) {
  gpu::fcfs_policy fcfs;
  // Budget 4, idle 8, two slots, two 10-token prompts at once. Pass 1 (no decodes): request 0
  // takes all 8. Pass 2 (still none): request 0 its last 2 and its one token, request 1 6.
  auto c = unit_steps(2, 4);
  c.idle_batch_tokens = 8;
  const auto run = simulate({{0.0, 10, 1}, {0.0, 10, 1}}, fcfs, c);
  EXPECT_NEAR_MS(run.outcomes[0].ttft_s, 0.002);
  // Pass 3 (request 0 done after one token, so no decodes): request 1's last 4 and its token.
  EXPECT_NEAR_MS(run.outcomes[1].ttft_s, 0.003);
}

TEST(sched_sim, idle_engine_waits_for_the_next_arrival) {
  gpu::fcfs_policy fcfs;
  const auto run = simulate({{0.0, 1, 1}, {0.1, 1, 2}}, fcfs, unit_steps(1));
  EXPECT_NEAR(run.outcomes[1].ttft_s, 0.001, 1e-12);
  EXPECT_NEAR(run.outcomes[1].e2e_s, 0.002, 1e-12);
  EXPECT_NEAR(run.makespan_s, 0.102, 1e-12);
  EXPECT_NEAR(run.busy_s, 0.003, 1e-12);
}

TEST(sched_sim, step_model_charges_sampling_sequences_and_prompt_tokens) {
  gpu::fcfs_policy fcfs;
  sim_engine_config c = unit_steps(2);
  c.model.per_seq_ms = 0.5;
  c.model.per_prefill_token_ms = 0.25;
  c.model.overhead_ms = 10.0;
  // Pass 1: two prompts of 4 tokens, both sample: 1 + 2 x 0.5 + 8 x 0.25 = 4 ms. Pass 2: two
  // decodes: 2 ms.
  const auto run = simulate({{0.0, 4, 2}, {0.0, 4, 2}}, fcfs, c);
  EXPECT_NEAR_MS(run.outcomes[0].ttft_s, 0.004 + 0.010);
  EXPECT_NEAR_MS(run.outcomes[0].e2e_s, 0.006 + 0.010);
}

TEST(sched_sim, mlfq_lets_a_short_job_pass_a_long_one) {
  // One slot. A 20-token job starts at 0; a 2-token job arrives at 4.5 ms. FCFS makes it wait for
  // the long job (done at 20 ms): E2E 22 - 4.5 = 17.5 ms. Under MLFQ the long job has left queue
  // 0 after 4 iterations, so the newcomer (queue 0) runs in the next pass (5-7 ms): E2E 2.5 ms,
  // and the long job, preempted once, ends at 22 ms.
  const std::vector<sim_request> reqs = {{0.0, 4, 20}, {0.0045, 4, 2}};
  gpu::fcfs_policy fcfs;
  const auto f = simulate(reqs, fcfs, unit_steps(1));
  EXPECT_NEAR(f.outcomes[1].e2e_s, 0.0175, 1e-12);
  EXPECT_EQ(f.outcomes[0].preemptions, 0);

  serve::mlfq_config mc;
  mc.prefill_cost_per_token = 0.4;
  auto mlfq = serve::mlfq_policy::create(mc);
  ASSERT_TRUE(mlfq.ok());
  const auto m = simulate(reqs, **mlfq, unit_steps(1));
  EXPECT_NEAR(m.outcomes[1].e2e_s, 0.0025, 1e-12);
  EXPECT_NEAR(m.outcomes[0].e2e_s, 0.022, 1e-12);
  EXPECT_EQ(m.outcomes[0].preemptions, 1);
  // Finished requests are forgotten by the policy.
  EXPECT_EQ((*mlfq)->level_of(0), -1);
  EXPECT_EQ((*mlfq)->level_of(1), -1);
}

TEST(sched_sim, srpt_oracle_runs_the_shortest_remaining_job_first) {
  // One slot, three jobs at 0 with 5, 1 and 3 tokens to generate: SRPT serves 1 (pass 1), then 3
  // (passes 2-4), then 5 (passes 5-9); FCFS would end them at 5, 6 and 9 ms.
  const std::vector<sim_request> reqs = {{0.0, 1, 5}, {0.0, 1, 1}, {0.0, 1, 3}};
  srpt_oracle srpt{reqs};
  const auto run = simulate(reqs, srpt, unit_steps(1));
  EXPECT_NEAR_MS(run.outcomes[1].e2e_s, 0.001);
  EXPECT_NEAR_MS(run.outcomes[2].e2e_s, 0.004);
  EXPECT_NEAR_MS(run.outcomes[0].e2e_s, 0.009);
  // A newcomer shorter than what is left of the running job preempts it.
  const std::vector<sim_request> late = {{0.0, 1, 10}, {0.0025, 1, 2}};
  srpt_oracle srpt2{late};
  const auto r2 = simulate(late, srpt2, unit_steps(1));
  EXPECT_NEAR_MS(r2.outcomes[1].e2e_s, 0.0025);  // arrives during pass 3, runs passes 4-5
  EXPECT_NEAR_MS(r2.outcomes[0].e2e_s, 0.012);
  EXPECT_EQ(r2.outcomes[0].preemptions, 1);
}

TEST(sched_sim, las_serves_the_least_served_job_first) {
  // One slot, a 3-token job at 0 and a 2-token job at 1.5 ms. After pass 2 (t = 2 ms) the first
  // has 2 tokens, the newcomer 0: the newcomer runs passes 3-4 (E2E 4 - 1.5 = 2.5 ms), then the
  // first ends in pass 5.
  const std::vector<sim_request> reqs = {{0.0, 1, 3}, {0.0015, 1, 2}};
  las_policy las;
  const auto run = simulate(reqs, las, unit_steps(1));
  EXPECT_NEAR_MS(run.outcomes[1].e2e_s, 0.0025);
  EXPECT_NEAR_MS(run.outcomes[0].e2e_s, 0.005);
  EXPECT_EQ(run.outcomes[0].preemptions, 1);
}

}  // namespace
}  // namespace weft::bench::sim
