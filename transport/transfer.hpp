#pragma once
/// The handle of one asynchronous transfer and its completion record.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "transport/status.hpp"

namespace weft::transport {

using tag_t = std::uint64_t;
using clock = std::chrono::steady_clock;

/// What a finished transfer reports.
struct completion {
  status result;               ///< ok, timeout, canceled, io_error, peer_unreachable, ...
  std::size_t size_bytes = 0;  ///< bytes moved (for a receive: bytes received)
  tag_t tag = 0;               ///< for a tagged receive: the sender's tag
};

/// Called exactly once per started transfer, from the thread that drives progress (the engine's
/// progress thread, or the caller of engine::progress()/wait()). Must not block for long.
using completion_fn = std::function<void(const completion&)>;

/// Shared state of one transfer. Backends create it with make_transfer_state() and finish it
/// exactly once with finish(); users only see it through `transfer`.
class transfer_state {
 public:
  transfer_state(std::uint64_t id, completion_fn on_done) : id_(id), on_done_(std::move(on_done)) {}

  std::uint64_t id() const { return id_; }
  bool done() const { return done_.load(std::memory_order_acquire); }

  /// Invokes the callback, then publishes the completion. Returns false (and does nothing) when
  /// the transfer was already finished: the first finisher wins (e.g. timeout vs late completion).
  bool finish(completion c);

  /// The completion; only valid once done().
  const completion& result() const { return result_; }

  /// Blocks until done() or until `until`; returns done().
  bool wait_until(clock::time_point until);

 private:
  const std::uint64_t id_;
  completion_fn on_done_;
  std::atomic<bool> claimed_{false};
  std::atomic<bool> done_{false};
  completion result_;
  std::mutex mutex_;
  std::condition_variable cv_;
};

/// A copyable handle to a started transfer; cheap to pass around.
class transfer {
 public:
  transfer() = default;
  explicit transfer(std::shared_ptr<transfer_state> state) : state_(std::move(state)) {}

  bool valid() const { return state_ != nullptr; }
  std::uint64_t id() const { return state_ ? state_->id() : 0; }
  /// True once the completion callback has run.
  bool done() const { return state_ && state_->done(); }
  /// The completion record; only valid once done().
  const completion& result() const { return state_->result(); }
  const std::shared_ptr<transfer_state>& state() const { return state_; }

 private:
  std::shared_ptr<transfer_state> state_;
};

/// Creates a transfer state with a process-unique id.
std::shared_ptr<transfer_state> make_transfer_state(completion_fn on_done);

}  // namespace weft::transport
