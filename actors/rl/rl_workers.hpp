#pragma once
/// What the remote services of `weft rl` share — reward workers (remote_rewards), KL reference
/// workers (remote_reference) and tool workers (remote_tools): the worker's actor, which connects
/// to the run's controller and hands its messages to a thread of its own, and the controller's
/// actor, which turns hellos, results and deaths into events for the thread that waits on them.
/// Only included by those three (it pulls in CAF's actor headers).

#include <spdlog/spdlog.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "actors/rl/rl_plumbing.hpp"
#include "schema/caf_bridge.hpp"

namespace weft::rl {

/// The controller's messages a worker's actor hands its thread, in arrival order.
struct worker_inbox {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<schema::envelope> inbox;
  bool abort = false;

  /// The next message; nullopt once the actor is gone.
  std::optional<schema::envelope> next() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return abort || !inbox.empty(); });
    if (abort) return std::nullopt;
    schema::envelope env = std::move(inbox.front());
    inbox.pop_front();
    return env;
  }
  /// Every message that arrives within `ms` (none: an empty deque); nullopt once the actor is gone.
  std::optional<std::deque<schema::envelope>> take(std::chrono::milliseconds ms) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, ms, [&] { return abort || !inbox.empty(); });
    if (abort) return std::nullopt;
    std::deque<schema::envelope> out;
    out.swap(inbox);
    return out;
  }
};

/// What a worker's thread runs: its inbox, its own actor and the controller.
using worker_loop_fn =
    std::function<void(std::shared_ptr<worker_inbox>, caf::actor self, caf::actor controller)>;

/// The actor of a worker (`what`: "reward worker", ...; spawn it detached: connecting blocks its
/// thread): connects to the controller published on host:port, runs `loop` on a thread of its own
/// for as long as the actor lives (joined when it exits, whatever the reason), stops when the
/// controller goes, and hands the loop the controller's `WorkAtom` messages whose body reads as
/// a `Work` under `limits` — from its controller only.
template <class WorkAtom, class Work>
caf::behavior worker_actor(caf::event_based_actor* self, std::string what, std::string name,
                           std::string host, uint16_t port, schema::decode_limits limits,
                           worker_loop_fn loop) {
  auto controller = connect_to_controller(self->system(), host, port);
  if (!controller) {
    spdlog::error("{} {}: the controller: {}", what, name, controller.error().message);
    self->quit(caf::make_error(caf::sec::runtime_error, controller.error().message));
    return {};
  }
  caf::actor ctrl = *controller;
  self->monitor(ctrl);
  auto shared = std::make_shared<worker_inbox>();
  auto thread = std::make_shared<std::thread>(std::move(loop), shared,
                                              caf::actor_cast<caf::actor>(self), ctrl);
  self->attach_functor([shared, thread](const caf::error&) {
    {
      std::lock_guard<std::mutex> lock(shared->mu);
      shared->abort = true;
    }
    shared->cv.notify_all();
    if (thread->joinable()) thread->join();
  });
  self->set_down_handler([self, what, name, ctrl](const caf::down_msg& dm) {
    if (dm.source == ctrl.address()) {
      spdlog::warn("{} {}: the controller is gone; stopping", what, name);
      self->quit(caf::exit_reason::user_shutdown);
    }
  });
  return {
      [self, ctrl, shared, what, name, limits](WorkAtom, const schema::envelope& env) {
        const auto& s = self->current_sender();
        if (!s || s->address() != ctrl.address()) return;  // only its controller is obeyed
        if (auto w = env.read<Work>(limits); !w) {
          spdlog::warn("{} {}: a bad message: {}", what, name, w.error().message);
          return;
        }
        {
          std::lock_guard<std::mutex> lock(shared->mu);
          shared->inbox.push_back(env);
        }
        shared->cv.notify_all();
      },
  };
}

/// What a controller's actor hands the thread that waits on its workers.
struct worker_event {
  enum class type { hello, result, down } what;
  caf::actor who;        ///< hello: the worker
  caf::actor_addr from;  ///< result, down
  schema::envelope env;
};

