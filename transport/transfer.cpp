#include "transport/transfer.hpp"

namespace weft::transport {

bool transfer_state::finish(completion c) {
  bool expected = false;
  if (!claimed_.compare_exchange_strong(expected, true, std::memory_order_acq_rel)) return false;
  result_ = std::move(c);
  // The callback runs before done() turns true, so a waiter that sees done() also sees every
  // effect of the callback.
  if (on_done_) {
    on_done_(result_);
    on_done_ = nullptr;  // drop captured resources early
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
  return true;
}

bool transfer_state::wait_until(clock::time_point until) {
  std::unique_lock<std::mutex> lock(mutex_);
  return cv_.wait_until(lock, until, [this] { return done_.load(std::memory_order_acquire); });
}

std::shared_ptr<transfer_state> make_transfer_state(completion_fn on_done) {
  static std::atomic<std::uint64_t> next_id{1};
  return std::make_shared<transfer_state>(next_id.fetch_add(1, std::memory_order_relaxed),
                                          std::move(on_done));
}

}  // namespace weft::transport
