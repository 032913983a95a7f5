#pragma once
/// What the controllers and workers of `weft rl`'s cluster (rollout agents, reward workers) share:
/// the queue through which a controller actor hands events to the thread that consumes them, and
/// how a worker reaches its controller.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "actors/runtime.hpp"
#include "schema/status.hpp"

namespace weft::rl {

/// Events in arrival order, pushed by an actor, taken by one consumer thread.
template <class Event>
struct event_queue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Event> events;

  void push(Event e) {
    {
      std::lock_guard<std::mutex> lock(mu);
      events.push_back(std::move(e));
    }
    cv.notify_all();
  }
  /// Everything queued so far.
  std::deque<Event> take() {
    std::deque<Event> out;
    std::lock_guard<std::mutex> lock(mu);
    out.swap(events);
    return out;
  }
  /// Waits up to `ms` for an event (returns at once when one is queued).
  void wait_for(std::chrono::milliseconds ms) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, ms, [&] { return !events.empty(); });
  }
};

/// A worker's connection to its run's controller (a published actor on `host:port`), tried 50
/// times 100 ms apart: the controller may still be starting. Blocks the calling (detached) actor.
inline result<caf::actor> connect_to_controller(caf::actor_system& sys, const std::string& host,
                                                uint16_t port) {
  result<caf::actor> controller = make_error(errc::unavailable, "not tried");
  for (int i = 0; i < 50; ++i) {
    controller = actors::connect_actor(sys, host, port);
    if (controller) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return controller;
}

}  // namespace weft::rl
