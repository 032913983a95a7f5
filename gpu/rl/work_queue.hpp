#pragma once
/// Runs the RL loop's slow calls to other programs on threads of their own, so that the loop goes
/// on generating meanwhile: an external reward — a process, an HTTP endpoint, reward workers on
/// other nodes (docs/rl.md, "Rewards from your own program") — and the KL reference on reference
/// workers ("KL reference workers"). A judge model or a code sandbox answers in seconds, a
/// reference worker in a forward pass; a loop that waits for each idles its rollout engine
/// meanwhile. Jobs start in the order they were submitted, each on one of the queue's `workers`
/// threads: up to that many at once (several copies of a reward program, several requests in
/// flight to an endpoint). Plain class, no CAF.
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

template <class T>
class work_queue {
 public:
  /// Computes one job's answer (runs on a worker thread).
  using job = std::function<result<T>()>;
  /// A finished job: its ticket, its answer or its error, and the seconds it took.
  struct done_job {
    uint64_t ticket = 0;
    result<T> value = T{};
    double seconds = 0.0;
  };

  /// `workers` threads (>= 1; fewer are raised to 1): jobs run at once.
  explicit work_queue(int workers = 1);
  /// stop(), then the worker threads are joined.
  ~work_queue();
  work_queue(const work_queue&) = delete;
  work_queue& operator=(const work_queue&) = delete;

  /// Queues `j` under `ticket` (the caller's, unique while pending). Refused after stop().
  status submit(uint64_t ticket, job j);
  /// Jobs finished since the last call, in the order they were done (submission order with one
  /// worker). With `wait`, blocks until at least one is done unless none is pending.
  std::vector<done_job> ready(bool wait);
  /// Submitted and not yet returned by ready().
  int64_t pending() const { return pending_; }
  /// Worker threads: jobs that may run at once.
  int workers() const { return static_cast<int>(workers_.size()); }
  /// Waits for the jobs running, drops the queued ones (their tickets never come back) and
  /// refuses later submissions. Call it before anything a queued job uses is destroyed.
  void stop();

 private:
  void run();

  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<std::pair<uint64_t, job>> queue_;
  std::deque<done_job> done_;
  bool stopping_ = false;
  int busy_ = 0;         ///< Jobs running.
  int64_t pending_ = 0;  ///< The loop thread's count (submit - ready), no lock needed.
  std::vector<std::thread> workers_;
};

/// Rewards: one per sample of a batch.
using reward_queue = work_queue<std::vector<double>>;
/// KL reference log-probs: one list per batch, one f32 per target.
using reference_queue = work_queue<std::vector<std::vector<float>>>;

extern template class work_queue<std::vector<double>>;
extern template class work_queue<std::vector<std::vector<float>>>;

}  // namespace weft::gpu::rl
