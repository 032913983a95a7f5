#include "actors/rl/remote_tools.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "actors/private_messages.hpp"
#include "actors/rl/rl_atoms.hpp"
#include "actors/rl/rl_plumbing.hpp"
#include "actors/rl/rl_workers.hpp"
#include "actors/roles.hpp"
#include "schema/caf_bridge.hpp"

namespace weft::rl {

using schema::envelope;
namespace wire = schema::wire;
using clock_type = std::chrono::steady_clock;

namespace {

capnp::Data::Reader bytes_of(const std::string& s) {
  return {reinterpret_cast<const kj::byte*>(s.data()), s.size()};
}

std::string text_of(capnp::Data::Reader d) {
  return {reinterpret_cast<const char*>(d.begin()), d.size()};
}

}  // namespace

std::string tool_worker_config::to_json() const {
  nlohmann::json commands = nlohmann::json::array();
  for (const auto& c : tools.commands) {
    commands.push_back({{"name", c.name}, {"command", c.command}, {"http", c.http}});
  }
  return nlohmann::json{{"worker", worker},
                        {"tools", tools.tools},
                        {"commands", commands},
                        {"latency_ms", tools.latency_ms},
                        {"exponential_latency", tools.exponential_latency},
                        {"timeout_ms", tools.timeout_ms},
                        {"concurrency", tools.concurrency},
                        {"processes", tools.processes},
                        {"max_attempts", tools.max_attempts},
                        {"controller_host", controller_host},
                        {"controller_port", controller_port}}
      .dump();
}

result<tool_worker_config> tool_worker_config::from_json(const std::string& json) {
  auto j = nlohmann::json::parse(json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return make_error(errc::invalid_argument, "tool worker: config is not a JSON object");
  }
  tool_worker_config c;
  try {
    c.worker = j.value("worker", c.worker);
    c.tools.tools = j.at("tools").get<std::vector<std::string>>();
    for (const auto& x : j.value("commands", nlohmann::json::array())) {
      c.tools.commands.push_back({x.at("name").get<std::string>(),
                                  x.at("command").get<std::string>(), x.value("http", false)});
    }
    c.tools.latency_ms = j.value("latency_ms", c.tools.latency_ms);
    c.tools.exponential_latency = j.value("exponential_latency", c.tools.exponential_latency);
    c.tools.timeout_ms = j.value("timeout_ms", c.tools.timeout_ms);
    c.tools.concurrency = j.value("concurrency", c.tools.concurrency);
    c.tools.processes = j.value("processes", c.tools.processes);
    c.tools.max_attempts = j.value("max_attempts", c.tools.max_attempts);
    c.controller_host = j.value("controller_host", c.controller_host);
    c.controller_port = j.value("controller_port", c.controller_port);
  } catch (const nlohmann::json::exception& e) {
    return make_error(errc::invalid_argument, std::string{"tool worker: "} + e.what());
  }
  if (c.worker < 0 || c.worker > 4095 || c.tools.tools.empty() || c.tools.timeout_ms == 0 ||
      c.tools.concurrency < 1 || c.tools.processes < 1 || c.tools.max_attempts < 1 ||
      c.controller_port == 0) {
    return make_error(errc::invalid_argument,
                      "tool worker: worker " + std::to_string(c.worker) + ", controller port " +
                          std::to_string(c.controller_port) +
                          " out of range (or no tools, a zero timeout, concurrency, processes "
                          "or attempts)");
  }
  return c;
}

namespace {

// -- the worker -----------------------------------------------------------------------------------

/// Starts the tools, says hello, then passes calls to them and their results back, on its own
/// thread (the tools' actors run in the node's actor system).
void worker_loop(tool_worker_config cfg, std::shared_ptr<worker_inbox> shared, caf::actor self,
                 caf::actor controller) {
  auto made = tool_actors::create(self->home_system(), cfg.tools);
  std::random_device rd;
  const uint64_t incarnation = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  const std::string error = made ? std::string{} : made.error().message;
  caf::send_as(self, controller, tw_hello_atom::value,
               envelope::build<wire::ToolWorkerHello>([&](wire::ToolWorkerHello::Builder b) {
                 b.setWorker(static_cast<uint32_t>(cfg.worker));
                 b.setPid(static_cast<uint32_t>(::getpid()));
                 b.setIncarnation(incarnation);
                 b.setError(error);
               }));
  if (!made) {
    spdlog::error("tool worker {}: {}", cfg.worker, error);
    return;  // the controller ends the run with the error; nothing to restart
  }
  std::unique_ptr<tool_actors> tools = std::move(*made);
  auto answer = [&](uint64_t id, const std::string& text) {
    caf::send_as(self, controller, tw_result_atom::value,
                 envelope::build<wire::ToolResultMsg>([&](wire::ToolResultMsg::Builder r) {
                   r.setId(id);
                   r.setText(bytes_of(text));
                 }));
  };
  for (;;) {
    // With calls in flight, look for their results every 2 ms.
    auto in = shared->take(std::chrono::milliseconds(tools->pending() > 0 ? 2 : 200));
    if (!in) return;
    for (auto& env : *in) {
      auto c = env.read<wire::ToolCallMsg>();
      if (!c) continue;  // validated by the actor already
      const uint64_t id = c->get().getId();
      auto st = tools->call(id, {c->get().getTool().cStr(), text_of(c->get().getArgs())});
      if (!st) answer(id, "error: " + st.message());
    }
    if (tools->pending() > 0) {
      for (auto& r : tools->ready(false)) answer(r.id, r.text);
    }
  }
}

// -- the controller -------------------------------------------------------------------------------

using event = worker_event;
using events = worker_events;

/// A call in flight.
struct in_flight {
  gpu::rl::tool_call call;
  int worker = -1;  ///< -1: waiting for a worker
  clock_type::time_point deadline;
  clock_type::time_point waiting_since;  ///< while worker == -1
};

}  // namespace

struct remote_tools::impl {
  remote_tools_config cfg;
  std::shared_ptr<events> queue = std::make_shared<events>();
  caf::actor controller;

