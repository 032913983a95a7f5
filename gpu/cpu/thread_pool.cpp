#include "gpu/cpu/thread_pool.hpp"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define WEFT_CPU_RELAX() _mm_pause()
#else
#define WEFT_CPU_RELAX() std::atomic_signal_fence(std::memory_order_seq_cst)
#endif

namespace weft::gpu::cpu {

namespace {
// Tens of µs of `pause` before yielding (a pause is 10-140 cycles depending on the core): covers
// the gap between two ops of a forward pass without starving other processes for long.
constexpr int spin_pause_iterations = 2000;
// Outside a forward pass, how many yields before blocking on the condition variable.
constexpr int idle_yield_iterations = 64;
}  // namespace

thread_pool::thread_pool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  workers_.reserve(n_threads_ - 1);
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

thread_pool::~thread_pool() {
  {
    std::lock_guard lock{mutex_};
    stop_.store(true);
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void thread_pool::run(job_fn fn, void* ctx) {
  if (n_threads_ == 1) {
    fn(ctx, 0, 1);
    return;
  }
  fn_ = fn;
  ctx_ = ctx;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  {
    // The lock orders the publication against a worker about to block on the condition variable.
    std::lock_guard lock{mutex_};
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  fn(ctx, 0, n_threads_);
  int spins = 0;
  while (pending_.load(std::memory_order_acquire) != 0) {
    if (++spins < spin_pause_iterations) {
      WEFT_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
}

void thread_pool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    int spins = 0;
    int yields = 0;
    uint64_t gen;
    while ((gen = generation_.load(std::memory_order_acquire)) == seen) {
      if (++spins < spin_pause_iterations) {
        WEFT_CPU_RELAX();
        continue;
      }
      if (spinning_.load(std::memory_order_relaxed) > 0 || ++yields < idle_yield_iterations) {
        std::this_thread::yield();
        continue;
      }
      std::unique_lock lock{mutex_};
      cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
    }
    seen = gen;
    if (stop_.load()) return;
    fn_(ctx_, index, n_threads_);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace weft::gpu::cpu
