#pragma once
/// A cluster-scale simulator of GRPO rollouts and training (docs/rl.md, "At cluster scale"): the
/// real rl::rollout_scheduler (staleness bound, exactly-once) and the real dispatch classes
/// (rl::length_ranker, rl::place_longest_first) over 64–1024 simulated GPUs, with a step-time
/// model in place of forward passes. It answers "how much does async / length-aware dispatch buy
/// over sync at this scale and this length skew" with the same policy code `weft rl` runs.
///
/// Modes:
///  - sync (colocated, the baseline everyone runs — verl, OpenRLHF): every GPU generates the
///    step's samples, then every GPU trains, then the weights sync; the next step starts after.
///  - async K (disaggregated, StreamRL): rollout GPUs generate continuously, steps up to K versions
///    ahead; trainer GPUs train each step as soon as its samples are in; round-robin placement.
///  - async K + length-aware: as above, with the output-length ranker placing predicted-long
///    samples first onto the least-loaded agents (LPT) and starting them first.
///  - sync + fusion (colocated, RLHFuse's inter-stage fusion): as sync, but once the step's
///    unfinished samples fit on half of the GPUs that hold them (rl::consolidation_targets), they
///    move there (the receiving GPU replays each one's tokens so far: prefill_ms_per_token) and the
///    freed GPUs start training the step's finished samples while the tail generates.
///
/// Not modelled: prefill (prompts are short next to the outputs here), KV capacity (an agent runs
/// at most max_running sequences and queues the rest), the agents' pause while weights load
/// (overlapped, as StreamRL does), stragglers and failures. Plain C++: no CAF, no device.

#include <cstdint>
#include <string>
#include <vector>

namespace weft::bench::sim {

struct rl_sim_config {
  int64_t gpus = 64;
  /// async modes: the share of the GPUs that train (the rest generate); ≤ 0: the best of
  /// 1/8, 2/8, .. 6/8 (the split a user tunes, as StreamRL's resource planner does).
  double train_fraction = 0.0;
  int64_t prompts_per_step = 512;
  int64_t group_size = 8;
  int64_t steps = 10;
  int64_t max_running = 64;  ///< Sequences one rollout agent (one GPU) decodes at once.
  /// One decode step of an agent: base_ms + per_seq_ms × running sequences.
  double step_base_ms = 10.0;
  double step_per_seq_ms = 0.15;
  /// Training: ms per trained token per GPU (forward + backward + optimizer share), plus the
  /// weight sync after every update.
  double train_ms_per_token = 0.4;
  double sync_s = 2.0;
  /// sync + fusion: replaying a moved sample's tokens so far on its new GPU (prefill, ms/token).
  double prefill_ms_per_token = 0.02;
  /// sync + fusion: the most sequences a GPU takes from the tail. A decode step stays close to its
  /// fixed cost while the batch is small (16: +24 % here); packing the tail denser would slow every
  /// tail sample, and the tail is the step's critical path.
  int64_t fusion_max_batch = 16;
  /// Output lengths: each prompt has a scale drawn lognormal around mean_len (prompt_sigma); its
  /// samples are lognormal around that (sample_sigma), capped at max_len. Prompts' token counts
  /// grow with their scale (longer problems, longer answers: the ranker's prompt feature).
  double mean_len = 1000.0;
  double prompt_sigma = 0.8;
  double sample_sigma = 0.5;
  int64_t max_len = 8192;
  int64_t dataset_prompts = 512;  ///< Prompts repeat after this many (epochs).
  uint64_t seed = 1;
};

enum class rl_sim_mode { sync_colocated, async_round_robin, async_length_aware, sync_fused };
const char* rl_sim_mode_name(rl_sim_mode m);

struct rl_sim_result {
  rl_sim_mode mode = rl_sim_mode::sync_colocated;
  int64_t max_staleness = 0;
  double seconds = 0.0;
  int64_t samples = 0;
  double samples_per_s = 0.0;
  double rollout_busy = 0.0;    ///< Mean over rollout GPUs of the time they had a sequence running.
  double trainer_busy = 0.0;    ///< Time the trainer GPUs trained or synced / run time.
  double mean_batch = 0.0;      ///< Mean sequences per decode step.
  double train_fraction = 1.0;  ///< Share of the GPUs that trained (sync: all of them, in turn).
  int64_t migrated = 0;         ///< sync + fusion: samples moved onto fewer GPUs.
  double fused_train_share = 0.0;  ///< sync + fusion: share of the tokens trained during the tail.
  std::vector<int64_t> staleness_histogram;
  std::string error;  ///< Non-empty when the scheduler refused something (a bug).
};

/// One simulated run. Deterministic: the same config gives the same result; every mode sees the
/// same prompts and the same output length for each sample.
rl_sim_result simulate_rl(const rl_sim_config& config, rl_sim_mode mode, int64_t max_staleness);

/// A uniform in (0, 1) and a standard normal (Box–Muller) drawn from a hash of the arguments:
/// every simulated quantity is a pure function of its coordinates.
double sim_uniform(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0);
double sim_normal(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0);

/// The output length of sample j of group g of step m, and the prompt's token count.
int64_t sim_output_length(const rl_sim_config& c, int64_t step, int64_t group, int64_t j);
int64_t sim_prompt_tokens(const rl_sim_config& c, int64_t prompt);

}  // namespace weft::bench::sim
