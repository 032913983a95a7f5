#include "apps/loadgen/runner.hpp"

#include <spdlog/spdlog.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace weft::apps::loadgen {

namespace {

// Worker threads created on demand, at most `max_threads`; a task is accepted only while fewer than
// `max_threads` tasks are outstanding, so an accepted task always has a thread to run it at once.
class worker_pool {
 public:
  explicit worker_pool(size_t max_threads) : max_threads_{max_threads} {}

  ~worker_pool() {
    {
      std::lock_guard lock{mutex_};
      stopping_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  worker_pool(const worker_pool&) = delete;
  worker_pool& operator=(const worker_pool&) = delete;

  // False when max_threads tasks are outstanding.
  bool try_submit(std::function<void()> task) {
    {
      std::lock_guard lock{mutex_};
      if (outstanding_ >= max_threads_) return false;
      ++outstanding_;
      queue_.push_back(std::move(task));
      if (idle_ < queue_.size() && threads_.size() < max_threads_)
        threads_.emplace_back([this] { loop(); });
    }
    cv_.notify_one();
    return true;
  }

  size_t outstanding() {
    std::lock_guard lock{mutex_};
    return outstanding_;
  }

  // Waits until no task is outstanding, up to `timeout`; true when idle.
  bool wait_idle_for(std::chrono::duration<double> timeout) {
    std::unique_lock lock{mutex_};
    return done_cv_.wait_for(lock, timeout, [this] { return outstanding_ == 0; });
  }

 private:
  void loop() {
    std::unique_lock lock{mutex_};
    for (;;) {
      ++idle_;
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      --idle_;
      if (queue_.empty()) return;  // stopping
      auto task = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      task();
      lock.lock();
      --outstanding_;
      if (outstanding_ == 0) done_cv_.notify_all();
    }
  }

  const size_t max_threads_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::condition_variable done_cv_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::thread> threads_;
  size_t outstanding_ = 0;
  size_t idle_ = 0;
  bool stopping_ = false;
};

}  // namespace

std::vector<request_record> run_open_loop(const run_config& config,
                                          const std::vector<request_spec>& requests) {
  std::vector<request_record> records(requests.size());
  std::atomic<size_t> n_done{0};
  std::atomic<size_t> n_failed{0};
  size_t n_overload = 0;
  const auto start = steady_clock::now();
  auto next_progress = start + std::chrono::duration_cast<steady_clock::duration>(
                                   std::chrono::duration<double>(config.progress_interval_s));
  worker_pool pool{std::max<size_t>(1, config.max_in_flight)};

  const auto progress = [&](size_t n_sent) {
    if (config.progress_interval_s <= 0 || steady_clock::now() < next_progress) return;
    next_progress += std::chrono::duration_cast<steady_clock::duration>(
        std::chrono::duration<double>(config.progress_interval_s));
    spdlog::info("{}: {:.1f} s, sent {}/{}, done {}, in flight {}, failed {}, client overload {}",
                 config.progress_label,
                 std::chrono::duration<double>(steady_clock::now() - start).count(), n_sent,
                 requests.size(), n_done.load(), pool.outstanding(), n_failed.load(), n_overload);
  };

  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& spec = requests[i];
    const auto due = start + std::chrono::duration_cast<steady_clock::duration>(
                                 std::chrono::duration<double>(spec.send_time_s));
    // Sleep in slices so progress lines keep coming during long gaps.
    for (auto now = steady_clock::now(); now < due; now = steady_clock::now()) {
      progress(i);
      std::this_thread::sleep_until(std::min(due, now + std::chrono::milliseconds(500)));
    }
    const bool accepted = pool.try_submit([&, i] {
      records[i] = send_request(config.client, requests[i], start);
      if (!records[i].ok()) n_failed.fetch_add(1);
      n_done.fetch_add(1);
    });
    if (!accepted) {
      auto& r = records[i];
      r.index = spec.index;
      r.scheduled_s = spec.send_time_s;
      r.sent_s = std::chrono::duration<double>(steady_clock::now() - start).count();
      r.prompt_tokens_target = spec.prompt_tokens_target;
      r.max_tokens = spec.max_tokens;
      r.status = request_status::client_overload;
      r.error = "not sent: " + std::to_string(config.max_in_flight) +
                " requests already in flight (--max-in-flight)";
      if (n_overload++ == 0) {
        spdlog::warn(
            "{}: client-side overload: {} requests in flight at the send time of request {}; such "
            "requests "
            "are recorded as failed, not delayed (raise --max-in-flight or lower the rate)",
            config.progress_label, config.max_in_flight, i);
      }
      n_done.fetch_add(1);
    }
    progress(i + 1);
  }
  while (!pool.wait_idle_for(std::chrono::milliseconds(200))) progress(requests.size());
  if (n_overload > 0)
    spdlog::warn("{}: {} requests not sent (client overload)", config.progress_label, n_overload);
  return records;
}

}  // namespace weft::apps::loadgen
