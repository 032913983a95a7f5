#pragma once
/// Waiting for a long-running command to end: on SIGINT/SIGTERM or when a part of the program
/// asks to stop (for example a node that lost its head).

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>

namespace weft::apps {

/// Process-wide stop latch. Call block_signals() before starting any thread (so only the signal
/// thread receives SIGINT/SIGTERM), then wait() on the main thread.
class stop_latch {
 public:
  static stop_latch& instance();
  /// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread and starts the thread that waits for
  /// them; call first thing in a subcommand, before any other thread exists.
  void block_signals();
  /// Requests a stop with an exit code (the first request wins).
  void request(int exit_code);
  /// Waits for a stop request; returns its exit code.
  int wait();
  bool requested() const { return requested_.load(); }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<bool> requested_{false};
  int code_ = 0;
};

}  // namespace weft::apps
