#pragma once
/// Which rollouts may run while the trainer works, and the bookkeeping that proves every sample is
/// trained exactly once and never with weights older than the staleness bound (docs/rl.md,
/// "Modes"). Step m's samples are trained by the update that turns weight version m into m + 1;
/// they may start generating once the trainer has published version m − K (K = max_staleness):
/// K = 0 is `--mode sync` (generate, train, sync, repeat), K ≥ 1 is `--mode async` (the rollouts
/// of steps m + 1 .. m + K overlap the training of step m). Plain class, no CAF and no engine:
/// the GRPO loop drives it with a real engine, the property tests with random timings and the
/// cluster simulator (bench/sim) with simulated ones.

#include <cstdint>
#include <map>
#include <vector>

#include "gpu/status.hpp"

namespace weft::gpu::rl {

/// A sample's place: its step, its prompt's group within the step, its index within the group.
struct sample_key {
  int64_t step = 0;
  int64_t group = 0;
  int64_t index = 0;
};

struct scheduler_config {
  int64_t prompts_per_step = 4;
  int64_t group_size = 8;
  int64_t max_staleness = 0;  ///< K: how many versions a trained sample may lag (0: sync).
  int64_t last_step = -1;     ///< Steps ≥ this are never started (−1: no end).
};

/// What train() hands back: the staleness (trainer version − oldest token version) of each sample
/// of the step, group after group.
struct trained_step {
  int64_t step = 0;
  std::vector<int64_t> staleness;
};

class rollout_scheduler {
 public:
  /// Starts with weights at `version` (steps before it are trained).
  explicit rollout_scheduler(const scheduler_config& config, int64_t version = 0);

  /// The steps whose samples may start now, each returned once, in order: every m < last_step
  /// with m ≤ version + K not returned before.
  std::vector<int64_t> admit();

  /// Sample `key` finished; its tokens were sampled with versions oldest..newest. An error (and
  /// nothing recorded) for a sample of a step not admitted or already trained, one finished
  /// before, or versions the sample cannot have (older than its admission, newer than now).
  status finish(const sample_key& key, int64_t oldest_version, int64_t newest_version);

  /// Whether every sample of step version() has finished.
  bool ready() const;

  /// The trainer consumes step version(): checks that every sample of it finished exactly once and
  /// none is older than K versions, then publishes version + 1. An error when not ready() or a
  /// bound is broken (the step is then not consumed).
  result<trained_step> train();

  int64_t version() const { return version_; }
  /// Samples admitted and not yet finished.
  int64_t in_flight() const { return in_flight_; }
  /// How many trained samples had each staleness (index = versions behind).
  const std::vector<int64_t>& staleness_histogram() const { return histogram_; }
  int64_t trained_samples() const { return trained_samples_; }
  const scheduler_config& config() const { return config_; }

 private:
  struct step_state {
    int64_t admitted_at = 0;      ///< Version when its samples could start.
    std::vector<int64_t> oldest;  ///< Per sample: oldest token version, −1 while running.
    int64_t finished = 0;
  };
  int64_t samples_per_step() const { return config_.prompts_per_step * config_.group_size; }

  scheduler_config config_;
  int64_t version_ = 0;
  int64_t next_admit_ = 0;
  int64_t in_flight_ = 0;
  int64_t trained_samples_ = 0;
  std::map<int64_t, step_state> steps_;
  std::vector<int64_t> histogram_;
};

}  // namespace weft::gpu::rl
