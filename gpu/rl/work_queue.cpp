#include "gpu/rl/work_queue.hpp"

#include <algorithm>
#include <chrono>
#include <utility>

namespace weft::gpu::rl {

template <class T>
work_queue<T>::work_queue(int workers) {
  workers_.reserve(static_cast<size_t>(std::max(1, workers)));
  for (int i = 0; i < std::max(1, workers); ++i) workers_.emplace_back([this] { run(); });
}

template <class T>
work_queue<T>::~work_queue() {
  stop();
  for (auto& w : workers_) w.join();
}

template <class T>
status work_queue<T>::submit(uint64_t ticket, job j) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return {status_code::internal, "the work queue is stopped"};
    queue_.emplace_back(ticket, std::move(j));
  }
  ++pending_;
  work_cv_.notify_one();
  return {};
}

template <class T>
std::vector<typename work_queue<T>::done_job> work_queue<T>::ready(bool wait) {
  std::unique_lock lock(mu_);
  if (wait && pending_ > 0) done_cv_.wait(lock, [this] { return !done_.empty() || stopping_; });
  std::vector<done_job> out;
  out.reserve(done_.size());
  for (auto& s : done_) out.push_back(std::move(s));
  done_.clear();
  pending_ -= static_cast<int64_t>(out.size());
  return out;
}

template <class T>
void work_queue<T>::stop() {
  std::unique_lock lock(mu_);
  stopping_ = true;
  pending_ -= static_cast<int64_t>(queue_.size());
  queue_.clear();
  work_cv_.notify_all();
  done_cv_.wait(lock, [this] { return busy_ == 0; });
}

template <class T>
void work_queue<T>::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    work_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping
    auto [ticket, j] = std::move(queue_.front());
    queue_.pop_front();
    ++busy_;
    lock.unlock();
    const auto t0 = std::chrono::steady_clock::now();
    auto value = j();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    j = nullptr;  // what the job holds is released on this thread, before it counts as done
    lock.lock();
    --busy_;
    done_.push_back(done_job{ticket, std::move(value), seconds});
    done_cv_.notify_all();
  }
}

template class work_queue<std::vector<double>>;
template class work_queue<std::vector<std::vector<float>>>;

}  // namespace weft::gpu::rl
