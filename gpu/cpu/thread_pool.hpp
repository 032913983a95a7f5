#pragma once
/// A small fork-join pool for the CPU backend that spins while a forward pass runs.
///
/// Waking a sleeping thread on another vCPU costs ~100 µs on the VMs weft runs on (STACK_NOTES),
/// and a forward pass of a small model runs hundreds of parallel ops per token. So workers spin
/// (bounded `pause` loop, then `yield`) between the ops of one pass and only block on a condition
/// variable when no pass is active (`spin_scope` not held).

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace weft::gpu::cpu {

/// Fork-join pool of `n_threads` threads, the calling thread included (index 0).
/// `run` must be called from one thread at a time (the owner of the pool); not reentrant.
class thread_pool {
 public:
  /// A job: called once per thread with (thread index, thread count).
  using job_fn = void (*)(void* ctx, int thread_index, int n_threads);

  /// `active` threads (0: all) take part in each job; the others block until request_active asks
  /// for them. Results must not depend on the count (jobs split rows, never reductions).
  explicit thread_pool(int n_threads, int active = 0);
  ~thread_pool();
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  int size() const { return n_threads_; }
  /// Threads that took part in the last job (the owner's view).
  int active() const { return active_; }
  /// Asks for `n` threads (clamped to [1, size()]) from the next job on. Thread-safe; the owner
  /// applies it in `run`.
  void request_active(int n) { requested_.store(n, std::memory_order_relaxed); }

  /// Runs `fn(ctx, i, n)` for i in [0, n) — i = 0 on the caller — and returns when all are done.
  void run(job_fn fn, void* ctx);

  /// Runs a callable `f(int thread_index, int n_threads)` on every thread.
  template <class F>
  void parallel(F&& f) {
    run([](void* c, int i, int n) { (*static_cast<F*>(c))(i, n); }, &f);
  }

  /// While alive, workers spin between jobs instead of sleeping (hold it for one forward pass).
  class spin_scope {
   public:
    explicit spin_scope(thread_pool& pool) : pool_(pool) { pool_.spinning_.fetch_add(1); }
    ~spin_scope() { pool_.spinning_.fetch_sub(1); }
    spin_scope(const spin_scope&) = delete;
    spin_scope& operator=(const spin_scope&) = delete;

   private:
    thread_pool& pool_;
  };

 private:
  void worker_loop(int index);
  /// Blocks an inactive worker until it is asked for again; false when the pool stops.
  bool wait_until_active(int index, uint64_t& seen);

  int n_threads_;
  int active_;                     ///< Threads of the current / last job (owner side).
  std::atomic<int> requested_{0};  ///< request_active's value, applied by run().
  std::atomic<int> active_for_workers_{0};
  uint64_t reactivated_at_ = 0;  ///< Generation before the job that re-activated threads (mutex_).
  std::vector<std::thread> workers_;
  /// The job's generation (high 48 bits) and thread count (low 16 bits): one load gives a worker
  /// both, consistently.
  std::atomic<uint64_t> job_word_{0};
  std::atomic<int> pending_{0};
  std::atomic<int> spinning_{0};
  std::atomic<bool> stop_{false};
  job_fn fn_ = nullptr;
  void* ctx_ = nullptr;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::condition_variable inactive_cv_;
};

/// Splits [0, n) into `parts` near-equal chunks; returns chunk `index` as [begin, end).
inline std::pair<int64_t, int64_t> split_range(int64_t n, int parts, int index) {
  const int64_t per = n / parts;
  const int64_t rem = n % parts;
  const int64_t begin = index * per + (index < rem ? index : rem);
  return {begin, begin + per + (index < rem ? 1 : 0)};
}

}  // namespace weft::gpu::cpu
