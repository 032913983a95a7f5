#include "gpu/cpu/thread_pool.hpp"

#include <algorithm>

#include "gpu/cpu/thread_class.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include "gpu/cpu/simd.hpp"
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

thread_pool::thread_pool(int n_threads, int active)
    : n_threads_(std::max(1, n_threads)),
      active_(active <= 0 ? n_threads_ : std::clamp(active, 1, n_threads_)) {
  requested_.store(active_);
  active_for_workers_.store(active_);
  workers_.reserve(n_threads_ - 1);
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

thread_pool::~thread_pool() {
  {
    std::lock_guard lock{mutex_};
    stop_.store(true);
    job_word_.fetch_add(uint64_t{1} << 16);
  }
  cv_.notify_all();
  inactive_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void thread_pool::run(job_fn fn, void* ctx) {
  enter_compute_class();  // the owner of a forward pass is a compute thread
  const int want = std::clamp(requested_.load(std::memory_order_relaxed), 1, n_threads_);
  if (want != active_) {
    {
      std::lock_guard lock{mutex_};
      if (want > active_) reactivated_at_ = job_word_.load() >> 16;
      active_ = want;
      active_for_workers_.store(want);
    }
    inactive_cv_.notify_all();
    cv_.notify_all();  // threads no longer wanted leave their idle wait for the inactive one
  }
  if (active_ == 1) {
    fn(ctx, 0, 1);
    return;
  }
  fn_ = fn;
  ctx_ = ctx;
  pending_.store(active_ - 1, std::memory_order_relaxed);
  {
    // The lock orders the publication against a worker about to block on the condition variable.
    std::lock_guard lock{mutex_};
    const uint64_t gen = (job_word_.load(std::memory_order_relaxed) >> 16) + 1;
    job_word_.store(gen << 16 | static_cast<uint64_t>(active_), std::memory_order_release);
  }
  cv_.notify_all();
  fn(ctx, 0, active_);
  int spins = 0;
  while (pending_.load(std::memory_order_acquire) != 0) {
    if (++spins < spin_pause_iterations) {
      WEFT_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
}

bool thread_pool::wait_until_active(int index, uint64_t& seen) {
  std::unique_lock lock{mutex_};
  inactive_cv_.wait(lock, [&] { return stop_.load() || active_for_workers_.load() > index; });
  if (stop_.load()) return false;
  // Re-activated for the job after reactivated_at_: take part from that one on.
  seen = reactivated_at_;
  return true;
}

void thread_pool::worker_loop(int index) {
  enter_compute_class();
  uint64_t seen = 0;  // the generation at construction: a job published before this thread first
                      // runs is still this thread's to do
  for (;;) {
    int spins = 0;
    int yields = 0;
    uint64_t word;
    while (((word = job_word_.load(std::memory_order_acquire)) >> 16) == seen) {
      if (stop_.load()) return;
      if (active_for_workers_.load(std::memory_order_relaxed) <= index) {
        // Not wanted: block, never spin on the cores the active threads use.
        if (!wait_until_active(index, seen)) return;
        continue;
      }
      if (++spins < spin_pause_iterations) {
        WEFT_CPU_RELAX();
        continue;
      }
      if (spinning_.load(std::memory_order_relaxed) > 0 || ++yields < idle_yield_iterations) {
        std::this_thread::yield();
        continue;
      }
      std::unique_lock lock{mutex_};
      cv_.wait(lock, [&] {
        return (job_word_.load(std::memory_order_acquire) >> 16) != seen ||
               active_for_workers_.load() <= index || stop_.load();
      });
    }
    seen = word >> 16;
    if (stop_.load()) return;
    if (index >= static_cast<int>(word & 0xffff)) continue;  // a job without this thread
    fn_(ctx_, index, static_cast<int>(word & 0xffff));
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace weft::gpu::cpu
