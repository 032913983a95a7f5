#pragma once
/// Agentic rollouts on one rollout engine (docs/rl.md, "Trajectory-level scheduling"): GRPO
/// trajectories that alternate generation turns and tool calls, the engine running at most
/// max_running sequences a decode step and ranking its live requests with weft's own policy
/// classes — gpu::fcfs_policy (step-centric: every continuation after a tool call queues behind
/// whatever arrived meanwhile) or gpu::priority_policy with `weft rl --trajectory-priority`'s
/// priorities (gpu::rl::trajectory_priority_of over the real gpu::rl::length_ranker) — and a
/// step-time model in place of forward passes. Answers "how much does Heddle's trajectory-level
/// scheduling buy at this queueing and this skew" with the code `weft rl` runs.
///
/// Each step's trajectories start together and the step ends with its last one (the rollout phase
/// of `--mode sync`); training is not modelled. A trajectory's turns and tokens per turn scale
/// with its prompt (lognormal across prompts, narrower within a group), its prompt's token count
/// carries part of that scale (the ranker's feature), prompts repeat after dataset_prompts (its
/// per-prompt history), and each tool call takes an exponential time. Plain C++: no CAF, no
/// device.

#include <cstdint>

namespace weft::bench::sim {

struct agentic_sim_config {
  int64_t prompts_per_step = 32;
  int64_t group_size = 8;
  int64_t steps = 8;
  int64_t max_running = 64;  ///< Sequences the engine decodes at once; the rest queue.
  /// One decode step: base_ms + per_seq_ms × running sequences.
  double step_base_ms = 10.0;
  double step_per_seq_ms = 0.15;
  /// Turns of a trajectory (tool calls + 1): lognormal around mean_turns, spread prompt_sigma
  /// across prompts and sample_sigma within a group, at most max_turns.
  double mean_turns = 3.0;
  int64_t max_turns = 16;
  double prompt_sigma = 0.7;
  double sample_sigma = 0.3;
  /// Tokens a turn generates: lognormal around mean_turn_tokens (spread turn_sigma).
  double mean_turn_tokens = 150.0;
  double turn_sigma = 0.5;
  double tool_mean_s = 2.0;      ///< Mean of each call's exponential latency.
  int64_t dataset_prompts = 64;  ///< Prompts repeat after this many (epochs).
  uint64_t seed = 1;
};

struct agentic_sim_result {
  double seconds = 0.0;  ///< Rollout time of all steps.
  int64_t trajectories = 0;
  double samples_per_s = 0.0;
  double mean_step_s = 0.0;
  double mean_queued_s = 0.0;  ///< Per trajectory: time live in the engine but not decoding.
  double mean_batch = 0.0;     ///< Sequences per decode step.
  int64_t preemptions = 0;     ///< A sequence that decoded left out of the next step, still live.
  int64_t turns = 0;
};

/// One run, first come first served (`trajectory_priority` false) or with weft rl's trajectory
/// priorities. Deterministic; both see the same trajectories, turn lengths and tool latencies.
agentic_sim_result simulate_agentic(const agentic_sim_config& config, bool trajectory_priority);

/// Turns of sample j of group g of step m, and the tokens of its turn t.
int64_t agentic_turns(const agentic_sim_config& c, int64_t step, int64_t group, int64_t j);
int64_t agentic_turn_tokens(const agentic_sim_config& c, int64_t step, int64_t group, int64_t j,
                            int64_t turn);

}  // namespace weft::bench::sim
