#pragma once
// What `weft train` shows while it runs, for one process or a trainer group alike: the progress
// line per step, the metrics JSON lines, Prometheus metrics on --metrics-port, the loss plot.

#include <httplib.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gpu/train/checkpoint.hpp"
#include "gpu/train/sft_trainer.hpp"

namespace weft::apps {

/// SIGTERM and SIGINT are remembered (not fatal): the training loop checkpoints and stops.
void catch_stop_signals();
/// The signal caught, 0 if none.
int stop_signal();

/// "3m07s", "1h02m".
std::string format_duration(double seconds);

/// Prometheus text of the run's state.
class train_metrics {
 public:
  void update(const gpu::train::step_record& r, double tokens_per_s);
  void add_checkpoint();
  void add_group_restart();
  void update_eval(const gpu::train::eval_record& e);
  std::string text() const;

 private:
  mutable std::mutex mu_;
  gpu::train::step_record last_;
  int64_t tokens_total_ = 0;
  int64_t checkpoints_ = 0;
  int64_t restarts_ = 0;
  gpu::train::eval_record eval_;
  bool has_eval_ = false;
  double tokens_per_s_ = 0.0;
};

/// --metrics-port: serves Prometheus text on 127.0.0.1 while it lives.
class metrics_server {
 public:
  explicit metrics_server(const train_metrics& prom) : text_([&prom] { return prom.text(); }) {}
  /// Serves whatever `text` returns (called from the server's thread).
  explicit metrics_server(std::function<std::string()> text) : text_(std::move(text)) {}
  ~metrics_server();
  metrics_server(const metrics_server&) = delete;
  metrics_server& operator=(const metrics_server&) = delete;
  /// Before start(): GET `path` answers the JSON `body` returns (called from the server's thread).
  void add_json(const std::string& path, std::function<std::string()> body);
  bool start(int port);

 private:
  std::function<std::string()> text_;
  std::vector<std::pair<std::string, std::function<std::string()>>> json_;
  httplib::Server http_;
  std::thread thread_;
};

/// The progress line on stderr, the metrics file and the Prometheus gauges, step by step. The
/// metrics file is the run's loss curve: the steps a resumed run starts from, then one line per
/// new step; after a trainer group restarts from an older checkpoint it is rewound to it, so a
/// step never appears twice.
class step_reporter {
 public:
  /// Truncates (creates) `metrics_path`.
  step_reporter(std::filesystem::path metrics_path, int64_t total_steps);

  /// The run starts (again) after step `first`, whose history is `before` (from a checkpoint).
  void start_at(int64_t first, const std::vector<gpu::train::step_record>& before);
  /// One finished step that took `seconds`; `reduce_seconds` >= 0 (a trainer group) is the part
  /// spent in the gradient all-reduce, shown and written as "allreduce_s".
  void report(const gpu::train::step_record& r, double seconds, double reduce_seconds = -1.0);
  /// A held-out evaluation (--eval-data): a log line, an `"kind": "eval"` line in the metrics
  /// file and the Prometheus gauges.
  void report_eval(const gpu::train::eval_record& e);

  train_metrics& prom() { return prom_; }
  const std::filesystem::path& path() const { return path_; }
  int64_t last_step() const { return records_.empty() ? 0 : records_.back().r.step; }
  int64_t first_step() const { return first_; }
  int64_t tokens_since_start() const { return tokens_since_start_; }
  double seconds_since_start() const;
  double last_loss() const { return records_.empty() ? 0.0 : records_.back().r.loss; }

 private:
  void rewrite();
  struct shown {
    gpu::train::step_record r;
    double tokens_per_s = 0.0;
    double reduce_seconds = -1.0;
  };
  void append(const shown& s);
  void append(const gpu::train::eval_record& e);
  std::vector<gpu::train::eval_record> evals_;  ///< this run's evaluations (kept on a rewind)

  std::filesystem::path path_;
  int64_t total_;
  std::ofstream out_;
  std::vector<shown> records_;
  train_metrics prom_;
  int64_t first_ = 0;
  int64_t tokens_since_start_ = 0;
  std::chrono::steady_clock::time_point t_start_ = std::chrono::steady_clock::now();
};

/// --metrics, defaulting to CHECKPOINT_DIR/metrics.jsonl, else ./train-metrics.jsonl.
std::filesystem::path metrics_path_of(const std::string& metrics, const std::string& ckpt_dir);

/// The records of a metrics file written by an earlier run (for a resumed trainer group); lines
/// that do not parse are skipped.
std::vector<gpu::train::step_record> read_metrics_file(const std::filesystem::path& path);

/// --plot: draws `metrics` to `png` with scripts/plot_train.py. False (logged) on failure.
bool plot_training(const std::filesystem::path& metrics, const std::string& png);

/// Runs scripts/`script` METRICS PNG (found beside the binary's tree, or at $WEFT_SCRIPTS/script).
/// False (logged) on failure.
bool run_plot_script(const std::string& script, const std::filesystem::path& metrics,
                     const std::string& png);

}  // namespace weft::apps
