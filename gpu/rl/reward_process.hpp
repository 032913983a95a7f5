#pragma once
/// A user's reward function as an external process speaking JSON lines (docs/rl.md, "Rewards"): a
/// Python function is a reward. weft writes one request per line on the process's stdin,
///   {"id": 7, "prompt": "...", "completion": "...", "answer": "..."}
/// and reads one answer per request from its stdout, in any order,
///   {"id": 7, "reward": 0.5}
/// A process that exits or does not answer in time is killed, started again and sent the requests
/// it had not answered (a bounded number of times per batch); an answer that is not such a line —
/// not JSON, an unknown id, a reward that is not a finite number — fails the batch with an error
/// naming the sample, never a silent 0. The process runs as a json_lines_process. Plain class, no
/// CAF.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "gpu/rl/json_lines_process.hpp"
#include "gpu/status.hpp"

namespace weft::gpu::rl {

struct reward_request {
  std::string prompt;
  std::string completion;
  std::string answer;
};

struct reward_process_config {
  /// The command, run with /bin/sh -c (so "python3 my_reward.py --strict" works).
  std::string command;
  /// A batch's answers must all arrive within this many seconds of the (re)start of its requests.
  double timeout_s = 60.0;
  /// Restarts allowed per batch before the batch fails.
  int max_restarts = 3;
};

class reward_process {
 public:
  explicit reward_process(reward_process_config config);

  /// The rewards of `items`, in order (ids are the items' indices).
  result<std::vector<double>> score(std::span<const reward_request> items);

  /// Times the process was (re)started since construction.
  int64_t starts() const { return proc_.starts(); }
  /// Restarts forced by a crash or a timeout since construction.
  int64_t restarts() const { return proc_.restarts(); }

 private:
  json_lines_process proc_;
};

/// Several copies of one reward program (`weft rl --reward-procs N`): score() may be called from
/// up to N threads at once, each call served by a copy no other call is using (it waits for one
/// when all are busy). Each copy is a reward_process, restarted on its own. Thread-safe.
class reward_process_pool {
 public:
  /// `processes` >= 1 copies (fewer are raised to 1), each started on its first batch.
  reward_process_pool(const reward_process_config& config, int processes);
  /// The rewards of `items`, in order, from a free copy.
  result<std::vector<double>> score(std::span<const reward_request> items);
  /// The rewards of `items`, in order, spread over the copies free now (at least one, waited
  /// for; at most one per item): contiguous slices scored at once, each on a thread. For a caller
  /// with one batch at a time — a reward worker's part (`--reward-workers` with `--reward-procs`).
  /// A slice's error names its samples' place in `items`.
  result<std::vector<double>> score_split(std::span<const reward_request> items);
  int size() const { return static_cast<int>(procs_.size()); }
  /// Restarts of the copies (a crash or a hang) since construction (any thread).
  int64_t restarts() const;

 private:
  std::vector<std::unique_ptr<reward_process>> procs_;
  std::mutex mu_;
  std::condition_variable freed_;
  /// Indices into procs_ of the copies not scoring, the longest idle first: batches go round
  /// the copies (each stays warm, and a copy that died idle is restarted on its next turn).
  std::deque<size_t> free_;
};

}  // namespace weft::gpu::rl
