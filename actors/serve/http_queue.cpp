#include "actors/serve/http_queue.hpp"

namespace weft::serve {

thread_local bool bounded_task_queue::overloaded = false;

void bounded_task_queue::enqueue(std::function<void()> fn) {
  if (waiting_.fetch_add(1) >= max_waiting_) {
    --waiting_;
    overflow_.enqueue([fn = std::move(fn)] {
      overloaded = true;
      fn();
      overloaded = false;
    });
    return;
  }
  pool_.enqueue([this, fn = std::move(fn)] {
    --waiting_;
    fn();
  });
}

void bounded_task_queue::shutdown() {
  pool_.shutdown();
  overflow_.shutdown();
}

}  // namespace weft::serve
