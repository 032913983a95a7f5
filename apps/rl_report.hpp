#pragma once
// What `weft rl` shows while it runs: the progress line per step and per evaluation, the metrics
// JSON lines (rewound to the checkpoint on --resume, so no step appears twice) and the Prometheus
// text for --metrics-port.

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "gpu/rl/grpo_loop.hpp"

namespace weft::apps {

class rl_reporter {
 public:
  /// Writes `metrics_path`; `resume_step` > 0 keeps the file's lines of steps up to it and drops
  /// the rest (a resumed run continues the curve), 0 starts it afresh.
  rl_reporter(std::filesystem::path metrics_path, int64_t total_steps, int64_t resume_step);

  void report(const gpu::rl::rl_step_record& r, double step_seconds);
  void report_eval(const gpu::rl::rl_eval_record& e);
  void add_checkpoint();

  std::string prometheus() const;
  const std::filesystem::path& path() const { return path_; }
  int64_t samples_since_start() const { return samples_; }
  double seconds_since_start() const { return seconds_; }

 private:
  std::filesystem::path path_;
  int64_t total_;
  std::ofstream out_;
  mutable std::mutex mu_;
  gpu::rl::rl_step_record last_;
  int64_t agents_lost_ = 0;             ///< reported so far
  int64_t reward_workers_lost_ = 0;     ///< reported so far
  int64_t reference_workers_lost_ = 0;  ///< reported so far
  gpu::rl::rl_eval_record last_eval_;
  bool has_eval_ = false;
  int64_t samples_ = 0, steps_ = 0, checkpoints_ = 0, tokens_ = 0;
  double seconds_ = 0.0, rollout_s_ = 0.0, train_s_ = 0.0, sync_s_ = 0.0, ref_s_ = 0.0;
  double reduce_s_ = 0.0, reward_s_ = 0.0, reward_wait_s_ = 0.0, ref_wait_s_ = 0.0;
  int64_t tool_calls_ = 0;
  int64_t tool_restarts_ = 0;
  int64_t reward_restarts_ = 0;  ///< reported so far
  int64_t trainer_groups_ = 0;
};

}  // namespace weft::apps