using worker_events = event_queue<worker_event>;

/// The controller's actor (`what`: "reward controller", ...): a `HelloAtom` message whose body
/// reads as a `Hello` monitors its sender and queues a hello; `ResultAtom` messages queue as
/// results (the thread matches them to its workers); a monitored actor going down queues a down.
template <class HelloAtom, class ResultAtom, class Hello>
caf::behavior worker_controller_actor(caf::event_based_actor* self,
                                      std::shared_ptr<worker_events> q, std::string what) {
  self->set_down_handler([q](const caf::down_msg& dm) {
    q->push(worker_event{worker_event::type::down, {}, dm.source, {}});
  });
  return {
      [self, q, what](HelloAtom, const schema::envelope& env) {
        const auto& s = self->current_sender();
        if (!s) return;
        if (auto h = env.read<Hello>(); !h) {
          spdlog::warn("{}: bad hello: {}", what, h.error().message);
          return;
        }
        auto who = caf::actor_cast<caf::actor>(s);
        self->monitor(who);
        q->push(worker_event{worker_event::type::hello, who, {}, env});
      },
      [self, q](ResultAtom, const schema::envelope& env) {
        const auto& s = self->current_sender();
        q->push(worker_event{
            worker_event::type::result, {}, s ? s->address() : caf::actor_addr{}, env});
      },
  };
}

/// A worker as its controller sees it.
struct worker_slot {
  caf::actor who;
  bool alive = false;
  uint32_t pid = 0;
  int64_t done = 0;  ///< pieces of work it answered
  int64_t busy = 0;  ///< pieces of work it holds now (where the controller counts them)
};

/// A controller's workers, by index.
struct worker_table : std::vector<worker_slot> {
  /// The live worker whose actor is `a`; -1: none (a lost worker's late message).
  int slot_of(const caf::actor_addr& a) const {
    for (size_t i = 0; i < size(); ++i) {
      if ((*this)[i].alive && (*this)[i].who.address() == a) return static_cast<int>(i);
    }
    return -1;
  }
  std::vector<int> live() const {
    std::vector<int> out;
    for (size_t i = 0; i < size(); ++i) {
      if ((*this)[i].alive) out.push_back(static_cast<int>(i));
    }
    return out;
  }
  /// Worker `idx`'s hello from `who` (`what`: "reward worker", ...): false when the run has no such
  /// worker (warned). A live incarnation already there is lost first (`lose(idx, why)`).
  template <class Lose>
  bool hello(uint32_t idx, caf::actor who, uint32_t pid, const std::string& what, Lose&& lose) {
    if (idx >= size()) {
      spdlog::warn("{}: hello of worker {} in a run of {}", what, idx, size());
      return false;
    }
    if ((*this)[idx].alive)
      lose(static_cast<int>(idx), std::string{"replaced by a new incarnation"});
    worker_slot& w = (*this)[idx];
    w.who = std::move(who);
    w.alive = true;
    w.pid = pid;
    spdlog::info("{} {} ready (pid {})", what, idx, pid);
    return true;
  }
  /// [{worker, state ready|down, pid, `done_name`: done}] for status JSON.
  nlohmann::json to_json(const char* done_name) const {
    auto list = nlohmann::json::array();
    for (size_t i = 0; i < size(); ++i) {
      list.push_back({{"worker", i},
                      {"state", (*this)[i].alive ? "ready" : "down"},
                      {"pid", (*this)[i].pid},
                      {done_name, (*this)[i].done}});
    }
    return list;
  }
};