  worker_table workers;
  std::map<uint64_t, in_flight> flying;
  std::vector<gpu::rl::tool_result> done;
  int64_t calls = 0;
  std::atomic<int64_t> lost{0}, resent{0};
  std::string fatal;  ///< a worker could not start its tools

  mutable std::mutex status_mu;
  std::string status;

  /// The live worker with the fewest calls in flight; ties go round in turn (so that idle workers
  /// share the calls); -1 when none lives.
  int least_busy() {
    const size_t n = workers.size();
    int best = -1;
    for (size_t k = 0; k < n; ++k) {
      const size_t i = (next_tie + k) % n;
      if (workers[i].alive && (best < 0 || workers[i].busy < workers[best].busy)) {
        best = static_cast<int>(i);
      }
    }
    if (best >= 0) next_tie = static_cast<size_t>(best) + 1;
    return best;
  }
  size_t next_tie = 0;

  void lose(int i, const std::string& why) {
    worker_slot& w = workers[static_cast<size_t>(i)];
    if (!w.alive) return;
    w.alive = false;
    w.busy = 0;
    ++lost;
    int moved = 0;
    const auto now = clock_type::now();
    for (auto& [id, f] : flying) {
      if (f.worker == i) {
        f.worker = -1;
        f.waiting_since = now;
        ++moved;
      }
    }
    resent += moved;
    spdlog::warn("tool worker {} lost ({}): {} call(s) to be sent again", i, why, moved);
  }

  void stop_worker(int i, const std::string& why) {
    caf::anon_send_exit(workers[static_cast<size_t>(i)].who, caf::exit_reason::kill);
    lose(i, why);
  }

  void send(uint64_t id, in_flight& f, int w) {
    f.worker = w;
    f.deadline = clock_type::now() + std::chrono::milliseconds(cfg.call_timeout_ms);
    ++workers[static_cast<size_t>(w)].busy;
    caf::send_as(controller, workers[static_cast<size_t>(w)].who, tw_call_atom::value,
                 envelope::build<wire::ToolCallMsg>([&](wire::ToolCallMsg::Builder b) {
                   b.setId(id);
                   b.setTool(f.call.tool);
                   b.setArgs(bytes_of(f.call.args));
                 }));
  }

  /// Hellos, deaths and results; then deadlines, and calls without a worker sent to one.
  void step() {
    for (auto& e : queue->take()) {
      switch (e.what) {
        case event::type::hello: {
          auto h = e.env.read<wire::ToolWorkerHello>();
          if (!h) break;
          const uint32_t idx = h->get().getWorker();
          if (h->get().getError().size() > 0) {
            fatal = "tool worker " + std::to_string(idx) + ": " + h->get().getError().cStr();
            break;
          }
          workers.hello(idx, e.who, h->get().getPid(), "tool worker",
                        [&](int i, const std::string& why) { lose(i, why); });
          break;
        }
        case event::type::down: {
          const int i = workers.slot_of(e.from);
          if (i >= 0) lose(i, "its actor is down");
          break;
        }
        case event::type::result: {
          const int w = workers.slot_of(e.from);
          if (w < 0) break;  // a lost worker's late answer
          auto r = e.env.read<wire::ToolResultMsg>();
          if (!r) {
            stop_worker(w, "a malformed result: " + r.error().message);
            break;
          }
          auto it = flying.find(r->get().getId());
          if (it == flying.end() || it->second.worker != w) break;  // answered already
          done.push_back({it->first, text_of(r->get().getText())});
          flying.erase(it);
          --workers[static_cast<size_t>(w)].busy;
          ++workers[static_cast<size_t>(w)].done;
          break;
        }
      }
    }
    const auto now = clock_type::now();
    for (auto& [id, f] : flying) {
      if (f.worker >= 0 && now > f.deadline) stop_worker(f.worker, "no answer within its deadline");
    }
    for (auto it = flying.begin(); it != flying.end();) {
      in_flight& f = it->second;
      if (f.worker != -1) {
        ++it;
        continue;
      }
      if (const int w = least_busy(); w >= 0) {
        send(it->first, f, w);
        ++it;
      } else if (now - f.waiting_since > std::chrono::milliseconds(cfg.no_worker_timeout_ms)) {
        done.push_back({it->first, "error: no tool worker for " +
                                       std::to_string(cfg.no_worker_timeout_ms / 1000) + " s"});
        it = flying.erase(it);
      } else {
        ++it;
      }
    }
    refresh_status();
  }

