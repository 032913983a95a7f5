#pragma once
/// Scores batches of samples on a thread of its own, so that the RL loop goes on generating (and
/// running the KL reference) while an external reward — a process, an HTTP endpoint, reward
/// workers on other nodes — takes its time (docs/rl.md, "Rewards from your own program"). A judge
/// model or a code sandbox answers in seconds; a loop that waits for every group's rewards idles
/// its rollout engine meanwhile. Batches start in the order they were submitted, each scored by
/// the job it was submitted with, on one of the queue's `workers` threads: up to that many at
/// once (several copies of a reward program, several requests in flight to an endpoint). Plain
/// class, no CAF.
///
/// Thread-safety: submit(), ready(), pending() and stop() are called from one thread (the loop's);
/// the jobs run on the queue's worker threads. With one worker they run one at a time, so a job
/// may use an object that must not be used from two threads at once (a reward process) as long as
/// nothing else uses it meanwhile; with more, what the jobs share must be thread-safe.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "gpu/status.hpp"

namespace weft::gpu::rl {

class reward_queue {
 public:
  /// Computes one batch's rewards (runs on the worker thread).
  using job = std::function<result<std::vector<double>>()>;
  /// A scored batch: its ticket, its rewards or the job's error, and the seconds the job took.
  struct scored {
    uint64_t ticket = 0;
    result<std::vector<double>> rewards = std::vector<double>{};
    double seconds = 0.0;
  };

  /// `workers` threads (>= 1; fewer are raised to 1): batches scored at once.
  explicit reward_queue(int workers = 1);
  /// stop(), then the worker threads are joined.
  ~reward_queue();
  reward_queue(const reward_queue&) = delete;
  reward_queue& operator=(const reward_queue&) = delete;

  /// Queues `j` under `ticket` (the caller's, unique while pending). Refused after stop().
  status submit(uint64_t ticket, job j);
  /// Batches scored since the last call, in the order they were done (submission order with one
  /// worker). With `wait`, blocks until at least one is scored unless none is pending.
  std::vector<scored> ready(bool wait);
  /// Submitted and not yet returned by ready().
  int64_t pending() const { return pending_; }
  /// Worker threads: batches that may be scored at once.
  int workers() const { return static_cast<int>(workers_.size()); }
  /// Waits for the batches being scored, drops the queued ones (their tickets never come back) and
  /// refuses later submissions. Call it before anything a queued job uses is destroyed.
  void stop();

 private:
  void run();

  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<std::pair<uint64_t, job>> queue_;
  std::deque<scored> done_;
  bool stopping_ = false;
  int busy_ = 0;         ///< Jobs running.
  int64_t pending_ = 0;  ///< The loop thread's count (submit - ready), no lock needed.
  std::vector<std::thread> workers_;
};

}  // namespace weft::gpu::rl