/// Spawns the controller actor of a pool of `n` workers (1..4096, or an error naming `noun`, e.g.
/// "reward workers") and sizes its table: the reward, reference and tool controllers' create().
template <class HelloAtom, class ResultAtom, class Hello>
result<caf::actor> spawn_worker_controller(caf::actor_system& sys, int n, const char* noun,
                                           std::shared_ptr<worker_events> q, worker_table& workers,
                                           std::string what) {
  if (n < 1 || n > 4096) {
    return make_error(errc::invalid_argument, std::string{"rl: 1 to 4096 "} + noun);
  }
  workers.resize(static_cast<size_t>(n));
  return sys.spawn(worker_controller_actor<HelloAtom, ResultAtom, Hello>, std::move(q),
                   std::move(what));
}

/// Stops a pool's controller actor and drops its workers' handles (idempotent): shutdown().
inline void stop_worker_controller(caf::actor& controller, worker_table& workers) {
  if (!controller) return;
  caf::anon_send_exit(controller, caf::exit_reason::user_shutdown);
  controller = caf::actor{};
  for (auto& w : workers) w.who = caf::actor{};
}

/// A pool's wait_ready(): `poll()` (takes the controller's events in; returns the run's fatal
/// error, empty when none) until every worker of `workers` is live, `pause()` between polls; an
/// error naming `noun` ("reward workers") after `timeout_ms`.
template <class Poll, class Pause>
status wait_workers_ready(const worker_table& workers, const char* noun, uint32_t timeout_ms,
                          Poll&& poll, Pause&& pause) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    if (std::string fatal = poll(); !fatal.empty()) {
      return make_error(errc::invalid_argument, std::move(fatal));
    }
    const size_t live = workers.live().size();
    if (live == workers.size()) return {};
    if (std::chrono::steady_clock::now() > deadline) {
      return make_error(errc::unavailable,
                        std::to_string(live) + " of " + std::to_string(workers.size()) + " " +
                            noun + " ready after " + std::to_string(timeout_ms / 1000) + " s");
    }
    pause();
  }
}

/// A worker of a call-at-a-time pool lost (remote_reference, remote_rewards): marked down, and
/// the items of the call it held (`Item::worker == i`; -1 waiting, -2 done) waiting again. Returns
/// how many moved, or -1 when the worker was down already (nothing to count).
template <class Item>
int lose_pool_worker(worker_table& workers, int i, std::vector<Item>* items) {
  worker_slot& w = workers[static_cast<size_t>(i)];
  if (!w.alive) return -1;
  w.alive = false;
  int moved = 0;
  if (items != nullptr) {
    for (auto& item : *items) {
      if (item.worker == i) {
        item.worker = -1;
        ++moved;
      }
    }
  }
  return moved;
}

/// The end of each round of such a call's loop, once the round's results are taken: an item past
/// its `deadline` has its worker stopped (`stop(worker)`, which puts the item back to waiting),
/// then every waiting item goes to the next live worker in turn (`send(index, worker)`). With no
/// live worker for longer than `no_worker_ms`, the error to fail the call with ("no `noun` for N
/// s"); empty otherwise. One per call.
class pool_dispatch {
 public:
  template <class Item, class Stop, class Send>
  std::string round(std::vector<Item>& items, const worker_table& workers, uint32_t no_worker_ms,
                    const char* noun, Stop&& stop, Send&& send) {
    const auto now = std::chrono::steady_clock::now();
    for (auto& item : items) {
      if (item.worker >= 0 && now > item.deadline) stop(item.worker);
    }
    const auto live = workers.live();
    if (live.empty()) {
      if (!no_worker_) no_worker_since_ = now;
      no_worker_ = true;
      if (now - no_worker_since_ > std::chrono::milliseconds(no_worker_ms)) {
        return std::string{"no "} + noun + " for " + std::to_string(no_worker_ms / 1000) + " s";
      }
      return {};
    }
    no_worker_ = false;
    for (size_t i = 0; i < items.size(); ++i) {
      if (items[i].worker == -1) send(i, live[next_++ % live.size()]);
    }
    return {};
  }

 private:
  bool no_worker_ = false;  ///< no live worker in the last round
  std::chrono::steady_clock::time_point no_worker_since_{};
  size_t next_ = 0;  ///< the round-robin cursor over the live workers
};

}  // namespace weft::rl
