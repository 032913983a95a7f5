#pragma once
/// Waiting for a long-running command to end: on SIGINT/SIGTERM or when a part of the program
/// asks to stop (for example a node that lost its head).

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <optional>

namespace weft::apps {

/// Process-wide stop latch: catch_signals() once, then wait() on the main thread.
class stop_latch {
 public:
  static stop_latch& instance();
  /// Routes SIGINT, SIGTERM and SIGHUP to request() (through a self-pipe and a thread, so it works
  /// whatever thread the kernel picks); call once, early in a long-running subcommand.
  void catch_signals();
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

/// When WEFT_EXIT_WITH_PARENT=1 (set by child_process for every process it starts), asks the
/// kernel to send SIGTERM when the parent dies, so that a killed launcher or test leaves no
/// orphaned node behind.
void exit_with_parent_if_asked();

}  // namespace weft::apps