  void refresh_status() {
    nlohmann::json j;
    j["workers_lost"] = lost.load();
    j["calls_resent"] = resent.load();
    j["pending"] = flying.size();
    j["workers"] = workers.to_json("calls");
    std::string text = j.dump();
    std::lock_guard<std::mutex> lock(status_mu);
    status = std::move(text);
  }
};

remote_tools::remote_tools(std::unique_ptr<impl> d) : d_(std::move(d)) {}

remote_tools::~remote_tools() {
  shutdown();
}

void remote_tools::shutdown() {
  if (d_) stop_worker_controller(d_->controller, d_->workers);
}

result<std::unique_ptr<remote_tools>> remote_tools::create(caf::actor_system& sys,
                                                           remote_tools_config cfg) {
  auto d = std::make_unique<impl>();
  d->cfg = std::move(cfg);
  auto controller = spawn_worker_controller<tw_hello_atom, tw_result_atom, wire::ToolWorkerHello>(
      sys, d->cfg.workers, "tool workers", d->queue, d->workers, "tool controller");
  if (!controller) return controller.error();
  d->controller = std::move(*controller);
  d->refresh_status();
  return std::unique_ptr<remote_tools>(new remote_tools(std::move(d)));
}

caf::actor remote_tools::controller() const {
  return d_->controller;
}

status remote_tools::wait_ready(uint32_t timeout_ms) {
  return wait_workers_ready(
      d_->workers, "tool workers", timeout_ms,
      [&] {
        d_->step();
        return d_->fatal;
      },
      [&] {
        d_->queue->wait_for(std::chrono::milliseconds(100));
        if (d_->cfg.on_idle) d_->cfg.on_idle();
      });
}

gpu::status remote_tools::call(uint64_t id, gpu::rl::tool_call c) {
  impl& d = *d_;
  if (std::find(d.cfg.tools.begin(), d.cfg.tools.end(), c.tool) == d.cfg.tools.end()) {
    return gpu::status{gpu::status_code::invalid_argument, "tool '" + c.tool + "' is not enabled"};
  }
  if (d.flying.count(id) != 0) {
    return gpu::status{gpu::status_code::invalid_argument,
                       "tool call " + std::to_string(id) + " is already pending"};
  }
  ++d.calls;
  in_flight& f = d.flying[id];
  f.call = std::move(c);
  f.waiting_since = clock_type::now();
  d.step();  // sends it (and takes what arrived meanwhile)
  return {};
}

std::vector<gpu::rl::tool_result> remote_tools::ready(bool wait) {
  impl& d = *d_;
  d.step();
  while (d.done.empty() && wait && !d.flying.empty()) {
    d.queue->wait_for(std::chrono::milliseconds(100));
    if (d.cfg.on_idle) d.cfg.on_idle();
    d.step();
  }
  return std::exchange(d.done, {});
}

int64_t remote_tools::pending() const {
  return static_cast<int64_t>(d_->flying.size() + d_->done.size());
}

int64_t remote_tools::calls() const {
  return d_->calls;
}

int64_t remote_tools::workers_lost() const {
  return d_->lost.load();
}

int64_t remote_tools::resent() const {
  return d_->resent.load();
}

std::string remote_tools::status_json() const {
  std::lock_guard<std::mutex> lock(d_->status_mu);
  return d_->status;
}

void add_tool_worker_role(actors::role_registry& roles) {
  roles.add("tool_worker",
            [](caf::actor_system& sys, const actors::role_context& ctx) -> result<caf::actor> {
              auto cfg = tool_worker_config::from_json(ctx.config_json);
              if (!cfg) return cfg.error();
              const tool_worker_config c = *cfg;
              return sys.spawn<caf::detached>(
                  worker_actor<tw_call_atom, wire::ToolCallMsg>, "tool worker", ctx.name,
                  c.controller_host, c.controller_port, schema::decode_limits{},
                  [c](std::shared_ptr<worker_inbox> in, caf::actor self, caf::actor ctrl) {
                    worker_loop(c, std::move(in), std::move(self), std::move(ctrl));
                  });
            });
}

}  // namespace weft::rl
