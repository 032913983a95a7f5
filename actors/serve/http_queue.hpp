#pragma once
/// The HTTP server's task queue: httplib's thread pool with a bounded wait queue (docs/serving.md,
/// "Load shedding at the door"). No CAF here.

#include <httplib.h>

#include <atomic>
#include <cstddef>
#include <functional>

namespace weft::serve {

/// httplib's thread pool with a bounded wait queue. A connection that finds `max_waiting` others
/// already waiting is served by a single overflow thread instead, where the pre-routing handler
/// answers every request with 503: the server says "busy" rather than queueing without limit.
class bounded_task_queue : public httplib::TaskQueue {
 public:
  bounded_task_queue(size_t threads, size_t max_waiting)
      : pool_(threads), overflow_(1), max_waiting_(max_waiting) {}

  void enqueue(std::function<void()> fn) override;
  void shutdown() override;

  /// True on the overflow thread while it serves a connection.
  static thread_local bool overloaded;

 private:
  httplib::ThreadPool pool_;
  httplib::ThreadPool overflow_;
  const size_t max_waiting_;
  std::atomic<size_t> waiting_{0};
};

}  // namespace weft::serve
