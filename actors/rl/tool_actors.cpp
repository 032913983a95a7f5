#include "actors/rl/tool_actors.hpp"

#include <spdlog/spdlog.h>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <mutex>
#include <unordered_map>

#include "actors/rl/rl_atoms.hpp"
#include "actors/rl/rl_plumbing.hpp"
#include "actors/rl/tool_http.hpp"

namespace weft::rl {

namespace {

using clock_type = std::chrono::steady_clock;
using gpu::rl::tool_result;

/// What the router shares with the loop's thread.
struct shared_state {
  event_queue<tool_result> results;
  std::mutex mu;
  std::map<std::string, caf::actor> tools;  ///< the live actor of each tool
  std::atomic<int64_t> restarts{0};
  std::atomic<int64_t> resent{0};
  std::map<std::string, int64_t> calls_by_tool;     ///< under mu
  std::map<std::string, int64_t> restarts_by_tool;  ///< under mu
};

/// How long call `id` takes (see tool_actors_config).
uint32_t call_latency_ms(const tool_actors_config& cfg, uint64_t id) {
  if (!cfg.exponential_latency || cfg.latency_ms == 0) return cfg.latency_ms;
  const double u = static_cast<double>(gpu::rl::task_mix(id, 0x7A11, 0) >> 11) * 0x1.0p-53;
  const double cap = std::min(10.0 * cfg.latency_ms, 0.5 * cfg.timeout_ms);
  return static_cast<uint32_t>(std::min(cap, -std::log1p(-u) * cfg.latency_ms));
}

/// A tool: answers each call with the tool's result after its latency, to whoever sent it.
caf::behavior tool_actor_fn(caf::event_based_actor* self, std::string tool,
                            tool_actors_config cfg) {
  return {
      [self, tool, cfg](tl_call_atom, uint64_t id, const std::string& args) {
        auto to = caf::actor_cast<caf::actor>(self->current_sender());
        if (!to) return;
        const uint32_t latency_ms = call_latency_ms(cfg, id);
        std::string text = gpu::rl::run_tool(gpu::rl::tool_call{tool, args});
        if (latency_ms == 0) {
          self->send(to, tl_result_atom::value, id, std::move(text));
        } else {
          self->delayed_send(to, std::chrono::milliseconds(latency_ms), tl_result_atom::value, id,
                             std::move(text));
        }
      },
  };
}

/// A tool of your own: its program answers each call (one at a time: this actor is detached and
/// blocks while the program works; the program's own crashes and hangs are handled inside).
caf::behavior process_tool_fn(caf::event_based_actor* self, gpu::rl::tool_command cmd,
                              tool_actors_config cfg) {
  auto proc = std::make_shared<gpu::rl::tool_process>(cmd, cfg.timeout_ms / 1000.0,
                                                      std::max(0, cfg.max_attempts - 1));
  return {
      [self, proc, name = cmd.name](tl_call_atom, uint64_t id, const std::string& args) {
        auto to = caf::actor_cast<caf::actor>(self->current_sender());
        if (!to) return;
        self->send(to, tl_result_atom::value, id, proc->call(gpu::rl::tool_call{name, args}));
      },
  };
}

/// A tool of your own with several processes (`cfg.processes` detached workers, linked: a worker
/// that dies takes the tool down, and the router restarts it and sends its calls again): each
/// call goes to the worker with the fewest calls in hand, and its answer back to its sender.
caf::behavior process_pool_fn(caf::event_based_actor* self, gpu::rl::tool_command cmd,
                              tool_actors_config cfg) {
  struct pool {
    std::vector<caf::actor> workers;
    std::vector<int> busy;
    std::unordered_map<uint64_t, std::pair<caf::actor, size_t>> calls;  ///< id → sender, worker
  };
  auto p = std::make_shared<pool>();
  for (int i = 0; i < std::max(1, cfg.processes); ++i) {
    p->workers.push_back(self->spawn<caf::detached + caf::linked>(process_tool_fn, cmd, cfg));
    p->busy.push_back(0);
  }
  return {
      [self, p](tl_call_atom, uint64_t id, const std::string& args) {
        auto to = caf::actor_cast<caf::actor>(self->current_sender());
        if (!to) return;
        const size_t w =
            static_cast<size_t>(std::min_element(p->busy.begin(), p->busy.end()) - p->busy.begin());
        ++p->busy[w];
        p->calls[id] = {to, w};
        self->send(p->workers[w], tl_call_atom::value, id, args);
      },
      [self, p](tl_result_atom, uint64_t id, std::string& text) {
        auto it = p->calls.find(id);
        if (it == p->calls.end()) return;
        --p->busy[it->second.second];
        self->send(it->second.first, tl_result_atom::value, id, std::move(text));
        p->calls.erase(it);
      },
  };
}

/// One request at a time to a tool's HTTP endpoint; answers go straight to the router.
caf::behavior http_worker_fn(caf::event_based_actor* self, gpu::rl::tool_command endpoint,
                             tool_actors_config cfg) {
  auto client =
      std::make_shared<tool_http_client>(endpoint, cfg.timeout_ms / 1000.0, cfg.max_attempts);
  return {
      [self, client, name = endpoint.name](tl_call_atom, uint64_t id, const std::string& args,
                                           const caf::actor& reply_to) {
        self->send(reply_to, tl_result_atom::value, id,
                   client->call(id, gpu::rl::tool_call{name, args}));
      },
  };
}

/// A tool behind an HTTP endpoint: `cfg.concurrency` detached workers (linked: a worker that
/// dies takes the tool down, and the router restarts it and sends its calls again) take the
/// calls in turn.
caf::behavior http_tool_fn(caf::event_based_actor* self, gpu::rl::tool_command endpoint,
                           tool_actors_config cfg) {
  std::vector<caf::actor> workers;
  for (int i = 0; i < std::max(1, cfg.concurrency); ++i) {
    workers.push_back(self->spawn<caf::detached + caf::linked>(http_worker_fn, endpoint, cfg));
  }
  auto next = std::make_shared<size_t>(0);
  return {
      [self, workers, next](tl_call_atom, uint64_t id, const std::string& args) {
        auto to = caf::actor_cast<caf::actor>(self->current_sender());
        if (!to) return;
        self->send(workers[(*next)++ % workers.size()], tl_call_atom::value, id, args, to);
      },
  };
}

/// The command of `tool` when it is one of your own, else null.
const gpu::rl::tool_command* command_of(const tool_actors_config& cfg, const std::string& tool) {
  for (const auto& c : cfg.commands) {
    if (c.name == tool) return &c;
  }
  return nullptr;
}

struct router_state {
  struct pending_call {
    std::string tool, args;
    int attempts = 0;
    clock_type::time_point deadline;
  };
  std::unordered_map<uint64_t, pending_call> calls;
  std::map<caf::actor_addr, std::string> tool_of;
};

caf::behavior router_fn(caf::event_based_actor* self, std::shared_ptr<shared_state> sh,
                        tool_actors_config cfg) {
  auto st = std::make_shared<router_state>();
  const auto timeout = std::chrono::milliseconds(cfg.timeout_ms);
  auto spawn_tool = [self, sh, st, cfg](const std::string& name) {
    const gpu::rl::tool_command* own = command_of(cfg, name);
    auto a = own == nullptr ? self->spawn<caf::monitored>(tool_actor_fn, name, cfg)
             : own->http    ? self->spawn<caf::monitored>(http_tool_fn, *own, cfg)
             : cfg.processes > 1
                 ? self->spawn<caf::monitored>(process_pool_fn, *own, cfg)
                 : self->spawn<caf::detached + caf::monitored>(process_tool_fn, *own, cfg);
    st->tool_of[a.address()] = name;
    std::lock_guard<std::mutex> lock(sh->mu);
    sh->tools[name] = a;
    return a;
  };
  auto send_call = [self, sh, st, timeout, cfg](uint64_t id, router_state::pending_call& c) {
    caf::actor to;
    {
      std::lock_guard<std::mutex> lock(sh->mu);
      to = sh->tools[c.tool];
    }
    ++c.attempts;
    // A tool of your own bounds its calls itself (restarts and deadlines of its program, or its
    // requests' timeouts and retries).
    c.deadline = command_of(cfg, c.tool) != nullptr ? clock_type::time_point::max()
                                                    : clock_type::now() + timeout;
    self->send(to, tl_call_atom::value, id, c.args);
  };
  for (const auto& t : cfg.tools) spawn_tool(t);
  self->set_down_handler([self, sh, st, spawn_tool, send_call](const caf::down_msg& dm) {
    auto it = st->tool_of.find(dm.source);
    if (it == st->tool_of.end()) return;
    const std::string name = it->second;
    st->tool_of.erase(it);
    ++sh->restarts;
    {
      std::lock_guard<std::mutex> lock(sh->mu);
      ++sh->restarts_by_tool[name];
    }
    spdlog::warn("tool actor '{}' died ({}); restarting it and sending its calls again", name,
                 caf::to_string(dm.reason));
    spawn_tool(name);
    for (auto& [id, c] : st->calls) {
      if (c.tool != name) continue;
      ++sh->resent;
      send_call(id, c);
    }
  });
  self->send(self, tl_tick_atom::value);
  return {
      [self, sh, st, send_call](tl_call_atom, uint64_t id, const std::string& tool,
                                const std::string& args) {
        auto& c = st->calls[id];
        c = router_state::pending_call{tool, args, 0, {}};
        send_call(id, c);
      },
      [sh, st](tl_result_atom, uint64_t id, std::string& text) {
        if (st->calls.erase(id) == 0) return;  // answered already (a call sent twice)
        sh->results.push(tool_result{id, std::move(text)});
      },
      [self, sh, st, send_call, cfg](tl_tick_atom) {
        const auto now = clock_type::now();
        for (auto it = st->calls.begin(); it != st->calls.end();) {
          auto& [id, c] = *it;
          if (now < c.deadline) {
            ++it;
            continue;
          }
          if (c.attempts >= cfg.max_attempts) {
            spdlog::warn("tool '{}' did not answer call {} in {} tries", c.tool, id, c.attempts);
            sh->results.push(tool_result{id, "error: the " + c.tool + " tool did not answer"});
            it = st->calls.erase(it);
            continue;
          }
          ++sh->resent;
          send_call(id, c);
          ++it;
        }
        self->delayed_send(self, std::chrono::milliseconds(200), tl_tick_atom::value);
      },
  };
}

}  // namespace

struct tool_actors::impl {
  std::unique_ptr<caf::actor_system_config> own_cfg;
  std::unique_ptr<caf::actor_system> own_sys;  // after own_cfg: destroyed first
  std::shared_ptr<shared_state> sh = std::make_shared<shared_state>();
  caf::actor router;
  std::atomic<int64_t> pending{0};
  int64_t calls = 0;
  std::vector<std::string> tools;
  tool_actors_config cfg;
};

tool_actors::tool_actors(std::unique_ptr<impl> d) : d_(std::move(d)) {}

tool_actors::~tool_actors() {
  if (d_->router) {
    std::vector<caf::actor> tools;
    {
      std::lock_guard<std::mutex> lock(d_->sh->mu);
      for (auto& [name, a] : d_->sh->tools) tools.push_back(a);
    }
    caf::anon_send_exit(d_->router, caf::exit_reason::user_shutdown);
    for (auto& a : tools) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  }
}

result<std::unique_ptr<tool_actors>> tool_actors::create(caf::actor_system& sys,
                                                         tool_actors_config cfg) {
  if (cfg.tools.empty()) return make_error(errc::invalid_argument, "tool actors: no tools");
  for (const auto& t : cfg.tools) {
    if (!gpu::rl::is_tool(t) && command_of(cfg, t) == nullptr) {
      return make_error(errc::invalid_argument, "unknown tool '" + t +
                                                    "' (tools: " + gpu::rl::tool_list +
                                                    ", or your own with a command)");
    }
  }
  if (cfg.max_attempts < 1 || cfg.timeout_ms < 10 || cfg.concurrency < 1 || cfg.concurrency > 256) {
    return make_error(errc::invalid_argument,
                      "tool actors: at least one attempt, a deadline of at least 10 ms and 1 to "
                      "256 calls at once");
  }
  auto d = std::make_unique<impl>();
  d->tools = cfg.tools;
  d->cfg = cfg;
  d->router = sys.spawn(router_fn, d->sh, cfg);
  return std::unique_ptr<tool_actors>(new tool_actors(std::move(d)));
}

result<std::unique_ptr<tool_actors>> tool_actors::create(tool_actors_config cfg) {
  auto own_cfg = std::make_unique<caf::actor_system_config>();
  own_cfg->set("scheduler.max-threads", size_t{1});
  own_cfg->set("logger.console", caf::atom("none"));
  auto own_sys = std::make_unique<caf::actor_system>(*own_cfg);
  auto made = create(*own_sys, std::move(cfg));
  if (!made) return made;
  // The actors live in this system: it goes with the object (after them).
  (*made)->d_->own_cfg = std::move(own_cfg);
  (*made)->d_->own_sys = std::move(own_sys);
  return made;
}

gpu::status tool_actors::call(uint64_t id, gpu::rl::tool_call c) {
  if (std::find(d_->tools.begin(), d_->tools.end(), c.tool) == d_->tools.end()) {
    return gpu::status{gpu::status_code::invalid_argument, "tool '" + c.tool + "' is not enabled"};
  }
  ++d_->pending;
  ++d_->calls;
  {
    std::lock_guard<std::mutex> lock(d_->sh->mu);
    ++d_->sh->calls_by_tool[c.tool];
  }
  caf::anon_send(d_->router, tl_call_atom::value, id, std::move(c.tool), std::move(c.args));
  return {};
}

std::vector<tool_result> tool_actors::ready(bool wait) {
  auto got = d_->sh->results.take();
  while (got.empty() && wait && d_->pending > 0) {
    d_->sh->results.wait_for(std::chrono::milliseconds(100));
    got = d_->sh->results.take();
  }
  d_->pending -= static_cast<int64_t>(got.size());
  return {std::make_move_iterator(got.begin()), std::make_move_iterator(got.end())};
}

int64_t tool_actors::pending() const {
  return d_->pending;
}

int64_t tool_actors::calls() const {
  return d_->calls;
}

caf::actor tool_actors::tool_actor(const std::string& tool) const {
  std::lock_guard<std::mutex> lock(d_->sh->mu);
  auto it = d_->sh->tools.find(tool);
  return it == d_->sh->tools.end() ? caf::actor{} : it->second;
}

int64_t tool_actors::restarts() const {
  return d_->sh->restarts;
}

int64_t tool_actors::resent() const {
  return d_->sh->resent;
}

std::string tool_actors::status_json() const {
  nlohmann::json tools = nlohmann::json::array();
  std::lock_guard<std::mutex> lock(d_->sh->mu);
  for (const auto& t : d_->tools) {
    auto c = d_->sh->calls_by_tool.find(t);
    auto r = d_->sh->restarts_by_tool.find(t);
    tools.push_back({{"tool", t},
                     {"kind", command_of(d_->cfg, t) == nullptr ? "built-in"
                              : command_of(d_->cfg, t)->http    ? "http"
                                                                : "program"},
                     {"calls", c == d_->sh->calls_by_tool.end() ? 0 : c->second},
                     {"restarts", r == d_->sh->restarts_by_tool.end() ? 0 : r->second}});
  }
  return nlohmann::json{{"tools", tools},
                        {"pending", d_->pending.load()},
                        {"resent", d_->sh->resent.load()},
                        {"latency_ms", d_->cfg.latency_ms}}
      .dump();
}

}  // namespace weft::rl
